"""Run the agent once per instance and run, and grade each patch the way swebench does.

Every (run k, instance) is one job: a rollout in a fresh sandbox, the workspace's diff against
the base commit as the prediction, then grading in another fresh sandbox (as swebench keeps
the agent's environment apart from the evaluation's). A job's files, in `out/run_<k>/<id>/`:

    <id>.traj.json                        the trajectory (tokens, messages, exit reason, reward)
    patch.diff, test_output.txt, report.json   grading (eval.grading.grade_one)
    error.txt                             when the job failed (image missing, sandbox, engine)
    result.json                           the job's record, written last: a job with one is done

`out/eval_settings.json` holds what the results depend on (model, dataset, engine, dtype,
limits, timeouts, sampling). `--resume` skips the jobs that have a `result.json` and keeps
their results (a job that ended in `error` runs again, in an emptied directory: that is an
infrastructure fault, not a result), and refuses when the settings differ. A failure of one
job is recorded (status `error` with its reason) and never stops the others.

What a job does between its sandbox and its record is its `rollout` (`swe_rollout` here:
the diff graded as swebench grades; eval/math.py's: the answer graded by math-verify). The
`--ckpt` side of a checkpoint evaluation is shared too: the agent's command-line options,
the checkpoint's resolution, the engine and the agent (`start_agent`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import time
import traceback
import zlib
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agent.engines import DTYPES, is_hub_name, resolve_device, resolve_dtype
from envs.base import Env, Task
from eval.grading import InstanceOutcome, grade_one
from sandbox.pool import SandboxPool
from training.checkpoint import Checkpoints

if TYPE_CHECKING:  # the agent (torch) is loaded by `start_agent`, not by grading alone
    from agent.loop import Agent

log = logging.getLogger(__name__)
SETTINGS_FILE = "eval_settings.json"
# recorded, but a resume may change them: they decide how much memory vLLM takes, not what it samples
UNCHECKED_SETTINGS = frozenset({"gpu_memory_utilization"})


class OutputError(ValueError):
    """The output directory holds an evaluation this one must not be mixed into."""


class UsageError(ValueError):
    """Bad input the user can fix; the message says which and why."""


@dataclass
class RolloutRecord:
    """One job's outcome, as `result.json` holds it."""

    run: int
    instance_id: str
    status: str  # resolved | unresolved | empty_patch | error
    exit_reason: str = ""  # agent.trajectory.EXIT_REASONS, or "" when no rollout happened
    turns: int = 0
    tokens: int = 0  # the whole context at the end: prompt, samples, observations
    sampled_tokens: int = 0
    model_patch: str = ""
    answer: str | None = None  # a final-answer env's answer (eval/math.py); None: none given
    error: str | None = None
    seconds: float = 0.0  # rollout and grading
    test_edits: list[str] = field(default_factory=list)  # test infrastructure the patch edits unasked
    tampered: str | None = None  # the canary tests did not read pass and fail (envs/canary.py)
    swebench_resolved: bool = False  # swebench's own verdict of the log

    def outcome(self) -> InstanceOutcome:
        return InstanceOutcome(self.instance_id, self.status, error=self.error, test_edits=self.test_edits,
                               tampered=self.tampered, swebench_resolved=self.swebench_resolved)


def job_dir(out: Path, run: int, instance_id: str) -> Path:
    return out / f"run_{run}" / instance_id


def rollout_seed(seed: int, run: int, instance_id: str) -> int:
    """The same for a job whatever subset or order it runs in (so a resumed run matches)."""
    return seed + 1_000_003 * run + zlib.crc32(instance_id.encode()) % 1_000_000


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file and a rename: a crash leaves the old file or the new one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def prepare_output(out: Path, settings: dict[str, Any], resume: bool = False, overwrite: bool = False) -> None:
    """Make `out` ready: refuse to mix into an earlier evaluation unless `resume` (same
    settings) or `overwrite` (remove it first); record `settings`."""
    earlier = sorted(out.glob("run_*/*/result.json"))
    if earlier and not (resume or overwrite):
        raise OutputError(f"--output {out} holds an earlier evaluation ({len(earlier)} finished rollouts); "
                          "pass --resume to continue it or --overwrite to start over")
    path = out / SETTINGS_FILE
    if resume and earlier and path.exists():
        before = json.loads(path.read_text())
        changed = [f"{k}: {before.get(k)!r} -> {v!r}" for k, v in settings.items()
                   if k not in UNCHECKED_SETTINGS and before.get(k) != v]
        if changed:
            raise OutputError(f"--resume: {path} was made with other settings ({'; '.join(changed)}); "
                              "use another --output, or --overwrite to start over")
    if overwrite:
        for p in out.glob("run_*"):
            shutil.rmtree(p)
        for name in ("predictions.jsonl", "report.json", "report.md", "report.png", SETTINGS_FILE):
            (out / name).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(settings, indent=2))


