"""Sandbox latencies (create, first exec, grade, remove; p50 and p95) at concurrency 1 to 16,
with the warm pool and without, side by side.

    python -m benchmarks.sandbox [--concurrency 1 2 4 8 16] [--samples 32] [--grades 16]
                                 [--hold 0.5] [--quick] [--output FILE] [--plot FILE.png]
    python -m benchmarks.sandbox --churn 1000 [...]      (benchmarks/churn.py: a thousand in a row)

At concurrency c, c threads ask one pool (`max_live` = c) for sandboxes back to back. `create`
is the wait for `pool.sandbox(image)` to hand one out; `first exec` its first command (`true`);
`remove` leaving the block. Between the first exec and leaving, a thread holds its sandbox
`--hold` seconds (a rollout's own work, during which a warm pool refills). `grade` is a
built-in SWE task's gold patch graded in a fresh sandbox, from asking for the sandbox to the
verdict and the sandbox's removal (as training grades, reset and tests included). `warm` is
the same with `SandboxPool(warm=c)`, filled before each measurement; `cold` has no warm pool.
Prints a table; `--output` writes every sample as JSON, `--plot` p50 and p95 against
concurrency.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks.common import percentile
from taskdata.load import load_builtin_tasks
from envs.swe import SWEEnv
from sandbox.pool import SandboxPool

OPS = ("create", "first_exec", "remove", "grade")
MODES = ("cold", "warm")


def _in_threads(threads: int, per_thread: int, one) -> float:
    """`one()` `per_thread` times in each of `threads` threads; the wall seconds it took."""
    start = time.monotonic()
    with ThreadPoolExecutor(threads) as ex:
        for f in [ex.submit(lambda: [one() for _ in range(per_thread)]) for _ in range(threads)]:
            f.result()
    return time.monotonic() - start


def measure_level(mode: str, c: int, samples: int, grades: int, hold_s: float, env: SWEEnv, tasks) -> dict:
    """Every sample of one mode at concurrency `c`."""
    image = env.image_for(tasks[0])
    pool = SandboxPool(f"bench-sandbox-{uuid.uuid4().hex[:6]}", max_live=c, warm=c if mode == "warm" else 0)
    times: dict[str, list[float]] = {op: [] for op in OPS}
    lock = threading.Lock()
    unresolved: list[dict] = []  # a gold patch not resolved: why, to be read
    task_index = iter(range(1 << 30))

    def lifecycle() -> None:
        t0 = time.monotonic()
        with pool.sandbox(image) as sb:
            t1 = time.monotonic()
            if not sb.exec("true").ok:
                raise RuntimeError(f"`true` failed in sandbox {sb.id[:12]}")
            t2 = time.monotonic()
            time.sleep(hold_s)
            t3 = time.monotonic()
        t4 = time.monotonic()
        with lock:
            times["create"].append(t1 - t0)
            times["first_exec"].append(t2 - t1)
            times["remove"].append(t4 - t3)

    def grade() -> None:
        with lock:
            task = tasks[next(task_index) % len(tasks)]
        t0 = time.monotonic()
        with pool.sandbox(env.image_for(task)) as sb:
            env.reset(task, sb)
            result = env.grade(task, sb, task.patch)
        with lock:
            times["grade"].append(time.monotonic() - t0)
            if not result.resolved:
                unresolved.append({"instance_id": task.instance_id, "error": result.error, "timed_out": result.timed_out,
                                   "not_passed": {t: v for t, v in result.tests_status.items() if v != "PASSED"},
                                   "log_tail": result.log[-2000:]})

    try:
        with pool.sandbox(image):  # not measured: the image is checked, the image kept warm from now
            pass
        pool.wait_warm(image, timeout=600)
        life_wall = _in_threads(c, max(1, math.ceil(samples / c)), lifecycle)
        handed_lifecycle = dict(pool.handed)
        pool.wait_warm(image, timeout=600)
        grade_wall = _in_threads(c, max(1, math.ceil(grades / c)), grade)
        handed = {k: pool.handed[k] - handed_lifecycle[k] for k in pool.handed}
    finally:
        pool.close()
    out = {op: {"p50_s": percentile(xs, 50), "p95_s": percentile(xs, 95), "samples_s": xs} for op, xs in times.items()}
    # how the measured sandboxes were handed out (the unmeasured first one left out)
    out["handed_warm"] = handed_lifecycle["warm"] + handed["warm"]
    out["handed"] = sum(handed_lifecycle.values()) - 1 + sum(handed.values())
    out["lifecycle_wall_s"], out["grade_wall_s"] = life_wall, grade_wall
    out["graded"], out["resolved"], out["unresolved"] = len(times["grade"]), len(times["grade"]) - len(unresolved), unresolved
    return out


def measure(levels: list[int], samples: int, grades: int, hold_s: float, console: Console) -> dict:
    env, tasks = SWEEnv(), load_builtin_tasks()
    result = {"concurrency": levels, "samples": samples, "grades": grades, "hold_s": hold_s,
              "modes": {mode: {} for mode in MODES}}
    for c in levels:
        for mode in MODES:
            console.print(f"concurrency {c}, {mode} ...")
            result["modes"][mode][str(c)] = measure_level(mode, c, samples, grades, hold_s, env, tasks)
    return result


def table(result: dict) -> Table:
    t = Table("c", "op", "cold p50 s", "cold p95 s", "warm p50 s", "warm p95 s", "warm / cold p50", "taken warm",
              title=f"sandbox latencies ({result['samples']} lifecycles, {result['grades']} grades a level; "
                    f"hold {result['hold_s']:g} s)")
    for c in result["concurrency"]:
        cold, warm = result["modes"]["cold"][str(c)], result["modes"]["warm"][str(c)]
        for i, op in enumerate(OPS):
            a, b = cold[op], warm[op]
            t.add_row(str(c) if i == 0 else "", op.replace("_", " "), f"{a['p50_s']:.3f}", f"{a['p95_s']:.3f}",
                      f"{b['p50_s']:.3f}", f"{b['p95_s']:.3f}", f"x{b['p50_s'] / a['p50_s']:.2f}",
                      f"{warm['handed_warm']}/{warm['handed']}" if i == 0 else "",
                      end_section=i == len(OPS) - 1)
    return t


def plot(result: dict, path: Path) -> None:
    """p50 (solid) and p95 (dashed) against concurrency, one panel per op, both modes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = result["concurrency"]
    fig, axes = plt.subplots(1, len(OPS), figsize=(4 * len(OPS), 3.6))
    for ax, op in zip(axes, OPS):
        for mode, color in zip(MODES, ("tab:blue", "tab:orange")):
            cells = [result["modes"][mode][str(c)][op] for c in levels]
            ax.plot(levels, [x["p50_s"] for x in cells], "o-", color=color, label=f"{mode} p50")
            ax.plot(levels, [x["p95_s"] for x in cells], "s--", color=color, label=f"{mode} p95")
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.set_title(op.replace("_", " "))
        ax.set_xlabel("concurrency")
        ax.set_ylabel("seconds")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a == "--churn" or a.startswith("--churn=") for a in argv):  # the churn benchmark: benchmarks/churn.py
        from benchmarks import churn
        return churn.main(argv)
    p = argparse.ArgumentParser(prog="python -m benchmarks.sandbox", description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--samples", type=int, default=32, help="sandbox lifecycles a level (at least one a thread)")
    p.add_argument("--grades", type=int, default=16, help="gold patches graded a level (at least one a thread)")
    p.add_argument("--hold", type=float, default=0.5, help="seconds each sandbox is held after its first exec")
    p.add_argument("--quick", action="store_true", help="concurrency 1 and 2, a few samples (for the test)")
    p.add_argument("--output", type=Path)
    p.add_argument("--plot", type=Path)
    args = p.parse_args(argv)
    for name in ("samples", "grades"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.hold < 0 or any(c < 1 for c in args.concurrency):
        p.error(f"--hold must be >= 0 and --concurrency values >= 1, got {args.hold} and {args.concurrency}")
    if args.quick:
        args.concurrency, args.samples, args.grades, args.hold = [1, 2], 2, 1, 0.2
    console = Console(stderr=True)
    result = measure(sorted(set(args.concurrency)), args.samples, args.grades, args.hold, console)
    Console(width=120).print(table(result))
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=1))
    if args.plot:
        plot(result, args.plot)
    graded = [cell for mode in result["modes"].values() for cell in mode.values()]
    resolved, total = sum(x["resolved"] for x in graded), sum(x["graded"] for x in graded)
    console.print(f"gold patches resolved: {resolved} of {total}")
    for mode, cells in result["modes"].items():
        for c, cell in cells.items():
            for bad in cell["unresolved"]:
                console.print(f"not resolved ({mode}, concurrency {c}): {bad['instance_id']}: {bad['error']}; "
                              f"timed out: {bad['timed_out']}; tests not passed: {bad['not_passed']}\n{bad['log_tail'][-600:]}")
    return 0 if resolved == total else 1


if __name__ == "__main__":
    sys.exit(main())
