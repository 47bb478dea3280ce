"""`python -m training.run` as a user runs it (tiny sizes via +debug=tiny): outputs,
checkpoints loadable with from_pretrained, and a killed run that resumes losing nothing."""

import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import RUN_ID
from training.checkpoint import Checkpoints

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[1]
REQUIRED = {"step", "reward/mean", "sao/mask_frac_low", "sao/mask_frac_high", "staleness/mean",
            "time/learner_idle_frac", "value/explained_var", "staleness/hist_0", "stream/queue_depth"}


def train(out: Path, *overrides: str, wait: bool = True):
    """A tiny run; on the hf engine unless the overrides choose one (vLLM's start costs ~30 s)."""
    engine = [] if any(o.startswith("engine=") for o in overrides) else ["engine=hf"]
    cmd = [sys.executable, "-m", "training.run", "+debug=tiny", f"output_dir={out}", f"run_id={RUN_ID}",
           "model.algo_overrides.critic_warmup_steps=0", *engine, *overrides]
    if not wait:
        return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)


def steps(out: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def check_timings(rows: list[dict]) -> None:
    """Every phase of training/timings.py in every step; the step's phases add up to its wall
    time but for a small remainder (logging, the loop), the learner's to its step."""
    from training.timings import ROLLOUT_PHASES, STEP_PHASES

    for row in rows:
        missing = [f"time/step/{p}_s" for p in STEP_PHASES if f"time/step/{p}_s" not in row]
        missing += [f"time/rollout/{p}_{s}_s" for p in ROLLOUT_PHASES for s in ("mean", "p95")
                    if f"time/rollout/{p}_{s}_s" not in row]
        # (policy_forward: a pass of its own only where pi_old is needed before the update, e.g. the
        # critic's warm-up steps; the update's own forward gives it otherwise)
        missing += [f"time/learner/{p}_s" for p in ("pack", "critic_forward", "critic_backward",
                                                   "critic_optimizer", "policy_backward", "policy_optimizer")
                    if f"time/learner/{p}_s" not in row]
        assert not missing, missing
        shares = sum(row[f"time/share/{p}"] for p in STEP_PHASES)
        assert shares + row["time/share/unaccounted"] == pytest.approx(1.0, abs=1e-6)
        assert row["time/share/unaccounted"] < 0.1, row
        learner = sum(v for k, v in row.items() if k.startswith("time/learner/") and k != "time/learner/total_s")
        assert 0.9 * row["time/learner/total_s"] <= learner <= row["time/learner/total_s"] <= row["time/step/learner_s"]
        assert row["time/rollout/tokens_per_s"] > 0 and row["time/rollout/rollout_p95_s"] >= row["time/rollout/rollout_mean_s"] * 0.999
    # step 1's checkpoint ran between the two steps' learner calls: in step 2's time
    assert rows[0]["time/step/checkpoint_s"] == 0.0 and rows[1]["time/step/checkpoint_s"] > 0


def test_default_run_writes_metrics_checkpoints_and_curve(tmp_path, docker_client):
    out = tmp_path / "run"
    r = train(out)
    assert r.returncode == 0, r.stderr[-4000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    assert REQUIRED <= set(rows[-1]), REQUIRED - set(rows[-1])
    # stderr is not a terminal here: a readable line per step and one per checkpoint, no HF bars
    assert "step 2/2  reward " in r.stderr and "masked low" in r.stderr
    assert f"step 2: checkpoint {out / 'checkpoints' / 'step_2'}" in r.stderr
    assert "Writing model shards" not in r.stderr
    check_timings(rows)
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert (out / "reward_curve.png").stat().st_size > 1000
    held = json.loads((out / "held_out.json").read_text())
    assert 0 <= held["held_out/reward_initial"] <= 1 and 0 <= held["held_out/reward_final"] <= 1
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    for step in (1, 2):
        ckpt = out / "checkpoints" / f"step_{step}"
        AutoModelForCausalLM.from_pretrained(ckpt / "policy")
        AutoModelForTokenClassification.from_pretrained(ckpt / "critic")
    # the same command again: the run is complete, says so and how to go on, and trains nothing
    again = train(out)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "already holds all 2 steps" in again.stderr and "trainer.max_steps=N" in again.stderr
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2]


def test_default_engine_is_vllm_where_installed_and_receives_the_weights(tmp_path, docker_client):
    from agent.engines.vllm import vllm_available

    out = tmp_path / "run"
    r = train(out, "engine=auto", "trainer.mode=sync")
    assert r.returncode == 0, r.stderr[-4000:]
    kind = "vllm" if vllm_available() else "hf"
    assert f"engine: {kind} (auto)" in r.stderr
    assert "torch.set_num_threads" not in r.stderr  # vLLM CPU's repeated start-up warning is filtered
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    # the step-1 update reached the engine: step 2's rollouts were sampled by version 1, and
    # the learner's logprobs under those weights match the engine's
    assert rows[0]["learner/version"] == 1 and rows[1]["engine/version"] == 2
    assert rows[1]["sao/logprob_mismatch_pre"] < 1e-3


def test_killed_run_resumes_with_no_rollout_lost_or_counted_twice(tmp_path, docker_client):
    out = tmp_path / "run"
    proc = train(out, "trainer.max_steps=8", wait=False)
    deadline = time.time() + 600
    while not (out / "checkpoints" / "step_2" / "run_state.json").exists():
        assert proc.poll() is None, proc.stderr.read()[-4000:]
        assert time.time() < deadline, "no checkpoint within 10 minutes"
        time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)  # no chance to clean up: as a crash
    proc.wait(timeout=60)
    killed_at = max(Checkpoints.step_of(p) for p in (out / "checkpoints").glob("step_*"))
    assert killed_at < 8, "the run finished before it could be killed"
    r = train(out, "trainer.max_steps=8")
    assert r.returncode == 0, r.stderr[-4000:]
    assert f"step_{killed_at} (step {killed_at}," in r.stderr.replace("\n", "")
    assert steps(out) == list(range(1, 9))  # each step logged once
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()  # what the killed run logged past its checkpoint is purged there too
    assert [e.step for e in events.Scalars("reward/mean")] == list(range(1, 9))
    held = json.loads((out / "held_out.json").read_text())  # the pre-training score survived the crash
    assert {"held_out/reward_initial", "held_out/reward_final"} <= set(held)
    state = json.loads((out / "checkpoints" / "step_8" / "run_state.json").read_text())
    stream, sampler = state["stream"], state["sampler"]
    assert stream["counts"]["taken"] == 8 * 4 == len(stream["consumed_ids"])  # none trained on twice
    # every rollout key ever drawn is trained on, queued, dropped (counted) or to be redone
    consumed = {int(k.split("/")[0]) for k in stream["consumed_ids"]}
    queued = {int(t["info"]["rollout_key"].split("/")[0]) for g in stream["queue"] for t in g}
    accounted = consumed | queued | set(sampler["redo"])
    dropped = stream["counts"].get("dropped_stale", 0)
    assert len(set(range(sampler["drawn"])) - accounted) <= dropped