def swe_rollout(agent: Agent, task: Task, env: Env, pool: SandboxPool, inst: Path, record: RolloutRecord,
                seed: int, model_name: str) -> None:
    """A SWE job: the rollout, the workspace's diff as the prediction, graded as swebench
    grades in a fresh sandbox (`grade_one`, which writes its files into `inst`); fills `record`
    and saves the trajectory."""
    from envs.swe import start_of

    with pool.sandbox(env.image_for(task)) as sb:
        traj = agent.run(task, env, sb, seed=seed)
        if traj.exit_reason in ("sandbox_error", "sandbox_killed"):
            patch = ""
        else:  # what the agent submitted, where its scaffold submits a patch (agent.mini_swe), else the workspace's diff
            patch = traj.info["submission"] if "submission" in traj.info else sb.diff(start_of(task))
    record.exit_reason, record.turns = traj.exit_reason, traj.turns
    record.tokens, record.sampled_tokens, record.model_patch = traj.num_tokens, traj.num_sampled, patch
    traj.info.update(model=model_name, run=record.run, model_patch=patch)
    if traj.exit_reason == "sandbox_error":
        record.error = f"SandboxError: {traj.info.get('error', 'the sandbox failed')}"
    else:
        prediction = {"instance_id": task.instance_id, "model_name_or_path": model_name, "model_patch": patch}
        graded = grade_one(task, prediction, env, pool, inst.parent)  # writes into inst
        record.status, record.error = graded.status, graded.error
        record.test_edits, record.tampered = graded.test_edits, graded.tampered
        record.swebench_resolved = graded.swebench_resolved
        traj.reward = 1.0 if graded.status == "resolved" else 0.0
        if graded.result is not None:
            traj.info["grade"] = {k: v for k, v in asdict(graded.result).items() if k != "log"}
    traj.save(inst)


Rollout = Callable[..., None]  # (agent, task, env, pool, inst, record, seed, model_name): fills the record


def run_job(agent: Agent, task: Task, env: Env, pool: SandboxPool, out: Path, run: int, seed: int,
            model_name: str, rollout: Rollout = swe_rollout) -> RolloutRecord:
    """Rollout, prediction, grading for one (run, instance); never raises. The job's directory
    starts empty: a rerun (of an errored or unfinished job) keeps nothing of the run before,
    such as its error.txt, which the run report would read."""
    inst = job_dir(out, run, task.instance_id)
    shutil.rmtree(inst, ignore_errors=True)
    inst.mkdir(parents=True, exist_ok=True)
    record = RolloutRecord(run, task.instance_id, "error")
    t0 = time.monotonic()
    try:
        rollout(agent, task, env, pool, inst, record, rollout_seed(seed, run, task.instance_id), model_name)
    except Exception as e:  # image missing, sandbox crash, engine error: recorded, never fatal
        record.error = f"{type(e).__name__}: {e}"
        (inst / "error.txt").write_text(record.error + "\n\n" + traceback.format_exc())
    record.seconds = round(time.monotonic() - t0, 2)
    write_atomic(inst / "result.json", json.dumps(asdict(record), indent=2))
    return record


def load_record(out: Path, run: int, instance_id: str) -> RolloutRecord | None:
    path = job_dir(out, run, instance_id) / "result.json"
    if not path.exists():
        return None
    return RolloutRecord(**json.loads(path.read_text()))


