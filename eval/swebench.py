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

from agent.engines import DTYPES, is_hub_name, resolve_device, resolve_dtype
from envs.base import Task, make_env
from envs.data import DatasetError, load_tasks
from eval.grading import PredictionsError, grade_all, load_predictions
from eval.report import print_summary, run_report
from sandbox.base import Limits, SandboxError
from sandbox.pool import SandboxPool

# a log file is not a terminal: rich would assume 80 columns and cut the table's headers
console = Console(stderr=True, width=None if sys.stderr.isatty() else 110)
DEFAULT_DATASET = "SWE-bench/SWE-bench_Verified"
log = logging.getLogger("eval.swebench")


class UsageError(ValueError):
    """Bad input the user can fix; the message says which and why."""


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
    agent = p.add_argument_group("the agent (with --ckpt)")
    agent.add_argument("--engine", choices=["auto", "vllm", "hf"], default="auto", help="auto: vllm where installed")
    agent.add_argument("--dtype", choices=["auto", *DTYPES], default="auto",
                       help="the model's weights and activations; auto: bfloat16 where CUDA is available, else float32")
    agent.add_argument("--gpu-memory-utilization", type=float, default=None,
                       help="vllm: the share of GPU memory it takes (default 0.9 with CUDA, else 0.15)")
    agent.add_argument("--device", default="auto", help="hf: cpu, cuda or cuda:N (auto: cuda where available)")
    agent.add_argument("--runs", type=int, default=1, help="runs per instance; pass@1 is averaged over them")
    agent.add_argument("--max-turns", type=int, default=50, help="the paper's coding runs use up to 300")
    agent.add_argument("--max-tokens", type=int, default=None,
                       help="the whole context of one rollout (default: the model's max_position_embeddings)")
    agent.add_argument("--max-new-tokens", type=int, default=4096, help="one assistant turn")
    agent.add_argument("--rollout-timeout", type=float, default=3600.0, help="wall seconds for one rollout")
    agent.add_argument("--temperature", type=float, default=1.0)
    agent.add_argument("--top-p", type=float, default=1.0)
    agent.add_argument("--seed", type=int, default=0)
    agent.add_argument("--resume", action="store_true", help="keep the finished rollouts in --output, run the rest")
    agent.add_argument("--overwrite", action="store_true", help="remove an earlier evaluation in --output first")
    args = p.parse_args(argv)
    for name in ("max_workers", "runs", "max_turns", "max_tokens", "max_new_tokens"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.warm_pool < 0:
        p.error(f"--warm-pool must be at least 0, got {args.warm_pool}")
    for name in ("test_timeout", "rollout_timeout", "cpus"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.gpu_memory_utilization is not None and not 0 < args.gpu_memory_utilization <= 1:
        p.error(f"--gpu-memory-utilization must be in (0, 1], got {args.gpu_memory_utilization}")
    if args.resume and args.overwrite:
        p.error("--resume and --overwrite exclude each other")
    return args


def resolve_checkpoint(ckpt: str) -> str:
    """The HF model directory `ckpt` names: itself, its `policy/` (a training checkpoint), or
    the newest `checkpoints/step_N/policy` of a training output directory; a path that does not
    exist and looks like `owner/name` is taken as a hub name."""
    path = Path(ckpt)
    if not path.exists():
        if not is_hub_name(ckpt):
            raise UsageError(f"--ckpt {ckpt}: no such directory (and not a hub name like owner/model)")
        return ckpt
    steps = sorted((p for p in [*path.glob("step_*"), *path.glob("checkpoints/step_*")] if p.name[5:].isdigit()),
                   key=lambda p: int(p.name[5:]))
    for candidate in (path / "policy", path, *(s / "policy" for s in reversed(steps))):
        if (candidate / "config.json").is_file():
            return str(candidate)
    raise UsageError(f"--ckpt {ckpt}: no config.json there, in {path / 'policy'} or in a checkpoints/step_N/policy; "
                     "pass an HF model directory or a training checkpoint (checkpoints/step_N)")


def context_length(model: str, asked: int | None) -> int:
    """--max-tokens, or the model's own context (max_position_embeddings) when not given."""
    if asked is not None:
        return asked
    from transformers import AutoConfig

    return int(getattr(AutoConfig.from_pretrained(model), "max_position_embeddings", 32768))


def warn_about_eval_scripts(tasks: list[Task]) -> None:
    """A hub row without swebench 5's `eval_script` is graded by pytest over its test files,
    which is not the repository's own test command (django's runtests.py, say)."""
    bare = [t.instance_id for t in tasks if not t.repo_path and not t.eval_script and not t.test_cmd]
    if bare:
        log.warning("%d instance(s) have no eval_script or test_cmd (e.g. %s): graded with pytest over their "
                    "test files, which may not be the repository's test command; use a swebench 5 dataset "
                    "export that carries eval_script", len(bare), bare[0])


def engine_kind(asked: str) -> str:
    """`auto` is vllm where it is installed, else hf."""
    if asked != "auto":
        return asked
    from agent.engines.vllm import vllm_available

    return "vllm" if vllm_available() else "hf"


def engine_options(args: argparse.Namespace, kind: str, max_tokens: int) -> dict:
    """The engine's options with `auto` resolved for this machine: hf gets its device and dtype;
    vllm its dtype, the context and its share of GPU memory (0.9 with CUDA: the evaluation has
    the GPU to itself; else the engine's own 0.15)."""
    import torch

    try:  # the messages begin with the option's name and value
        dtype = resolve_dtype(args.dtype)
        device = resolve_device(args.device) if kind == "hf" else None
    except ValueError as e:
        raise UsageError(f"--{e}") from e
    if kind == "hf":
        if args.gpu_memory_utilization is not None:
            log.warning("--gpu-memory-utilization applies to the vllm engine; the hf engine ignores it")
        return {"device": device, "dtype": dtype}
    if args.device != "auto":
        log.warning("--device applies to the hf engine; vLLM runs on the platform it was built for")
    share = args.gpu_memory_utilization or (0.9 if torch.cuda.is_available() else 0.15)
    return {"dtype": dtype, "max_model_len": max_tokens, "gpu_memory_utilization": share}


def run_settings(args: argparse.Namespace, model: str, kind: str, max_tokens: int, options: dict) -> dict:
    """What the results depend on, as `--resume` compares them (eval.agent_eval.prepare_output)."""
    engine = {k: v for k, v in options.items() if k != "max_model_len"}  # that is max_tokens
    return {"model": model, "dataset": args.dataset, "split": args.split, "engine": kind, **engine,
            "max_turns": args.max_turns, "max_tokens": max_tokens, "max_new_tokens": args.max_new_tokens,
            "temperature": args.temperature, "top_p": args.top_p, "seed": args.seed,
            "test_timeout": args.test_timeout, "rollout_timeout": args.rollout_timeout}


def evaluate_checkpoint(args: argparse.Namespace, tasks: list[Task], env, pool: SandboxPool, out: Path) -> dict:
    """The story of `--ckpt`: the model, the output directory, the engine and agent, the
    rollouts with their grades, the reports."""
    from agent.engines import make_engine
    from agent.engines.shared import shareable
    from agent.loop import Agent, AgentConfig
    from eval.agent_eval import OutputError, evaluate_agent, prepare_output
    from eval.report import write_agent_reports

    model = resolve_checkpoint(args.ckpt)
    try:
        max_tokens = context_length(model, args.max_tokens)
    except OSError as e:  # a hub name without the hub, an unreadable config.json
        raise UsageError(f"--ckpt {args.ckpt}: cannot read the model's config ({e})") from e
    kind = engine_kind(args.engine)
    options = engine_options(args, kind, max_tokens)
    try:
        prepare_output(out, run_settings(args, model, kind, max_tokens, options), args.resume, args.overwrite)
    except OutputError as e:
        raise UsageError(str(e)) from e
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model)
        engine = shareable(make_engine(kind, model, **options))
    except Exception as e:  # a broken directory, no vLLM, a context longer than the model's
        raise UsageError(f"--ckpt {args.ckpt}: cannot load {model} on engine {kind} ({type(e).__name__}: {e})") from e
    console.print(f"agent: {model} on {kind} ({', '.join(f'{k} {v}' for k, v in options.items())}), "
                  f"{len(tasks)} instance(s) x {args.runs} run(s), "
                  f"up to {args.max_turns} turns and {max_tokens} tokens -> {out}")
    config = AgentConfig(max_turns=args.max_turns, max_tokens=max_tokens, max_new_tokens=args.max_new_tokens,
                         wall_time_s=args.rollout_timeout, temperature=args.temperature, top_p=args.top_p)
    try:
        records = evaluate_agent(Agent(engine, tokenizer, config), tasks, env, pool, out, runs=args.runs,
                                 max_workers=args.max_workers, resume=args.resume, seed=args.seed, model_name=model)
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