def test_sigterm_stops_after_the_step_under_way_and_keeps_it(tmp_path, docker_client):
    """A scheduler's preemption: the step under way ends, a checkpoint of it is written, the
    exit code says which signal (128 + 15), and the same command goes on from there. With
    trainer.engine_lag the checkpoint keeps the engine's lagged weights, and the resumed engine
    starts from them."""
    out = tmp_path / "run"
    proc = train(out, "trainer.max_steps=50", "trainer.checkpoint_every=1000", "held_out=null", "trainer.engine_lag=1",
                 wait=False)
    deadline = time.time() + 600
    while not (out / "metrics.jsonl").exists() or not steps(out):
        assert proc.poll() is None, proc.stderr.read()[-4000:]
        assert time.time() < deadline, "no step within 10 minutes"
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 128 + signal.SIGTERM, err[-4000:]
    stopped = steps(out)[-1]
    assert stopped < 50 and f"stopped at step {stopped} on SIGTERM" in err.replace("\n", "")
    assert (out / "checkpoints" / f"step_{stopped}" / "run_state.json").exists()
    import torch

    lagged = torch.load(out / "checkpoints" / f"step_{stopped}" / "engine_lag.pt", weights_only=True)
    assert [version for _, version in lagged] == [stopped - 1, stopped]  # the engine's and the one queued for it
    left = docker_client.containers.list(all=True, filters={"label": f"sao.run_id={RUN_ID}"})
    assert not left
    r = train(out, f"trainer.max_steps={stopped + 1}", "trainer.checkpoint_every=1000", "held_out=null",
              "trainer.engine_lag=1")
    assert r.returncode == 0, r.stderr[-4000:]
    assert "no engine_lag weights" not in r.stderr
    assert steps(out) == list(range(1, stopped + 2))
    state = json.loads((out / "checkpoints" / f"step_{stopped + 1}" / "run_state.json").read_text())
    assert state["stream"]["counts"]["taken"] == (stopped + 1) * 4 == len(state["stream"]["consumed_ids"])


