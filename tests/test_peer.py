"""experiments/peer.py in --quick mode: TRL's GRPOTrainer and the project's SAO and (synchronous)
GRPO each train a few steps on the prefer env and every run reports rewards (no timings are
asserted: they are measured in BENCHMARKS.md); the summary over seeds, and bad arguments."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("trl", reason="TRL is not installed (the `peer` extra: pip install -e '.[peer]')")


@pytest.mark.docker
def test_peer_benchmark_quick_runs_all_three(tmp_path, docker_client):
    out, png = tmp_path / "peer.json", tmp_path / "peer.png"
    cases = ["trl_grpo", "sao", "grpo_sync"]
    r = subprocess.run([sys.executable, "-m", "experiments.peer", "--quick", "--cpu", "--cases", *cases, "--seeds", "3",
                        "--output", str(out), "--plot", str(png)], cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(out.read_text())
    assert list(report["runs"]) == cases and report["unmatched"] and report["seeds"] == [3]
    assert report["cases"]["grpo_sync"]["overrides"] == ["trainer.mode=sync"]
    for name, case in report["runs"].items():
        (seed, run), = case["by_seed"].items()
        assert seed == "3" and case["summary"]["seeds"] == 1 and case["summary"]["reward_last_20pct_se"] == 0
        curve = run["curve"]
        assert [row["step"] for row in curve] == [1, 2], name
        assert [row["samples"] for row in curve] == [8, 16], name
        assert all(0.0 <= row["reward"] <= 1.0 and row["elapsed_s"] > 0 for row in curve), name
        assert set(run["summary"]) >= {"reward_last_20pct", "samples_per_s", "train_s"}
        # --cpu: the machine's CPU from step 1 to step 2, by process group; the run's own process
        # worked and so did Docker (a container per sample on both sides)
        per = run["cpu"]["per_sample"]
        assert per["trainer"] > 0 and per["docker"] + per["containers"] + per["unsampled"] > 0, (name, per)
        assert all(v >= 0 for v in per.values()), (name, per)
    trl_settings = report["runs"]["trl_grpo"]["by_seed"]["3"]["settings"]
    assert trl_settings["num_generations"] == 8 and trl_settings["beta"] == 0.0
    # the synchronous run trains on-policy: every sample of the learner's own version
    assert report["runs"]["grpo_sync"]["summary"]["staleness_mean"] == 0
    summaries = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(summaries) == set(cases)
    assert "TRL GRPOTrainer" in r.stdout and "project SAO" in r.stdout and "synchronous" in r.stdout
    assert "settings not matched" in r.stdout
    assert "CPU seconds per sample" in r.stdout
    assert png.stat().st_size > 10_000


def test_the_summary_over_seeds_is_the_mean_and_its_standard_error():
    from experiments.peer import over_seeds, summary

    def run(rewards):
        curve = [{"step": i + 1, "samples": 16 * (i + 1), "reward": x, "elapsed_s": 10.0 * (i + 1), "staleness": 1.0}
                 for i, x in enumerate(rewards)]
        r = {"curve": curve, "process_s": 200.0}
        return {**r, "summary": summary(r)}

    # 10 steps: the last 20% of samples are steps 9 and 10
    by_seed = {"0": run([0.0] * 8 + [0.5, 0.5]), "1": run([0.0] * 8 + [0.25, 0.25]), "2": run([0.0] * 8 + [0.0, 0.0])}
    s = over_seeds(by_seed)
    assert s["seeds"] == 3 and s["reward_last_20pct_by_seed"] == [0.5, 0.25, 0.0]
    assert s["reward_last_20pct"] == pytest.approx(0.25) and s["reward_last_20pct_se"] == pytest.approx(0.25 / 3 ** 0.5)
    assert s["staleness_mean"] == 1.0 and s["samples_per_s"] == pytest.approx(1.6)


@pytest.mark.parametrize("argv, said", [
    (["--cases", "grpo", "nope"], "no case nope"),
    (["--cases", "grpo", "grpo"], "each at most once"),
    (["--seeds", "1", "1"], "each at most once"),
    (["seed=4"], "give the seed with --seeds"),
    (["--resume"], "--resume goes on with the runs in --output FILE"),
])
def test_bad_arguments_are_refused(argv, said, capsys):
    from experiments.peer import main

    with pytest.raises(SystemExit):
        main(argv)
    assert said in capsys.readouterr().err


def test_resume_keeps_the_runs_of_the_same_settings_and_refuses_others():
    from experiments.peer import kept_runs

    settings = {"steps": 16, "batch_size": 16, "engine": "auto", "model": "/a/.cache/models/tiny-sft-1", "lr_policy": 2e-4,
                "max_new_tokens": 32, "overrides": []}
    saved = {**settings, "model": "/b/.cache/models/tiny-sft-1",  # another machine's checkout: the same model
             "runs": {"grpo": {"by_seed": {"0": {"x": 1}, "5": {"x": 2}}}, "sao": {"by_seed": {"0": {"x": 3}}}}}
    report = {**settings, "seeds": [0, 1], "runs": {"grpo": {}, "trl_grpo": {}}}
    assert kept_runs(saved, report) == {"grpo": {"0": {"x": 1}}}  # seed 5 and SAO are not this sweep's
    with pytest.raises(ValueError, match="steps=16, this sweep 8"):
        kept_runs(saved, {**report, "steps": 8})
    with pytest.raises(ValueError, match="model='tiny-sft-1', this sweep 'tiny-sft-2'"):
        kept_runs(saved, {**report, "model": "/a/.cache/models/tiny-sft-2"})
