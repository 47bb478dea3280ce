"""What grading in a fresh sandbox costs per rollout, beside grading in the rollout's own sandbox,
side by side on the same tasks and patches.

    python -m benchmarks.grading_cost [--tasks 8] [--repeats 2] [--quick] [--output FILE]

For each built-in SWE task (its gold patch applied in the workspace, as an agent's edit would
leave it): `in place` is the old way (the workspace's diff graded in the sandbox the agent
used); `fresh` takes the diff, then makes a new sandbox from the task's image, resets it and
grades there; `prepared` is training's way (`agent.rollout.rollout_and_grade`): the same clean
sandbox, but made and reset in a thread while the rollout runs, so grading only waits for what
is left of that. Then the grade alone (a clean sandbox, reset beforehand) with canary tests and
the runner not from the workdir (envs/canary.py, the default) and without (`canaries=False`),
in turn on each task. Prints mean and p95 seconds per rollout of each, the added seconds and
the ratios; the numbers go as JSON to stdout's last line and to `--output`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

from rich.console import Console
from rich.table import Table

from agent.rollout import _SandboxInThread
from taskdata.load import load_builtin_tasks
from envs.swe import SWEEnv
from sandbox.pool import SandboxPool


def _p95(xs: list[float]) -> float:
    return sorted(xs)[max(0, int(round(0.95 * len(xs))) - 1)]


def measure(n_tasks: int, repeats: int) -> dict:
    env, pool = SWEEnv(), SandboxPool(f"bench-grading-{uuid.uuid4().hex[:6]}", max_live=2)
    plain = SWEEnv(canaries=False)
    tasks = load_builtin_tasks()[:n_tasks]
    in_place, fresh, prepared, agree = [], [], [], 0
    guarded, unguarded, canaries_ok = [], [], 0
    for rep in range(repeats):
        for k, task in enumerate(tasks):
            order = [(env, guarded), (plain, unguarded)][:: 1 if (rep + k) % 2 == 0 else -1]  # in turn: first one, then the other
            for grader, times in order:
                with pool.sandbox(grader.image_for(task)) as sb:
                    grader.reset(task, sb)
                    t0 = time.monotonic()
                    g = grader.grade(task, sb, task.patch)
                    times.append(time.monotonic() - t0)
                    canaries_ok += grader.canaries and g.canary == "ok" and g.resolved and not g.tampered
            with pool.sandbox(env.image_for(task)) as sb:
                env.reset(task, sb)
                env._apply(sb, task.patch)  # the agent's edit, left in the workspace
                t0 = time.monotonic()
                a = env.grade(task, sb)
                in_place.append(time.monotonic() - t0)
            with pool.sandbox(env.image_for(task)) as sb:
                env.reset(task, sb)
                env._apply(sb, task.patch)
                t0 = time.monotonic()
                patch = env.patch_of(task, sb)
            with pool.sandbox(env.image_for(task)) as clean:
                env.reset(task, clean)
                b = env.grade(task, clean, patch)
            fresh.append(time.monotonic() - t0)
            # training's way: the clean sandbox made ready while the rollout runs (here the
            # rollout is only its reset and edit, so the overlap is the least it can be)
            with pool.sandbox(env.image_for(task)) as sb:
                grading = _SandboxInThread(pool, env.image_for(task), lambda sb: env.reset(task, sb))
                try:
                    env.reset(task, sb)
                    env._apply(sb, task.patch)
                    t0 = time.monotonic()
                    patch = env.patch_of(task, sb)
                    sb.close()
                    c = env.grade(task, grading.get(), patch)
                finally:
                    grading.close()
                prepared.append(time.monotonic() - t0)  # removing both sandboxes included, as in `fresh`
            agree += a.resolved == b.resolved == c.resolved
    out = {"rollouts": len(in_place), "in_place_mean_s": statistics.mean(in_place), "in_place_p95_s": _p95(in_place),
           "fresh_mean_s": statistics.mean(fresh), "fresh_p95_s": _p95(fresh),
           "prepared_mean_s": statistics.mean(prepared), "prepared_p95_s": _p95(prepared), "verdicts_agree": agree}
    out["added_mean_s"] = out["fresh_mean_s"] - out["in_place_mean_s"]
    out["ratio"] = out["fresh_mean_s"] / out["in_place_mean_s"]
    out["prepared_added_mean_s"] = out["prepared_mean_s"] - out["in_place_mean_s"]
    out["prepared_ratio"] = out["prepared_mean_s"] / out["in_place_mean_s"]
    out.update(canary_mean_s=statistics.mean(guarded), canary_p95_s=_p95(guarded),
               no_canary_mean_s=statistics.mean(unguarded), no_canary_p95_s=_p95(unguarded),
               canary_ratio=statistics.mean(guarded) / statistics.mean(unguarded), canary_gold_resolved=canaries_ok)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.grading_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=8)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="2 tasks once (for the test)")
    p.add_argument("--output", type=Path)
    args = p.parse_args(argv)
    result = measure(2, 1) if args.quick else measure(args.tasks, args.repeats)
    table = Table("grading", "mean s", "p95 s", title=f"{result['rollouts']} rollouts (built-in tasks, gold patches)")
    table.add_row("in place (the agent's sandbox)", f"{result['in_place_mean_s']:.2f}", f"{result['in_place_p95_s']:.2f}")
    table.add_row("fresh sandbox, made at grading", f"{result['fresh_mean_s']:.2f}", f"{result['fresh_p95_s']:.2f}")
    table.add_row("fresh sandbox, made ready during the rollout (training)", f"{result['prepared_mean_s']:.2f}",
                  f"{result['prepared_p95_s']:.2f}")
    table.add_row("the grade alone, with canaries (default)", f"{result['canary_mean_s']:.2f}", f"{result['canary_p95_s']:.2f}")
    table.add_row("the grade alone, without canaries", f"{result['no_canary_mean_s']:.2f}", f"{result['no_canary_p95_s']:.2f}")
    Console(stderr=True).print(table)
    Console(stderr=True).print(f"made at grading: added {result['added_mean_s']:.2f} s per rollout, x{result['ratio']:.2f}; "
                               f"made ready during the rollout: added {result['prepared_added_mean_s']:.2f} s, "
                               f"x{result['prepared_ratio']:.2f}; "
                               f"verdicts agree on {result['verdicts_agree']} of {result['rollouts']}; "
                               f"canaries: x{result['canary_ratio']:.2f} the grade's time, gold patches resolved with "
                               f"canaries intact on {result['canary_gold_resolved']} of {result['rollouts']}")
    if args.output:
        args.output.write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    ok = result["verdicts_agree"] == result["canary_gold_resolved"] == result["rollouts"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
