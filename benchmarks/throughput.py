"""Rollout throughput on the same compute: asynchronous SAO (streaming, one rollout per prompt)
against synchronous group-batched GRPO (each step waits for its whole batch of G-rollout
groups), with the long-tail tool latency off and on.

    python -m benchmarks.throughput [--steps 6] [--batch-size 16] [--group-size 8] [--workers 8]
        [--latency-alpha 1.5] [--latency-scale 0.5] [--latency-max 10] [--engine auto]
        [--cases async_sao sync_grpo] [--repeats 1] [--quick] [--output FILE.json] [--plot FILE.png]
        [overrides ...]

Every case runs `python -m training.run` with the same workers, engine, learner and batch
size in rollouts; only the algo and `trainer.mode` differ. The tasks are the embedded
default's prefer and arith sources, one turn each: the agent loop sleeps the latency after a
rollout's first turn, so every rollout pays it (the SWE source is left out: its tests, not
the latency, would set the pace). Prints rollouts per hour, learner and engine idle fractions
(the run's `time/learner_idle_frac`, `time/engine_idle_frac`) and the async / sync ratio per
latency setting, beside AReaL's reported 2.77x. Rates count from the end of the first step.

A group's G rollouts run side by side, each in one of the worker slots (since b1a727a; before
it they ran one after another, so a sync GRPO step had only batch / G in flight).
`--cases async_sao sync_grpo sync_sao` adds SAO behind the same barrier (one rollout a prompt):
the barrier's cost apart from the groups'.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from statistics import mean

from rich.console import Console
from rich.table import Table

from benchmarks.common import rates, read_jsonl, train

AREAL_RATIO = 2.77  # AReaL (arXiv 2505.24298): asynchronous over synchronous training, same GPUs
SOURCES = ("sources=["  # the embedded default's prefer and arith sources, single turn
           "{name:prefer,env:prefer,tasks:{_target_:envs.prefer.make_prefer_tasks,n:256,seed:0},weight:8,"
           "agent:{max_turns:1,max_new_tokens:32}},"
           "{name:arith,env:arith,tasks:{_target_:envs.arith.make_arith_tasks,n:256,seed:0,max_operand:4},weight:2,"
           "agent:{max_turns:1,max_new_tokens:32}}]")
CASES = {  # name: (label, overrides)
    "async_sao": ("async SAO", ["algo=sao", "trainer.mode=async"]),
    "sync_grpo": ("sync GRPO", ["algo=grpo", "trainer.mode=sync"]),  # + algo.group_size
    # the control: SAO's one rollout per prompt behind the sync barrier (the barrier alone)
    "sync_sao": ("sync SAO", ["algo=sao", "trainer.mode=sync"]),
}
FULL = {"steps": 6, "batch_size": 16, "group_size": 8, "workers": 8, "latency_alpha": 1.5, "latency_scale": 0.5,
        "latency_max": 10.0, "engine": "auto"}
QUICK = {"steps": 2, "batch_size": 4, "group_size": 2, "workers": 2, "latency_alpha": 1.5, "latency_scale": 0.05,
         "latency_max": 0.2, "engine": "hf"}
COLUMNS = {  # label: (metric, format)
    "rollouts/h": ("rollouts_per_hour", "{:.0f}"),
    "s / step": ("seconds_per_step", "{:.1f}"),
    "learner step s": ("learner_step_s", "{:.1f}"),
    "learner idle": ("learner_idle_frac", "{:.2f}"),
    "engine idle": ("engine_idle_frac", "{:.2f}"),
    "staleness": ("staleness_mean", "{:.2f}"),
    "reward": ("reward_mean", "{:.3f}"),
}


def capped_pareto_mean(alpha: float, scale: float, cap: float) -> float:
    """E[min(X, cap)] for X ~ Pareto(alpha) from `scale` (seconds): the mean latency a rollout pays."""
    if cap <= scale:
        return cap
    if abs(alpha - 1.0) < 1e-9:
        return scale * (1 + math.log(cap / scale))
    return scale * alpha / (alpha - 1) - scale ** alpha * cap ** (1 - alpha) / (alpha - 1)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.throughput", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, help=f"learner steps a run (default {FULL['steps']})")
    p.add_argument("--batch-size", type=int, help=f"rollouts a learner step, every case (default {FULL['batch_size']})")
    p.add_argument("--group-size", type=int, help=f"GRPO's rollouts per prompt (default {FULL['group_size']})")
    p.add_argument("--workers", type=int, help=f"concurrent rollout workers (default {FULL['workers']})")
    p.add_argument("--latency-alpha", type=float, help=f"Pareto tail index (default {FULL['latency_alpha']})")
    p.add_argument("--latency-scale", type=float, help=f"its minimum, seconds (default {FULL['latency_scale']})")
    p.add_argument("--latency-max", type=float, help=f"its cap, seconds (default {FULL['latency_max']})")
    p.add_argument("--engine", help=f"engine=... for every run (default {FULL['engine']})")
    p.add_argument("--cases", nargs="+", choices=list(CASES), default=["async_sao", "sync_grpo"],
                   help="the first is the numerator of every ratio, the second the headline denominator; "
                        "sync_sao (the barrier alone) may be added as a control")
    p.add_argument("--repeats", type=int, default=1, help="runs per cell, alternated; each cell is their mean")
    p.add_argument("--quick", action="store_true", help="tiny sizes and engine hf, for a test")
    p.add_argument("--output", type=Path, help="write the raw results as JSON here")
    p.add_argument("--plot", type=Path, help="draw rollouts/hour and idle fractions per case into this PNG")
    p.add_argument("overrides", nargs="*", help="more training.run overrides, for every run")
    args = p.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.steps < 2:
        p.error(f"--steps must be at least 2 (the first step is start-up), got {args.steps}")
    for name in ("batch_size", "group_size", "workers", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.batch_size % args.group_size:
        p.error(f"--batch-size {args.batch_size} must be a multiple of --group-size {args.group_size} "
                f"(GRPO's batch is whole groups)")
    if args.latency_alpha < 0.01:  # as training.config checks agent.latency_alpha
        p.error(f"--latency-alpha must be at least 0.01, got {args.latency_alpha}")
    if args.latency_scale <= 0 or args.latency_max < args.latency_scale:
        p.error(f"need 0 < --latency-scale <= --latency-max, got {args.latency_scale} and {args.latency_max}")
    if len(set(args.cases)) != len(args.cases) or len(args.cases) < 2:
        p.error(f"--cases needs at least two different cases, got {args.cases}")
    if args.plot is not None and args.plot.suffix.lower() != ".png":
        p.error(f"--plot must name a .png file, got {args.plot}")
    return args


def overrides_for(case: str, latency: bool, args: argparse.Namespace) -> list[str]:
    """One run's training.run overrides: the shared sizes, the case's algo and mode, the latency."""
    # the tiny model's 5 critic-only warm-up steps would leave SAO's policy, and its weight syncs,
    # out of most of a short run: here SAO updates its policy from the first step, as GRPO does
    shared = [SOURCES, "model.algo_overrides.critic_warmup_steps=0", f"trainer.max_steps={args.steps}",
              f"trainer.batch_size={args.batch_size}", f"trainer.num_workers={args.workers}",
              f"trainer.checkpoint_every={args.steps}", f"engine={args.engine}"]
    algo = list(CASES[case][1])
    if case == "sync_grpo":
        algo.append(f"algo.group_size={args.group_size}")
    if latency:
        tail = [f"agent.latency_alpha={args.latency_alpha}", f"agent.latency_scale_s={args.latency_scale}",
                f"agent.latency_max_s={args.latency_max}"]
    else:
        tail = ["agent.latency_alpha=null"]
    quick = ["+debug=tiny"] if args.quick else []  # its small SFT warm start (its other fields are overridden here)
    return [*quick, *shared, *algo, *tail, *args.overrides]


def per_step(out: Path) -> list[dict[str, float]]:
    """A run's timing metrics step by step, kept in the raw JSON."""
    keys = ("step", "time/elapsed_s", "time/step/learner_s", "time/learner_idle_frac", "time/engine_idle_frac",
            "staleness/mean", "rollout/errors")
    rows = read_jsonl(out / "metrics.jsonl")
    return [{k: row.get(k) for k in keys} for row in rows]