def restart_dockerd(docker_client) -> None:
    """Stop the Docker engine this machine runs (as ./setup.sh starts it) and start it again
    with the same command line; skipped where a service manager owns it."""
    import os
    import shutil

    pids = subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True, text=True).stdout.split()
    if len(pids) != 1 or os.geteuid() != 0:
        pytest.skip("needs one dockerd this (root) test may restart")
    if shutil.which("systemctl") and subprocess.run(["systemctl", "is-active", "--quiet", "docker"]).returncode == 0:
        pytest.skip("dockerd is a systemd service here: not restarted by a test")
    pid = int(pids[0])
    argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    os.kill(pid, signal.SIGTERM)
    deadline = time.time() + 120
    while Path(f"/proc/{pid}").exists():
        assert time.time() < deadline, "dockerd did not stop within 2 minutes"
        time.sleep(0.2)
    log = open(ROOT / ".cache" / "dockerd.log", "a") if (ROOT / ".cache").is_dir() else subprocess.DEVNULL
    subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    while True:
        try:
            if docker_client.ping():
                return
        except Exception:
            pass
        assert time.time() < deadline, "dockerd did not come back within 2 minutes"
        time.sleep(0.5)


@pytest.mark.serial  # it stops the one Docker engine every other test uses: ./test.sh runs it alone, last
def test_a_docker_engine_restarted_mid_run_costs_rollouts_not_the_run(tmp_path, docker_client):
    """The engine goes away with rollouts in flight: those fail as infrastructure errors
    (counted, not trained on), new sandboxes wait for it, the run goes on when it is back."""
    out = tmp_path / "run"
    # each rollout sleeps 2 s in its sandbox after its first turn (the long-tail latency option at
    # a fixed value): the engine is restarted while one of them is in that sleep
    proc = train(out, "trainer.max_steps=5", "held_out=null", "agent.latency_alpha=50", "agent.latency_scale_s=2",
                 "agent.latency_max_s=2", wait=False)
    ours = {"label": [f"sao.run_id={RUN_ID}"]}

    def sleeping() -> bool:
        for c in docker_client.containers.list(filters=ours):
            try:
                if any("sleep 2.000" in " ".join(p) for p in c.top().get("Processes") or []):
                    return True
            except Exception:  # removed meanwhile
                pass
        return False

    try:
        deadline = time.time() + 600
        while not ((out / "metrics.jsonl").exists() and steps(out) and sleeping()):
            assert proc.poll() is None, proc.stderr.read()[-4000:]
            assert time.time() < deadline, "no rollout in flight after a step within 10 minutes"
            time.sleep(0.1)
        restart_dockerd(docker_client)  # with a rollout's command running in its sandbox
        _, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-4000:]
    assert steps(out) == [1, 2, 3, 4, 5]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["rollout/errors"] >= 1
    trained = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert not [t for t in trained if t["exit"] in ("sandbox_error", "sandbox_killed")]
    assert not docker_client.containers.list(all=True, filters=ours)


@pytest.mark.parametrize("overrides", [["algo=grpo", "algo.group_size=2"], ["algo=grpo_dis", "algo.group_size=2"],
                                       ["trainer.mode=sync"]])
