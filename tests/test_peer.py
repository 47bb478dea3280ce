"""experiments/peer.py in --quick mode: TRL's GRPOTrainer and the project's SAO and GRPO each
train a few steps on the prefer env and every run reports rewards (no timings are asserted:
they are measured in BENCHMARKS.md)."""

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
    r = subprocess.run([sys.executable, "-m", "experiments.peer", "--quick", "--cpu", "--output", str(out), "--plot", str(png)],
                       cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(report["runs"]) == {"trl_grpo", "sao", "grpo"} and report["unmatched"]
    for name, run in report["runs"].items():
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
    assert report["runs"]["trl_grpo"]["settings"]["num_generations"] == 8
    assert report["runs"]["trl_grpo"]["settings"]["beta"] == 0.0
    summaries = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(summaries) == {"trl_grpo", "sao", "grpo"}
    assert "TRL GRPOTrainer" in r.stdout and "project SAO" in r.stdout and "settings not matched" in r.stdout
    assert "CPU seconds per sample" in r.stdout
    assert png.stat().st_size > 10_000