def measure(args: argparse.Namespace) -> dict:
    """Every (latency, case) run, alternated over the repeats; the raw runs and each cell's mean."""
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for latency in (False, True):
                for case in args.cases:
                    name = f"{case}-latency_{'on' if latency else 'off'}-{i}"
                    load_before = os.getloadavg()[0]  # the machine is shared: its load goes with each run
                    print(f"run {name} (load {load_before:.1f})", file=sys.stderr, flush=True)
                    overrides = overrides_for(case, latency, args)
                    out = train(overrides, Path(tmp) / name, name)
                    runs.append({"case": case, "latency": latency, "repeat": i, "overrides": overrides,
                                 **rates(out, args.batch_size), "load_1min": [load_before, os.getloadavg()[0]],
                                 "steps": per_step(out)})
    cells: dict[str, dict[str, dict[str, float]]] = {}
    for latency in ("off", "on"):
        cells[latency] = {}
        for case in args.cases:
            mine = [r for r in runs if r["case"] == case and r["latency"] == (latency == "on")]
            cells[latency][case] = {k: mean(r[k] for r in mine) for k in mine[0] if isinstance(mine[0][k], float)}
        num = cells[latency][args.cases[0]]
        # the first case over each other one; "ratio": over the second, the headline
        cells[latency]["ratios"] = {case: {k: num[k] / cells[latency][case][k] for k in num if cells[latency][case][k]}
                                    for case in args.cases[1:]}
        cells[latency]["ratio"] = cells[latency]["ratios"][args.cases[1]]
    return {"runs": runs, "cells": cells}


