"""What the benchmarks share: one `python -m training.run` as a subprocess, and its metrics read
back into rates (benchmarks/async_vs_sync.py, benchmarks/throughput.py); a result written out."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path
from statistics import mean

from training.checkpoint import jsonl_rows

ROOT = Path(__file__).resolve().parents[1]


def write_result(result: dict, output: Path | None) -> None:
    """A benchmark's result: as indented JSON to `output` (when given), and as one JSON line on
    stdout, its last line (what a caller or a test reads)."""
    if output:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


def read_jsonl(path: Path) -> list[dict]:
    """The JSON objects of a JSON-lines file (a run's metrics.jsonl, rollouts.jsonl), blank
    lines skipped and a last line still being written left out (`training.checkpoint.jsonl_rows`)."""
    return jsonl_rows(path)


def train(overrides: list[str], out: Path, label: str, resume: bool = False) -> Path:
    """Run `python -m training.run` with `overrides` into `out` (no held-out scoring; a run
    already in `out` is started over, or with `resume` gone on with from its newest
    checkpoint); returns `out`. A failed run ends the benchmark with its stderr's tail."""
    cmd = [sys.executable, "-m", "training.run", "held_out=null", f"resume={str(resume).lower()}", f"output_dir={out}",
           f"run_id=bench-{label}-{int(time.time())}", *overrides]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{label} run failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    return out


def rates(out: Path, batch_size: int) -> dict[str, float]:
    """A finished run's rates, from its metrics.jsonl (and rollouts.jsonl: the rollouts each
    step trained on, batch_size where it is missing). Rates count from the end of the first
    step on, so every mode pays the same start-up; the idle fractions are the run's own
    (`time/learner_idle_frac`, `time/engine_idle_frac` at its last step)."""
    rows = read_jsonl(out / "metrics.jsonl")
    if len(rows) < 2:
        raise SystemExit(f"{out}: {len(rows)} learner step(s) logged, at least 2 are needed for a rate")
    trained = {r["step"]: batch_size for r in rows}
    rollouts_log = out / "rollouts.jsonl"
    if rollouts_log.exists():
        trained = dict.fromkeys(trained, 0)
        for line in rollouts_log.read_text().splitlines():
            if line.strip():
                step = json.loads(line)["step"]
                trained[step] = trained.get(step, 0) + 1
    last = rows[-1]
    span = last["time/elapsed_s"] - rows[0]["time/elapsed_s"]
    steps = len(rows) - 1
    rollouts = sum(trained[r["step"]] for r in rows[1:])
    return {
        "rollouts_per_s": rollouts / span,
        "rollouts_per_hour": 3600 * rollouts / span,
        "seconds_per_step": span / steps,
        "learner_step_s": mean(r["time/step/learner_s"] for r in rows[1:]),
        "learner_idle_frac": last["time/learner_idle_frac"],
        "engine_idle_frac": last["time/engine_idle_frac"],
        "staleness_mean": mean(r["staleness/mean"] for r in rows),
        "reward_mean": mean(r["reward/mean"] for r in rows),
        "dropped_stale": last.get("stream/dropped_stale") or 0.0,
        "rollout_errors": last.get("rollout/errors") or 0.0,
        "rollouts_timed": float(rollouts),
        "run_s": last["time/elapsed_s"],
    }


def percentile(xs: list[float], q: float) -> float:
    """The nearest-rank `q`-th percentile (q in [0, 100]) of `xs`."""
    ranked = sorted(xs)
    return ranked[min(len(ranked), max(1, math.ceil(q / 100 * len(ranked)))) - 1]
