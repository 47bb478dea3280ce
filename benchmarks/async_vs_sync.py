"""SAO's streaming (async) mode against the batch-barrier (sync) mode, side by side: the
same tasks, model, engine and learner through `python -m training.run`, only `trainer.mode`
differs.

    python -m benchmarks.async_vs_sync [--steps 8] [--batch-size 8] [--workers 2] [--repeats 1]
        [--engine auto|hf|vllm] [overrides ...]

Prints rollouts per second, learner and engine idle fractions, and staleness for each mode,
and the async / sync ratio (this machine is noisy: compare the ratio, not the seconds).
Runs alternate (async, sync, async, sync, ...) with `--repeats`, and each cell is the mean.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from statistics import mean

from rich.console import Console
from rich.table import Table

from benchmarks.common import rates, train

COLUMNS = {  # label: (metric of a run, format)
    "rollouts/s": ("rollouts_per_s", "{:.2f}"),
    "s / step": ("seconds_per_step", "{:.2f}"),
    "learner idle": ("learner_idle_frac", "{:.2f}"),
    "engine idle": ("engine_idle_frac", "{:.2f}"),
    "staleness": ("staleness_mean", "{:.2f}"),
    "reward": ("reward_mean", "{:.3f}"),
}


def one_run(mode: str, args: argparse.Namespace, out: Path) -> dict[str, float]:
    """One training run in `mode` (async or sync) with the CLI's sizes; its rates."""
    train([f"trainer.mode={mode}", f"trainer.max_steps={args.steps}", f"trainer.batch_size={args.batch_size}",
           f"trainer.num_workers={args.workers}", f"trainer.checkpoint_every={args.steps}", f"engine={args.engine}",
           *args.overrides], out, mode)
    return rates(out, args.batch_size)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.async_vs_sync", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--engine", default="auto")
    p.add_argument("overrides", nargs="*", help="more training.run overrides, for both modes")
    args = p.parse_args(argv)
    if args.steps < 2:
        p.error("--steps must be at least 2 (the first step is start-up)")
    results: dict[str, list[dict[str, float]]] = {"async": [], "sync": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for mode in ("async", "sync"):
                print(f"run {i + 1}/{args.repeats}: {mode}", file=sys.stderr, flush=True)
                results[mode].append(one_run(mode, args, Path(tmp) / f"{mode}{i}"))
    cells = {mode: {k: mean(r[k] for r in runs) for k in runs[0]} for mode, runs in results.items()}
    table = Table(title=f"async vs sync: {args.steps} steps x {args.batch_size} rollouts, {args.workers} workers, "
                        f"engine {args.engine}, {args.repeats} repeat(s)")
    table.add_column("mode")
    for label in COLUMNS:
        table.add_column(label, justify="right")
    for mode in ("async", "sync"):
        table.add_row(mode, *(fmt.format(cells[mode][key]) for key, fmt in COLUMNS.values()))
    table.add_row("async / sync", *(f"{cells['async'][key] / cells['sync'][key]:.2f}" if cells["sync"][key] else "-"
                                    for key, _ in COLUMNS.values()))
    Console(width=140).print(table)
    print(json.dumps(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