def print_table(result: dict, args: argparse.Namespace) -> None:
    tail = capped_pareto_mean(args.latency_alpha, args.latency_scale, args.latency_max)
    table = Table(title=f"throughput: {args.steps} steps x {args.batch_size} rollouts, {args.workers} workers, "
                        f"GRPO groups of {args.group_size}, engine {args.engine}, {args.repeats} repeat(s); latency "
                        f"Pareto({args.latency_alpha:g}) from {args.latency_scale:g} s capped at "
                        f"{args.latency_max:g} s (mean {tail:.2f} s a rollout)")
    table.add_column("latency")
    table.add_column("case")
    for label in COLUMNS:
        table.add_column(label, justify="right")
    for latency, cells in result["cells"].items():
        for case in args.cases:
            table.add_row(latency, CASES[case][0], *(fmt.format(cells[case][key]) for key, fmt in COLUMNS.values()))
        for i, (case, ratio) in enumerate(cells["ratios"].items()):
            table.add_row(latency, f"[bold]{CASES[args.cases[0]][0]} / {CASES[case][0]}[/bold]",
                          *(f"{ratio[key]:.2f}" if key in ratio else "-" for key, _ in COLUMNS.values()),
                          end_section=i == len(cells["ratios"]) - 1)
    ratio_label = f"{CASES[args.cases[0]][0]} / {CASES[args.cases[1]][0]}"
    Console(width=160).print(table)
    ours = ", ".join(f"latency {k}: {v['ratio']['rollouts_per_hour']:.2f}x" for k, v in result["cells"].items())
    print(f"{ratio_label} in rollouts/hour: {ours}; AReaL reports {AREAL_RATIO}x (asynchronous over synchronous "
          f"training, same GPUs)")


def plot(result: dict, args: argparse.Namespace, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("rollouts_per_hour", "rollouts / hour"), ("learner_idle_frac", "learner idle fraction"),
              ("engine_idle_frac", "engine idle fraction")]
    latencies = list(result["cells"])
    width = 0.8 / len(args.cases)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8))
    for ax, (key, title) in zip(axes, panels):
        for j, case in enumerate(args.cases):
            xs = [i + (j - (len(args.cases) - 1) / 2) * width for i in range(len(latencies))]
            values = [result["cells"][lat][case][key] for lat in latencies]
            bars = ax.bar(xs, values, width, label=CASES[case][0])
            ax.bar_label(bars, fmt="%.0f" if key == "rollouts_per_hour" else "%.2f", fontsize=8)
        ax.set_xticks(range(len(latencies)), [f"latency {lat}" for lat in latencies])
        ax.set_title(title)
        top = max(result["cells"][lat][case][key] for lat in latencies for case in args.cases)
        ax.set_ylim(0, 1.05 if key != "rollouts_per_hour" else 1.25 * top)  # room for the labels and legend
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(loc="upper center", ncol=len(args.cases), fontsize=8)
    ratios = ", ".join(f"{lat} {result['cells'][lat]['ratio']['rollouts_per_hour']:.2f}x" for lat in latencies)
    fig.suptitle(f"{CASES[args.cases[0]][0]} / {CASES[args.cases[1]][0]} rollouts/hour: {ratios} "
                 f"(AReaL reports {AREAL_RATIO}x)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = measure(args)
    print_table(result, args)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    config["latency_mean_s"] = capped_pareto_mean(args.latency_alpha, args.latency_scale, args.latency_max)
    raw = {"config": config, "areal_ratio": AREAL_RATIO, **result}
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(raw, indent=2) + "\n")
    if args.plot:
        plot(result, args, args.plot)
    print(json.dumps(result["cells"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
