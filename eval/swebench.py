"""Evaluate a checkpoint on SWE-bench (Verified by default), or grade a predictions file.

    python -m eval.swebench --ckpt PATH [--dataset NAME|FILE|builtin] [--runs N] [--max-turns 50]
        [--engine auto|vllm|hf] [--dtype auto|float32|bfloat16|float16] [--gpu-memory-utilization F]
        [--device auto|cpu|cuda] [--max-workers N] [--instance-ids ID ...] [--resume] --output DIR
    python -m eval.swebench --predictions FILE|gold [--dataset ...] --output DIR

With `--ckpt` the agent runs once per instance and run in sandboxes, its diffs become
`predictions.jsonl` (swebench's format), each is graded as swebench grades, and the report
gives pass@1 over the runs with a 95% interval (`report.json`, `report.md`, `report.png`).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from envs.base import Task, make_env
from taskdata.load import load_tasks
from taskdata.rows import DatasetError
from eval.agent_eval import (UsageError, add_agent_arguments, agent_settings, check_agent_arguments,
                             engine_options, resolve_checkpoint)  # noqa: F401  (engine_options: our name too)
from eval.grading import PredictionsError, grade_all, load_predictions
from eval.report import print_summary, run_report
from sandbox.base import Limits, SandboxError
from sandbox.pool import SandboxPool

# a log file is not a terminal: rich would assume 80 columns and cut the table's headers
console = Console(stderr=True, width=None if sys.stderr.isatty() else 110)
DEFAULT_DATASET = "SWE-bench/SWE-bench_Verified"
log = logging.getLogger("eval.swebench")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m eval.swebench", description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default=DEFAULT_DATASET,
                   help=f"a hub dataset (default {DEFAULT_DATASET}), a .json/.jsonl/.parquet file, or builtin")
    p.add_argument("--split", default="test")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--predictions", help="swebench predictions (.json/.jsonl), or 'gold' for the gold patches")
    src.add_argument("--ckpt", help="the model to run the agent with: an HF model directory, a training.run "
                                    "checkpoint (checkpoints/step_N: its policy/ is used), a training output "
                                    "directory (its newest checkpoint), or a hub name")
    p.add_argument("--run-id", default="eval")
    p.add_argument("--output", type=Path, default=None, help="default: outputs/eval/<run-id>")
    p.add_argument("--max-workers", type=int, default=2, help="instances at once")
    p.add_argument("--instance-ids", nargs="+", default=None)
    p.add_argument("--test-timeout", type=float, default=1800.0,
                   help="seconds for one run of a task's tests (swebench's default, 1800)")
    p.add_argument("--memory-mb", type=int, default=Limits.memory_mb, help="memory of one sandbox")
    p.add_argument("--cpus", type=float, default=Limits.cpus, help="CPUs of one sandbox")
    p.add_argument("--warm-pool", type=int, default=0,
                   help="started containers kept ready per image (for --runs > 1 and grading's sandbox); 0: none")
    add_agent_arguments(p, runs_help="runs per instance; pass@1 is averaged over them",
                        max_turns_help="the paper's coding runs use up to 300", agents=("default", "mini_swe"))
    args = p.parse_args(argv)
    check_agent_arguments(p, args)
    if args.warm_pool < 0:
        p.error(f"--warm-pool must be at least 0, got {args.warm_pool}")
    for name in ("test_timeout", "cpus"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    return args


def warn_about_eval_scripts(tasks: list[Task]) -> None:
    """A hub row without swebench 5's `eval_script` is graded by pytest over its test files,
    which is not the repository's own test command (django's runtests.py, say)."""
    bare = [t.instance_id for t in tasks if not t.repo_path and not t.eval_script and not t.test_cmd]
    if bare:
        log.warning("%d instance(s) have no eval_script or test_cmd (e.g. %s): graded with pytest over their "
                    "test files, which may not be the repository's test command; use a swebench 5 dataset "
                    "export that carries eval_script", len(bare), bare[0])


def run_settings(args: argparse.Namespace, model: str, kind: str, max_tokens: int, options: dict) -> dict:
    """What the results depend on, as `--resume` compares them (eval.agent_eval.prepare_output)."""
    return {**agent_settings(args, model, kind, max_tokens, options), "test_timeout": args.test_timeout}


def evaluate_checkpoint(args: argparse.Namespace, tasks: list[Task], env, pool: SandboxPool, out: Path) -> dict:
    """The story of `--ckpt`: the model, the output directory, the engine and agent, the
    rollouts with their grades, the reports."""
    from eval.agent_eval import evaluate_agent, start_agent
    from eval.report import write_agent_reports

    agent, engine, model = start_agent(args, out, lambda *engine: run_settings(args, *engine), console,
                                       f"{len(tasks)} instance(s) x {args.runs} run(s)")
    try:
        records = evaluate_agent(agent, tasks, env, pool, out, runs=args.runs, max_workers=args.max_workers,
                                 resume=args.resume, seed=args.seed, model_name=model)
    finally:
        engine.close()  # the async engine's own process goes with it
    return write_agent_reports(records, tasks, out, model, args.dataset, console)


def grade_predictions(args: argparse.Namespace, tasks: list[Task], predictions: dict, env, pool: SandboxPool,
                      out: Path) -> dict:
    """The story of `--predictions`: grade each, write swebench's run report, print the table."""
    console.print(f"grading {len(predictions)} prediction(s) for {len(tasks)} instance(s) -> {out}")
    outcomes = grade_all(tasks, predictions, env, pool, out, args.max_workers)
    report = run_report(tasks, predictions, outcomes, out)
    (out / "report.json").write_text(json.dumps(report, indent=2))
    print_summary(report, tasks, outcomes, console)
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    out = args.output or Path("outputs") / "eval" / args.run_id
    try:
        if args.ckpt:
            resolve_checkpoint(args.ckpt)  # a wrong path is named before the dataset loads
        tasks = load_tasks(args.dataset, args.split, args.instance_ids)
        predictions = load_predictions(args.predictions, tasks) if args.predictions else None
        warn_about_eval_scripts(tasks)
        env = make_env("swe", test_timeout_s=args.test_timeout)
        pool = SandboxPool(args.run_id, Limits(memory_mb=args.memory_mb, cpus=args.cpus), max_live=args.max_workers,
                           warm=args.warm_pool)
    except (DatasetError, PredictionsError, SandboxError, UsageError) as e:
        console.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True)
        return 2
    try:
        if args.ckpt:
            evaluate_checkpoint(args, tasks, env, pool, out)
        else:
            grade_predictions(args, tasks, predictions, env, pool, out)
    except UsageError as e:
        console.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        kept = " (the finished rollouts are kept: the same command with --resume runs the rest)" if args.ckpt else ""
        console.print(f"interrupted{kept}")
        return 130
    finally:
        pool.close()
    console.print(f"report: {out / 'report.json'}" + (f", {out / 'report.md'}" if args.ckpt else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
