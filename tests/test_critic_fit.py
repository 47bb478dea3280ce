"""experiments.critic_fit on a run's logged tokens: a run dir made here (its config composed as
training.run composes it, rollouts.jsonl as the run writes it with trainer.log_tokens=true),
whose reward is decided by one sampled token the critic can see."""

from __future__ import annotations

import json
import random

import pytest
from omegaconf import OmegaConf

from agent.trajectory import Trajectory
from training.checkpoint import MetricsLog


def decided(d: int) -> Trajectory:
    t = Trajectory("x", prompt_ids=[5, 6, 7, 8, 9, 10], reward=1.0 if d == 100 else 0.0)
    t.append_sampled([50, 51, d, 60, 61, 62], [-5.0] * 6, 0)
    t.info.update(rollout_key="k", source="decide")
    return t


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from training.plan import compose

    run = tmp_path_factory.mktemp("run")
    cfg = compose(["model.sft.enabled=false"])  # the tiny model itself; the default SAO critic
    (run / ".hydra").mkdir()
    OmegaConf.save(cfg, run / ".hydra" / "config.yaml")
    rng = random.Random(0)
    log = MetricsLog(run, log_tokens=True)
    for step in range(1, 9):
        log.log_rollouts(step, [decided(rng.choice([100, 200])) for _ in range(16)])
    log.close()
    return run


def test_rollouts_keep_their_tokens_with_log_tokens(run_dir):
    row = json.loads((run_dir / "rollouts.jsonl").read_text().splitlines()[0])
    assert row["completion_ids"][2] in (100, 200) and row["loss_mask"] == [1] * 6 and row["logprobs"] == [-5.0] * 6
    assert row["step"] == 1 and row["source"] == "decide"


def test_critic_fit_scores_cases_on_held_out_rollouts(run_dir, tmp_path):
    from experiments.critic_fit import main

    out = tmp_path / "fit.json"
    assert main([str(run_dir), "--split-step", "6", "--epochs", "2", "--cases", "as_run", "mlp_head",
                 "--output", str(out), "--plot", str(tmp_path / "fit.png")]) == 0
    r = json.loads(out.read_text())
    assert (r["train_rollouts"], r["held_out_rollouts"], r["split_step"]) == (96, 32, 6)
    assert abs(r["source_mean"]["ev"]) < 0.1  # one source, half won: knowing the source explains nothing
    as_run, mlp = r["cases"]
    assert [len(c["epochs"]) for c in r["cases"]] == [2, 2] and mlp["name"] == "mlp_head"
    # the token that decides the reward is in view from the 4th sampled token on: the critic
    # learns it (at the last token nearly all of it), far above the source-mean floor
    assert as_run["epochs"][-1]["held_out"]["ev_last"] > 0.5, as_run["epochs"][-1]
    assert as_run["epochs"][-1]["held_out"]["ev_last"] > as_run["start"]["ev_last"] + 0.4
    assert (tmp_path / "fit.png").stat().st_size > 0


def test_critic_fit_says_what_is_missing(tmp_path):
    from experiments.critic_fit import main

    (tmp_path / "rollouts.jsonl").write_text(json.dumps({"step": 1, "reward": 0.0}) + "\n")
    with pytest.raises(SystemExit, match="trainer.log_tokens=true"):
        main([str(tmp_path)])
