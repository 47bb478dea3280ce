"""Grade SWE-bench-format predictions in Docker sandboxes and write swebench's reports.

    python -m eval.swebench --dataset FILE|builtin|HUB_NAME --predictions FILE|gold \\
        --run-id ID --output DIR [--max-workers N] [--instance-ids ID ...]

Running the agent from a checkpoint (`--ckpt PATH`) is the same command with the agent's
predictions in place of `--predictions`; it arrives with the agent.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from envs.base import make_env
from envs.data import DatasetError, load_tasks
from eval.grading import PredictionsError, grade_all, load_predictions
from eval.report import print_summary, run_report
from sandbox.base import Limits, SandboxError
from sandbox.pool import SandboxPool

# a log file is not a terminal: rich would assume 80 columns and cut the table's headers
console = Console(stderr=True, width=None if sys.stderr.isatty() else 110)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m eval.swebench", description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="builtin",
                   help="builtin (the shipped tasks), a .json/.jsonl/.parquet file, or a hub dataset name")
    p.add_argument("--split", default="test")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--predictions", help="swebench predictions (.json/.jsonl), or 'gold' for the gold patches")
    src.add_argument("--ckpt", help="an HF checkpoint to run the agent with (needs the agent package)")
    p.add_argument("--run-id", default="eval")
    p.add_argument("--output", type=Path, default=None, help="default: outputs/eval/<run-id>")
    p.add_argument("--max-workers", type=int, default=2)
    p.add_argument("--instance-ids", nargs="+", default=None)
    p.add_argument("--test-timeout", type=float, default=600.0, help="seconds for one run of a task's tests")
    p.add_argument("--memory-mb", type=int, default=Limits.memory_mb)
    args = p.parse_args(argv)
    if args.ckpt:
        p.error("--ckpt runs the agent, which this checkout does not have yet; grade a predictions file instead")
    if args.max_workers < 1:
        p.error(f"--max-workers must be at least 1, got {args.max_workers}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    out = args.output or Path("outputs") / "eval" / args.run_id
    try:
        tasks = load_tasks(args.dataset, args.split, args.instance_ids)
        predictions = load_predictions(args.predictions, tasks)
        env = make_env("swe", test_timeout_s=args.test_timeout)
        pool = SandboxPool(args.run_id, Limits(memory_mb=args.memory_mb), max_live=args.max_workers)
    except (DatasetError, PredictionsError, SandboxError) as e:
        console.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True)
        return 2
    console.print(f"grading {len(predictions)} prediction(s) for {len(tasks)} instance(s) -> {out}")
    try:
        outcomes = grade_all(tasks, predictions, env, pool, out, args.max_workers)
    finally:
        pool.close()
    report = run_report(tasks, predictions, outcomes)
    (out / "report.json").write_text(json.dumps(report, indent=2))
    print_summary(report, tasks, outcomes, console)
    console.print(f"report: {out / 'report.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