def test_grpo_and_sync_mode_run_in_the_same_pipeline(tmp_path, docker_client, overrides):
    out = tmp_path / "run"
    r = train(out, *overrides)
    assert r.returncode == 0, r.stderr[-4000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    if "algo=grpo" in overrides:
        assert "ppo/clipfrac" in rows[-1] and "value/loss" not in rows[-1]
        assert not (out / "checkpoints" / "step_2" / "critic").exists()
    elif "algo=grpo_dis" in overrides:  # GRPO's groups, SAO's mask: no clip, no critic
        assert "sao/mask_frac_low" in rows[-1] and "ppo/clipfrac" not in rows[-1] and "value/loss" not in rows[-1]
    else:
        assert rows[-1]["staleness/mean"] == 0.0  # sync: every rollout comes from the current policy


def test_torchrun_runs_data_parallel_ranks_and_resumes(tmp_path, docker_client):
    out = tmp_path / "run"
    with socket.socket() as sock:  # a port of its own: another test may run torchrun beside it (pytest -n)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
              "--master-port", str(port), "-m", "training.run",
              "+debug=tiny", "engine=hf", f"output_dir={out}", f"run_id={RUN_ID}",
              "model.algo_overrides.critic_warmup_steps=0"]
    r = subprocess.run(launch, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "learner: 2 data-parallel ranks" in r.stderr
    assert steps(out) == [1, 2]
    # resumed: rank 0 loads the checkpoint and so must every replica, or their weights part
    r = subprocess.run(launch + ["trainer.max_steps=3"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "resumed from" in r.stderr and steps(out) == [1, 2, 3]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(row["learner/replica_spread"] == 0.0 for row in rows)


def test_value_pretraining_fits_a_critic_that_training_starts_from(tmp_path, docker_client):
    out = tmp_path / "run"
    base = [sys.executable, "-m", "training.value_pretrain", "+debug=tiny", "engine=hf", f"output_dir={out}",
            f"run_id={RUN_ID}", "value_pretrain.rollouts=8"]
    r = subprocess.run(base + ["value_pretrain.epochs=2"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    ckpt = out / "value_checkpoint"
    summary = json.loads((ckpt / "value_pretrain.json").read_text())
    assert summary["rollouts"] == 8 and [e["epoch"] for e in summary["epochs"]] == [1, 2]
    assert summary["epochs"][1]["value/loss"] < summary["epochs"][0]["value/loss"]  # the critic fits its targets
    assert f"learner.value_checkpoint={ckpt}" in r.stderr
    from transformers import AutoModelForTokenClassification

    assert AutoModelForTokenClassification.from_pretrained(ckpt).config.num_labels == 1
    r = train(tmp_path / "rl", "trainer.max_steps=1", "held_out=null", f"learner.value_checkpoint={ckpt}")
    assert r.returncode == 0, r.stderr[-4000:]
    assert steps(tmp_path / "rl") == [1]
    # an algo without a critic has nothing to pretrain: said, exit 2
    r = subprocess.run(base + ["algo=grpo", "algo.group_size=2"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "value pretraining fits a critic" in r.stderr, r.stderr[-2000:]


def test_a_bad_value_stops_the_run_at_once_with_its_field(tmp_path):
    res = train(tmp_path / "run", "trainer.mode=asnyc")
    assert res.returncode == 2, res.stderr[-2000:]
    assert "trainer.mode = 'asnyc'" in res.stderr and "Traceback" not in res.stderr
    # before the model, the engine or the sandboxes: nothing was built or run
    assert "engine:" not in res.stderr and not (tmp_path / "run" / "checkpoints").exists()


def test_no_docker_engine_is_said_at_once_with_the_fix(tmp_path):
    import os

    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path / 'no-such.sock'}"}
    cmd = [sys.executable, "-m", "training.run", "+debug=tiny", "engine=hf", f"output_dir={tmp_path / 'run'}",
           f"run_id={RUN_ID}"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"no Docker engine answers at unix://{tmp_path / 'no-such.sock'}" in r.stderr.replace("\n", "")
    assert "dockerd" in r.stderr and "Traceback" not in r.stderr and "engine:" not in r.stderr


def test_rollouts_that_keep_failing_stop_the_run_with_the_reason(tmp_path, docker_client):
    # a source's env_options override its conf/env file: here an image no engine has, no registry
    r = train(tmp_path / "run", "held_out=null", '+sources.0.env_options={image: "sao-missing:none"}',
              "trainer.max_failed_in_a_row=3")
    assert r.returncode == 1, r.stderr[-4000:]
    # at least 3: rollouts in flight beside the third can fail before the stop, and the count says so
    failed = re.search(r"the run stopped at step 0: (\d+) rollouts in a row failed", r.stderr)
    assert failed and int(failed[1]) >= 3 and "sao-missing:none" in r.stderr, r.stderr[-4000:]