def evaluate_agent(agent: Agent, tasks: list[Task], env: Env, pool: SandboxPool, out: Path, runs: int = 1,
                   max_workers: int = 2, resume: bool = False, seed: int = 0,
                   model_name: str = "sao", rollout: Rollout = swe_rollout) -> list[list[RolloutRecord]]:
    """Every (run, task) job, `max_workers` at a time, with a progress bar; records[run][task]
    in the tasks' order. With `resume`, jobs already done are loaded, not run again. The agent's
    engine is called from `max_workers` threads: give it one that is safe so (SharedEngine)."""
    out.mkdir(parents=True, exist_ok=True)
    done: dict[tuple[int, str], RolloutRecord] = {}
    if resume:
        for k in range(runs):
            for t in tasks:
                # an errored job (no image, a sandbox fault) is not a result: it runs again
                if (r := load_record(out, k, t.instance_id)) is not None and r.status != "error":
                    done[(k, t.instance_id)] = r
    todo = [(k, t) for k in range(runs) for t in tasks if (k, t.instance_id) not in done]
    if resume:
        log.info("resume: %d finished rollout(s) kept from %s, %d to run", len(done), out, len(todo))
    columns = [TextColumn("rollouts"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("resolved {task.fields[resolved]}  errors {task.fields[errors]}")]
    resolved = sum(r.status == "resolved" for r in done.values())
    errors = sum(r.status == "error" for r in done.values())
    executor = ThreadPoolExecutor(max_workers)
    try:
        with Progress(*columns) as progress:
            bar = progress.add_task("rollouts", total=runs * len(tasks), completed=len(done),
                                    resolved=resolved, errors=errors)
            futures = [executor.submit(run_job, agent, t, env, pool, out, k, seed, model_name, rollout)
                       for k, t in todo]
            for fut in as_completed(futures):
                r = fut.result()
                done[(r.run, r.instance_id)] = r
                resolved += r.status == "resolved"
                errors += r.status == "error"
                if r.status == "error":
                    progress.console.print(f"error run {r.run} {r.instance_id}: {r.error}", markup=False,
                                           soft_wrap=True)
                progress.update(bar, advance=1, resolved=resolved, errors=errors)
    finally:
        # on Ctrl-C the jobs not started are dropped; running ones finish and are kept for --resume
        executor.shutdown(wait=True, cancel_futures=True)
    return [[done[(k, t.instance_id)] for t in tasks] for k in range(runs)]


def write_predictions(path: Path, records: list[RolloutRecord], model_name: str) -> None:
    """swebench's predictions format, one JSON object per line (`run_evaluation` reads it)."""
    lines = [json.dumps({"instance_id": r.instance_id, "model_name_or_path": model_name, "model_patch": r.model_patch})
             for r in records]
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, "".join(line + "\n" for line in lines))


# -- a checkpoint evaluation's agent (`--ckpt`), shared by eval.swebench and eval.math ------------
def add_agent_arguments(p: argparse.ArgumentParser, runs_help: str, max_turns_help: str,
                        runs_default: int | None = 1, agents: tuple[str, ...] = ("default",)) -> None:
    """The options of the agent a `--ckpt` evaluation runs (which agent, engine, sampling,
    limits, resume); `agents`: those this evaluation's env can take (agent.agents.AGENTS)."""
    agent = p.add_argument_group("the agent (with --ckpt)")
    agent.add_argument("--agent", choices=agents, default="default",
                       help="default: the project's loop; mini_swe: mini-swe-agent as it ships, through the rollout endpoint")
    agent.add_argument("--engine", choices=["auto", "vllm", "hf"], default="auto", help="auto: vllm where installed")
    agent.add_argument("--dtype", choices=["auto", *DTYPES], default="auto",
                       help="the model's weights and activations; auto: bfloat16 where CUDA is available, else float32")
    agent.add_argument("--gpu-memory-utilization", type=float, default=None,
                       help="vllm: the share of GPU memory it takes (default 0.9 with CUDA, else 0.15)")
    agent.add_argument("--device", default="auto", help="hf: cpu, cuda or cuda:N (auto: cuda where available)")
    agent.add_argument("--runs", type=int, default=runs_default, help=runs_help)
    agent.add_argument("--max-turns", type=int, default=50, help=max_turns_help)
    agent.add_argument("--max-tokens", type=int, default=None,
                       help="the whole context of one rollout (default: the model's max_position_embeddings)")
    agent.add_argument("--max-new-tokens", type=int, default=4096, help="one assistant turn")
    agent.add_argument("--rollout-timeout", type=float, default=3600.0, help="wall seconds for one rollout")
    agent.add_argument("--temperature", type=float, default=1.0)
    agent.add_argument("--top-p", type=float, default=1.0)
    agent.add_argument("--seed", type=int, default=0)
    agent.add_argument("--resume", action="store_true", help="keep the finished rollouts in --output, run the rest")
    agent.add_argument("--overwrite", action="store_true", help="remove an earlier evaluation in --output first")


