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
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import traceback
import zlib
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agent.loop import Agent
from envs.base import Env, Task
from envs.swe import start_of
from eval.grading import InstanceOutcome, grade_one
from sandbox.pool import SandboxPool

log = logging.getLogger(__name__)
SETTINGS_FILE = "eval_settings.json"
# recorded, but a resume may change them: they decide how much memory vLLM takes, not what it samples
UNCHECKED_SETTINGS = frozenset({"gpu_memory_utilization"})


class OutputError(ValueError):
    """The output directory holds an evaluation this one must not be mixed into."""


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
    error: str | None = None
    seconds: float = 0.0  # rollout and grading

    def outcome(self) -> InstanceOutcome:
        return InstanceOutcome(self.instance_id, self.status, error=self.error)


def job_dir(out: Path, run: int, instance_id: str) -> Path:
    return out / f"run_{run}" / instance_id


def rollout_seed(seed: int, run: int, instance_id: str) -> int:
    """The same for a job whatever subset or order it runs in (so a resumed run matches)."""
    return seed + 1_000_003 * run + zlib.crc32(instance_id.encode()) % 1_000_000


def _write_atomic(path: Path, text: str) -> None:
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
    _write_atomic(path, json.dumps(settings, indent=2))


def run_job(agent: Agent, task: Task, env: Env, pool: SandboxPool, out: Path, run: int, seed: int,
            model_name: str) -> RolloutRecord:
    """Rollout, prediction, grading for one (run, instance); never raises. The job's directory
    starts empty: a rerun (of an errored or unfinished job) keeps nothing of the run before,
    such as its error.txt, which the run report would read."""
    inst = job_dir(out, run, task.instance_id)
    shutil.rmtree(inst, ignore_errors=True)
    inst.mkdir(parents=True, exist_ok=True)
    record = RolloutRecord(run, task.instance_id, "error")
    t0 = time.monotonic()
    try:
        with pool.sandbox(env.image_for(task)) as sb:
            traj = agent.run(task, env, sb, seed=rollout_seed(seed, run, task.instance_id))
            patch = sb.diff(start_of(task)) if traj.exit_reason not in ("sandbox_error", "sandbox_killed") else ""
        record.exit_reason, record.turns = traj.exit_reason, traj.turns
        record.tokens, record.sampled_tokens, record.model_patch = traj.num_tokens, traj.num_sampled, patch
        traj.info.update(model=model_name, run=run, model_patch=patch)
        if traj.exit_reason == "sandbox_error":
            record.error = f"SandboxError: {traj.info.get('error', 'the sandbox failed')}"
        else:
            prediction = {"instance_id": task.instance_id, "model_name_or_path": model_name, "model_patch": patch}
            graded = grade_one(task, prediction, env, pool, inst.parent)  # writes into inst
            record.status, record.error = graded.status, graded.error
            traj.reward = 1.0 if graded.status == "resolved" else 0.0
            if graded.result is not None:
                traj.info["grade"] = {k: v for k, v in asdict(graded.result).items() if k != "log"}
        traj.save(inst)
    except Exception as e:  # image missing, sandbox crash, engine error: recorded, never fatal
        record.error = f"{type(e).__name__}: {e}"
        (inst / "error.txt").write_text(record.error + "\n\n" + traceback.format_exc())
    record.seconds = round(time.monotonic() - t0, 2)
    _write_atomic(inst / "result.json", json.dumps(asdict(record), indent=2))
    return record


def load_record(out: Path, run: int, instance_id: str) -> RolloutRecord | None:
    path = job_dir(out, run, instance_id) / "result.json"
    if not path.exists():
        return None
    return RolloutRecord(**json.loads(path.read_text()))


def evaluate_agent(agent: Agent, tasks: list[Task], env: Env, pool: SandboxPool, out: Path, runs: int = 1,
                   max_workers: int = 2, resume: bool = False, seed: int = 0,
                   model_name: str = "sao") -> list[list[RolloutRecord]]:
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
            futures = [executor.submit(run_job, agent, t, env, pool, out, k, seed, model_name) for k, t in todo]
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
    _write_atomic(path, "".join(line + "\n" for line in lines))
