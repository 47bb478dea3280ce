"""The benchmarks run and print their side-by-side tables (tiny sizes; numbers are not
asserted: speed and memory are measured in BENCHMARKS.md, not in tests)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_logprobs_memory_benchmark_prints_both_ways():
    r = run("benchmarks.logprobs_memory", "--tokens", "256", "--vocab", "2048", "--hidden", "32", "--chunk", "64")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "naive MB" in r.stdout and "chunked MB" in r.stdout and "memory ratio" in r.stdout
    assert "│    256 │" in r.stdout


@pytest.mark.docker
def test_async_vs_sync_benchmark_runs_both_modes(docker_client):
    r = run("benchmarks.async_vs_sync", "--steps", "2", "--batch-size", "2", "--engine", "hf", "+debug=tiny")
    assert r.returncode == 0, r.stderr[-3000:]
    cells = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(cells) == {"async", "sync"}
    for mode in cells.values():
        assert mode["rollouts_per_s"] > 0 and 0 <= mode["learner_idle_frac"] <= 1
    assert "async / sync" in r.stdout


def test_engine_batching_benchmark_prints_both_ways():
    r = run("benchmarks.engine_batching", "--engine", "hf", "--threads", "2", "--requests", "1", "--tokens", "4")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "one at a time tok/s" in r.stdout and "batched / one at a time" in r.stdout


def test_learner_step_benchmark_runs_both_learners():
    r = run("benchmarks.learner_step", "--rows", "2", "--tokens", "96", "--repeats", "1")
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(result["seconds"]) == {"torch", "megatron"} and result["ratio_megatron_torch"] > 0


def test_engine_continuous_benchmark_runs_both_engines(tmp_path):
    from agent.engines.vllm import vllm_available

    if not vllm_available():
        pytest.skip("vLLM is not installed (pip install -e '.[vllm]')")
    out = tmp_path / "engine_continuous.json"
    r = run("benchmarks.engine_continuous", "--quick", "--output", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result["engines"]) == {"async", "blocking"}
    for engine in result["engines"].values():
        assert engine["tokens"] > 0 and engine["tokens_per_s"] > 0
        assert 0 < engine["p50_turn_s"] <= engine["p95_turn_s"]
    assert "async / blocking" in r.stdout


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="on a GPU machine the check runs for real")
def test_gpu_engine_check_says_it_needs_a_gpu():
    r = run("scripts.gpu_engine_check")
    assert r.returncode == 2 and "needs a CUDA GPU" in r.stderr


@pytest.mark.docker
def test_scaffolds_benchmark_runs_both_agents_and_times_the_endpoint(tmp_path, docker_client):
    out = tmp_path / "scaffolds.json"
    r = run("benchmarks.scaffolds", "--quick", "--output", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(out.read_text())
    for name in ("default", "mini_swe"):  # each agent rolled out and graded every task
        a = result["agents"][name]
        assert a["rollouts"] == 2 and sum(a["exits"].values()) == 2 and a["rollouts_per_hour"] > 0
    assert result["endpoint"]["requests"] == 5 and result["endpoint"]["direct_ms_mean"] > 0
    assert result["endpoint"]["endpoint_ms_mean"] > 0 and "rollouts per hour" in r.stderr


def test_simulation_runs_the_real_orchestrator_and_counts_every_rollout_once(tmp_path):
    out = tmp_path / "simulate.json"
    r = run("benchmarks.simulate", "--quick", "--output", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    assert {x["algo"] for x in results} == {"sao", "grpo"}
    for x in results:  # 2 steps of 8: each trained rollout once, none trained twice, none trained unfinished
        assert x["steps"] == 2 and x["trained"] == x["unique_trained"] == 16
        assert x["unique_finished"] == x["finished"] >= x["trained"] + x["dropped_stale"]
        assert sum(x["staleness_hist"].values()) == 16 and x["rollouts_per_hour"] > 0
    assert results[1]["staleness_mean"] == 0.0  # sync GRPO trains on the policy that sampled


def test_grading_cost_benchmark_grades_all_three_ways(tmp_path, docker_client):
    out = tmp_path / "grading_cost.json"
    r = run("benchmarks.grading_cost", "--quick", "--output", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["rollouts"] == 2 and result["verdicts_agree"] == 2  # all three ways judge alike
    assert result["in_place_mean_s"] > 0 and result["fresh_mean_s"] > 0 and result["prepared_mean_s"] > 0
    assert result["canary_gold_resolved"] == 2 and result["canary_mean_s"] > 0 and result["no_canary_mean_s"] > 0


def test_crash_drill_loses_no_rollout_and_leaves_no_container(docker_client):
    """Workers SIGKILLed mid-rollout: each rollout is done once, none is lost, and the sweep a
    new worker runs leaves no container (the 1,000-rollout drill is in RELIABILITY.md)."""
    r = run("scripts.crash_drill", "--quick")
    assert r.returncode == 0, r.stderr[-6000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["done"] == result["rollouts"] == result["resolved"] == 8 and result["done_twice"] == 0
    assert result["kills"] >= 1 and result["containers_left"] == 0


def test_value_pretraining_benchmark_runs_both_ways(docker_client):
    r = run("experiments.value_pretrain", "--quick")
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(result["cold"]) == len(result["warm"]) == 2 and len(result["pretrain_epochs"]) == 1
    assert "fresh value head" in r.stderr and "value pretrained" in r.stderr


# the seek env's SFT (the benchmarks' default) shrunk to seconds: these check the benchmarks' plumbing, not learning
QUICK = ("engine=hf", "model.sft.steps=4", "model.sft.examples=64", "trainer.num_workers=4",
               "model.algo_overrides.critic_warmup_steps=0")  # SAO's policy versions start at step 1


def test_learning_benchmark_runs_each_algo_at_each_staleness(tmp_path, docker_client):
    out, png = tmp_path / "learning.json", tmp_path / "learning.png"
    r = run("experiments.learning", "--quick", "--jobs", "2", "--output", str(out), "--plot", str(png), *QUICK)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(out.read_text())
    assert {(c["name"], c["lag"]) for c in result["cases"]} == {("sao", 2), ("grpo", 2)}
    for case in result["cases"]:
        (rows,) = case["runs"]
        assert [row["step"] for row in rows] == [1, 2, 3]
        assert 0 <= case["summary"]["final"] <= 1
        # the engine samples with the policy of 2 versions ago: step 3 (version 2) trains on version 0's
        assert rows[-1]["staleness/mean"] == 2
    sao = next(c for c in result["cases"] if c["name"] == "sao")
    assert any("policy/grad_norm" in row for row in sao["runs"][0]) and "value/grad_norm" in sao["runs"][0][0]
    assert png.stat().st_size > 0 and "reward, last quarter" in r.stdout


def test_learning_resume_keeps_earlier_runs_and_refuses_other_settings(tmp_path, capsys):
    from experiments import learning

    rows = [{"step": 1, "reward/mean": 0.5, "time/elapsed_s": 1.0}, {"step": 2, "reward/mean": 1.0, "time/elapsed_s": 2.0}]
    results = {"experiment": "seek", "steps": 2, "batch_size": 8, "overrides": ["engine=hf"]}
    earlier = {**results, "cases": [
        {"group": "algo", "name": "sao", "lag": 0, "overrides": learning.ALGOS["sao"], "seeds": [0, 1], "runs": [rows, rows]},
        {"group": "ablation", "name": "no_mask", "lag": 0, "overrides": learning.ABLATIONS["no_mask"], "seeds": [0],
         "runs": [rows]}]}
    plan = [("algo", "sao", learning.ALGOS["sao"], 0), ("algo", "grpo", learning.ALGOS["grpo"], 0)]
    runs = {}
    kept = learning.earlier_runs(earlier, results, plan, runs)
    assert runs == {(0, 0): rows, (0, 1): rows}  # sao's two seeds are not run again
    assert [c["name"] for c in kept] == ["no_mask"]  # a case outside the plan stays in the results
    with pytest.raises(ValueError, match="steps 2"):
        learning.earlier_runs(earlier, {**results, "steps": 30}, plan, {})
    changed = [("algo", "sao", ["algo=sao", "algo.mask=false"], 0)]
    with pytest.raises(ValueError, match="sao at staleness 0 ran with"):
        learning.earlier_runs(earlier, results, changed, {})
    # through the command line: another batch size is refused before anything runs
    out = tmp_path / "learning.json"
    out.write_text(json.dumps(earlier))
    with pytest.raises(SystemExit) as e:
        learning.main(["engine=hf", "--resume", "--output", str(out), "--steps", "2", "--batch-size", "16",
                       "--seeds", "0", "--staleness", "0", "--algos", "sao", "--ablations"])
    assert e.value.code == 2 and "batch_size 8" in capsys.readouterr().err
    # every planned run already there: nothing runs, the table, file and plot keep both cases
    png = tmp_path / "learning.png"
    assert learning.main(["engine=hf", "--resume", "--output", str(out), "--plot", str(png), "--steps", "2",
                          "--batch-size", "8", "--seeds", "0", "--staleness", "0", "--algos", "sao",
                          "--ablations"]) == 0
    printed = capsys.readouterr()
    assert "2 run(s) already in" in printed.err and "0 to run" in printed.err and "no_mask" in printed.out
    again = json.loads(out.read_text())
    assert [(c["name"], c["seeds"]) for c in again["cases"]] == [("no_mask", [0]), ("sao", [0, 1])]
    assert png.stat().st_size > 0


def test_long_run_benchmark_runs_sao_and_grpo_side_by_side_and_goes_on_with_them(tmp_path, docker_client):
    """Two steps, then the same command with --steps 4 goes on from each run's checkpoint in
    --run-dir (steps 1 and 2 are not run again); other settings in that folder are refused.
    A checkpoint every step: with --keep-every 1 the oldest stays beside the newest 3."""
    out, png, runs = tmp_path / "long.json", tmp_path / "long.png", tmp_path / "runs"
    import torch

    first = run("experiments.long_run", "--quick", "--steps", "2", "--staleness", "2", "--run-dir", str(runs), "--output", str(out),
                "--checkpoint-every", "1", *QUICK)
    assert first.returncode == 0, first.stderr[-3000:]
    before = json.loads(out.read_text())["runs"]
    r = run("experiments.long_run", "--quick", "--steps", "4", "--staleness", "2", "--run-dir", str(runs), "--output", str(out),
            "--plot", str(png), "--checkpoint-every", "1", "--keep-every", "1", *QUICK)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result["runs"]) == {"sao", "grpo"}
    for name, rows in result["runs"].items():
        assert [row["step"] for row in rows] == [1, 2, 3, 4] and rows[:2] == before[name]
        # the engine's lagged weights came back: version 2 (of 4) was sampling, 3 and 4 queued
        lagged = torch.load(runs / f"{name}-lag2-s0" / "checkpoints" / "step_4" / "engine_lag.pt", weights_only=True)
        assert [version for _, version in lagged] == [2, 3, 4]
        kept = sorted(p.name for p in (runs / f"{name}-lag2-s0" / "checkpoints").glob("step_*"))
        assert kept == ["step_1", "step_2", "step_3", "step_4"]
    assert all(row["length"] > 0 for rows in result["runs"].values() for row in rows)
    assert png.stat().st_size > 0 and "worst 10-step mean after best" in r.stdout
    other = run("experiments.long_run", "--quick", "--staleness", "2", "--seed", "1", "--run-dir", str(runs), *QUICK)
    assert other.returncode == 2 and "seed 0 (now 1)" in other.stderr
    # where the runs stand, without running: steps 1 to 4 of the 10 asked
    # (a line half written by a run beside it is left out, not refused)
    with (runs / "sao-lag2-s0" / "metrics.jsonl").open("a") as f:
        f.write('{"step": 5, "rew')
    so_far = run("experiments.long_run", "--quick", "--steps", "10", "--staleness", "2", "--run-dir", str(runs), "--report",
                 "--window", "3", "--output", str(out), *QUICK)
    assert so_far.returncode == 0, so_far.stderr[-3000:]
    assert "so far: sao at step 4, grpo at step 4" in so_far.stdout and "by stretch of 3 steps" in so_far.stdout
    reported = json.loads(out.read_text())
    assert reported["reached"] == {"sao": 4, "grpo": 4} and reported["runs"] == result["runs"]
    stretches = reported["windows"]["sao"]
    assert [(w["first_step"], w["last_step"]) for w in stretches] == [(1, 3), (4, 4)]
    assert stretches[1]["reward"] == result["runs"]["sao"][3]["reward/mean"]
    assert stretches[0]["masked_max"] == max(r["masked"] for r in result["runs"]["sao"][:3])
    assert not (runs / "sao-lag2-s0" / "checkpoints" / "step_5").exists()
    # the same stretches from that JSON alone (as for a run whose folder is gone)
    again = run("experiments.long_run", "--windows-of", str(out), "--window", "3")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "by stretch of 3 steps" in again.stdout
    assert json.loads(again.stdout.strip().splitlines()[-1]) == {name: rows for name, rows in reported["windows"].items()
                                                                 if name != "width"}
    no_width = run("experiments.long_run", "--windows-of", str(out))
    assert no_width.returncode == 2 and "give --window" in no_width.stderr
    (tmp_path / "bad.json").write_text('{"runs": {}}')
    bad = run("experiments.long_run", "--windows-of", str(tmp_path / "bad.json"), "--window", "3")
    assert bad.returncode == 2 and "field 'runs' holds no steps" in bad.stderr
    nowhere = run("experiments.long_run", "--report", "--run-dir", str(tmp_path / "none"))
    assert nowhere.returncode == 2 and "holds none" in nowhere.stderr
    # carried to another machine: SAO's run packed, then unpacked into an empty run folder and
    # reported there (steps 1 to 4, the newest checkpoint byte for byte)
    packed = run("experiments.long_run", "--quick", "--staleness", "2", "--algos", "sao", "--run-dir", str(runs), "--carry",
                 str(tmp_path / "carry"), "--pack", *QUICK)
    assert packed.returncode == 0 and "sao: step 4 packed into" in packed.stderr, packed.stderr[-3000:]
    assert "the model the runs started from, tiny-qwen2-sft-" in packed.stderr  # (this machine has it: not unpacked)
    moved = tmp_path / "elsewhere"
    there = run("experiments.long_run", "--quick", "--steps", "10", "--staleness", "2", "--algos", "sao", "--run-dir",
                str(moved), "--carry", str(tmp_path / "carry"), "--report", "--output", str(out), *QUICK)
    assert there.returncode == 0, there.stderr[-3000:]
    assert "sao: going on from step 4, unpacked from" in there.stderr
    assert json.loads(out.read_text())["runs"] == {"sao": result["runs"]["sao"]}
    for f in ("engine_lag.pt", "learner.pt", "run_state.json", "policy/model.safetensors"):
        assert (moved / "sao-lag2-s0/checkpoints/step_4" / f).read_bytes() == \
            (runs / "sao-lag2-s0/checkpoints/step_4" / f).read_bytes()


def test_seek_probe_counts_follows_and_the_first_moves_side():
    from experiments.seek_probe import move_sides, summarise

    # 15 numbers from 8: 3 is down; from 4 still down (the move goes up, to 6); from 6 down (to 5: missed)
    assert move_sides(3, 4, ["down", "up", "down"]) == [("down", "down"), ("down", "up"), ("down", "down")]
    assert move_sides(12, 4, ["up", "up"]) == [("up", "up")]  # found at its first move: the second is not played
    games = [{"secret": 12, "moves": ["up"], "reward": 1.0, "exit": "submitted", "turns": 1},
             {"secret": 3, "moves": ["up", "down", "down"], "reward": 0.0, "exit": "submitted", "turns": 3},
             {"secret": 5, "moves": [], "reward": 0.0, "exit": "format_errors", "turns": 3}]
    s = summarise(games, 4)
    assert s["found"] == pytest.approx(1 / 3) and s["exits"] == {"submitted": 2, "format_errors": 1}
    assert s["moves"][0] == {"follow": 1, "opposite": 1, "ended": 1, "up": 2}
    # 3 after up (to 12): down, followed to 10; down again, followed to 9
    assert s["moves"][1] == {"follow": 1, "opposite": 0, "ended": 2, "up": 0} == s["moves"][2]
    assert s["first_up_below"] == 1.0 and s["first_up_above"] == 1.0 and s["turns_without_a_move"] == 1.0


def test_seek_probe_plays_every_number_in_sandboxes(tmp_path, docker_client):
    from agent.tiny_model import DEFAULT_DIR, build_tiny_model

    model, out = build_tiny_model(DEFAULT_DIR), tmp_path / "probe.json"
    r = run("experiments.seek_probe", str(model), "--games", "1", "--levels", "2", "--show", "1", "--output", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    (s,) = json.loads(out.read_text())["models"].values()
    assert s["games"] == 2 and sum(s["exits"].values()) == 2  # numbers 1 and 3, one move from 2
    assert sum(s["moves"][0].values()) == 2 and "first move up" in r.stdout
    shown = r.stdout.split("first move up")[0]  # --show 1: the first game's turns, before the table
    assert ": number 1, " in shown and "  turn 1: " in shown and ": number 3, " not in shown
    bad = run("experiments.seek_probe", str(tmp_path))
    assert bad.returncode == 2 and "neither a model folder" in bad.stderr


def test_weight_drift_measures_the_distance_moved_and_adams_own_step(tmp_path):
    import torch
    from safetensors.torch import save_file

    from experiments.weight_drift import drift, main

    def policy(folder: Path, value: float) -> None:
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        save_file({"w": torch.full((4,), value), "b": torch.zeros(2)}, str(folder / "model.safetensors"))

    run_dir = tmp_path / "run"
    policy(tmp_path / "base", 0.0)
    policy(run_dir / "checkpoints" / "step_2" / "policy", 1.0)  # 2.0 from the base: 1.0 a step
    policy(run_dir / "checkpoints" / "step_6" / "policy", 2.0)  # 2.0 more, over 4 steps
    p = torch.nn.Parameter(torch.zeros(4))
    opt = torch.optim.AdamW([p], lr=0.1, weight_decay=0.0)
    p.grad = torch.tensor([1.0, -2.0, 3.0, -4.0])
    opt.step()  # after one step m_hat = g and v_hat = g^2: its own next step is lr * sign(g), norm 0.1 * 2
    torch.save({"policy_opt": opt.state_dict()}, run_dir / "checkpoints" / "step_6" / "learner.pt")
    (run_dir / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "policy/grad_norm": 0.5 if s <= 2 else 2.0}) + "\n" for s in range(1, 7)))

    out = drift([run_dir / "checkpoints" / "step_6", run_dir / "checkpoints" / "step_2"], base=tmp_path / "base")
    first, second = out["intervals"]
    assert (first["from"], first["to"], second["from"], second["to"]) == (0, 2, 2, 6)
    assert first["moved_per_step"] == pytest.approx(1.0) and first["moved_per_grad_norm"] == pytest.approx(2.0)
    assert second["moved"] == pytest.approx(2.0) and second["moved_per_grad_norm"] == pytest.approx(0.25)
    assert [r["from_start"] for r in out["checkpoints"]] == pytest.approx([0.0, 2.0, 4.0])
    assert out["checkpoints"][2]["adam_step_norm"] == pytest.approx(0.2, rel=1e-4)
    assert out["checkpoints"][2]["m_hat_norm"] == pytest.approx(30 ** 0.5)
    assert "adam_step_norm" not in out["checkpoints"][1]  # step 2 kept no learner.pt

    assert main([str(run_dir / "checkpoints" / "step_2"), str(run_dir / "checkpoints" / "step_6"),
                 "--output", str(tmp_path / "drift.json")]) == 0  # metrics found beside checkpoints/
    assert json.loads((tmp_path / "drift.json").read_text())["intervals"][0]["grad_norm_mean"] == 2.0
    assert main([str(run_dir / "checkpoints" / "step_2"), str(tmp_path / "base")]) == 2  # no step in its name
    policy(tmp_path / "step_9", 0.0)
    save_file({"w": torch.zeros(5), "b": torch.zeros(2)}, str(tmp_path / "step_9" / "model.safetensors"))
    with pytest.raises(ValueError, match=r"w is \(4,\) against \(5,\)"):
        drift([run_dir / "checkpoints" / "step_2", tmp_path / "step_9"])


def test_cpu_account_puts_a_childs_cpu_in_the_engine_group_and_cuts_a_window():
    """benchmarks/cpu.py: a child of the watched process that burns 0.5 s of CPU shows in the
    `engine` group (a run's descendants) by about that much; the window cut by progress."""
    import os
    import time

    from benchmarks.cpu import GROUPS, CpuAccount, window

    burn = "import time\nwhile time.process_time() < 0.5: pass"
    marks = {"n": 0}
    account = CpuAccount(os.getpid(), lambda: marks["n"], interval_s=0.05).start()
    marks["n"] = 1
    child = subprocess.Popen([sys.executable, "-c", burn])
    time.sleep(0.2)  # a sample sees the child alive (a process's time is read while it lives)
    child.wait()
    time.sleep(0.2)
    marks["n"] = 2
    time.sleep(0.2)
    samples = account.stop()
    cut = window(samples, 1, 2)
    assert cut is not None and set(GROUPS) <= set(cut) and cut["wall_s"] > 0
    # the child's CPU is at least what it burned in the last sample that saw it alive
    assert 0.2 <= cut["engine"] <= 2.0, cut
    assert cut["trainer"] >= 0 and cut["busy"] >= cut["engine"] - 0.1
    assert window(samples, 1, 3) is None  # progress never reached 3
