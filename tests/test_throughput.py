"""benchmarks/throughput.py runs both cases with the latency off and on and writes its JSON and
plot (tiny sizes; timings are not asserted: BENCHMARKS.md has the measured numbers)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks.throughput", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)


@pytest.mark.docker
def test_throughput_quick_runs_both_cases_latency_off_and_on(docker_client, tmp_path):
    out, png = tmp_path / "throughput.json", tmp_path / "plot" / "throughput.png"
    r = run("--quick", "--output", str(out), "--plot", str(png))
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result["cells"]) == {"off", "on"}
    for cells in result["cells"].values():
        assert {"async_sao", "sync_grpo", "ratio"} <= set(cells)
        for case in ("async_sao", "sync_grpo"):
            assert cells[case]["rollouts_per_hour"] > 0 and cells[case]["rollouts_timed"] > 0
            assert 0 <= cells[case]["learner_idle_frac"] <= 1 and 0 <= cells[case]["engine_idle_frac"] <= 1
        assert cells["ratio"]["rollouts_per_hour"] > 0
    # every run was real: one per (case, latency), the latency passed on only where it is on
    runs = {(x["case"], x["latency"]): x for x in result["runs"]}
    assert set(runs) == {(c, lat) for c in ("async_sao", "sync_grpo") for lat in (False, True)}
    for (case, latency), x in runs.items():
        assert ("agent.latency_alpha=null" in x["overrides"]) != latency
        assert ("trainer.mode=async" if case == "async_sao" else "trainer.mode=sync") in x["overrides"]
    assert "algo=grpo" in runs["sync_grpo", True]["overrides"]
    assert png.stat().st_size > 0
    assert "async SAO / sync GRPO" in r.stdout and "AReaL reports 2.77x" in r.stdout


@pytest.mark.parametrize("args, says", [
    (["--steps", "1"], "--steps must be at least 2"),
    (["--batch-size", "10", "--group-size", "4"], "must be a multiple of --group-size"),
    (["--plot", "out.jpg"], "must name a .png file"),
    (["--cases", "async_sao"], "at least two different cases"),
])
def test_throughput_refuses_bad_arguments(args, says):
    r = run(*args)
    assert r.returncode == 2 and says in r.stderr