def check_agent_arguments(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """`p.error` (exit 2) for an agent option that cannot work."""
    for name in ("max_workers", "runs", "max_turns", "max_tokens", "max_new_tokens"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.rollout_timeout <= 0:
        p.error(f"--rollout-timeout must be positive, got {args.rollout_timeout}")
    if args.gpu_memory_utilization is not None and not 0 < args.gpu_memory_utilization <= 1:
        p.error(f"--gpu-memory-utilization must be in (0, 1], got {args.gpu_memory_utilization}")
    if args.resume and args.overwrite:
        p.error("--resume and --overwrite exclude each other")


def resolve_checkpoint(ckpt: str) -> str:
    """The HF model directory `ckpt` names: itself, its `policy/` (a training checkpoint), or
    the newest `checkpoints/step_N/policy` of a training output directory; a path that does not
    exist and looks like `owner/name` is taken as a hub name."""
    path = Path(ckpt)
    if not path.exists():
        if not is_hub_name(ckpt):
            raise UsageError(f"--ckpt {ckpt}: no such directory (and not a hub name like owner/model)")
        return ckpt
    steps = sorted(filter(Checkpoints.is_step, [*path.glob("step_*"), *path.glob("checkpoints/step_*")]),
                   key=Checkpoints.step_of)
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


def agent_settings(args: argparse.Namespace, model: str, kind: str, max_tokens: int, options: dict) -> dict:
    """What a checkpoint evaluation's results depend on, as `--resume` compares them (each
    evaluation adds its own: a test timeout, a python timeout)."""
    engine = {k: v for k, v in options.items() if k != "max_model_len"}  # that is max_tokens
    return {"model": model, "dataset": args.dataset, "split": args.split, "engine": kind, **engine,
            "max_turns": args.max_turns, "max_tokens": max_tokens, "max_new_tokens": args.max_new_tokens,
            "temperature": args.temperature, "top_p": args.top_p, "seed": args.seed,
            "rollout_timeout": args.rollout_timeout, "agent": args.agent}


def start_agent(args: argparse.Namespace, out: Path, settings: Callable[[str, str, int, dict], dict], console,
                what: str):
    """The model `--ckpt` names, the output directory made ready (`settings(model, engine kind,
    max_tokens, engine options)` recorded, or compared on `--resume`), the engine and the agent:
    (agent, engine, model). `what` says what is evaluated, for the line printed; close the
    engine when done."""
    from agent.agents import make_agent
    from agent.engines import make_engine
    from agent.engines.shared import shareable
    from agent.loop import AgentConfig

    model = resolve_checkpoint(args.ckpt)
    try:
        max_tokens = context_length(model, args.max_tokens)
    except OSError as e:  # a hub name without the hub, an unreadable config.json
        raise UsageError(f"--ckpt {args.ckpt}: cannot read the model's config ({e})") from e
    kind = engine_kind(args.engine)
    options = engine_options(args, kind, max_tokens)
    try:
        prepare_output(out, settings(model, kind, max_tokens, options), args.resume, args.overwrite)
    except OutputError as e:
        raise UsageError(str(e)) from e
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model)
        engine = shareable(make_engine(kind, model, **options))
    except Exception as e:  # a broken directory, no vLLM, a context longer than the model's
        raise UsageError(f"--ckpt {args.ckpt}: cannot load {model} on engine {kind} ({type(e).__name__}: {e})") from e
    console.print(f"agent {args.agent}: {model} on {kind} ({', '.join(f'{k} {v}' for k, v in options.items())}), {what}, "
                  f"up to {args.max_turns} turns and {max_tokens} tokens -> {out}")
    config = AgentConfig(max_turns=args.max_turns, max_tokens=max_tokens, max_new_tokens=args.max_new_tokens,
                         wall_time_s=args.rollout_timeout, temperature=args.temperature, top_p=args.top_p)
    return make_agent(args.agent, engine, tokenizer, config), engine, model
