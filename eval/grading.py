"""Grade swebench-format predictions in sandboxes, concurrently, and write swebench's outputs.

Per instance `<output>/<instance_id>/` holds `patch.diff`, `test_output.txt` and `report.json`
(swebench's per-instance report); `<output>/report.json` is the run report with swebench's keys.
"""

from __future__ import annotations

import json
import logging
import traceback
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from envs.base import Env, GradeResult, Task
from sandbox.pool import SandboxPool

log = logging.getLogger(__name__)


class PredictionsError(ValueError):
    """The predictions file cannot be used; the message names the file, entry and field."""


def load_predictions(source: str, tasks: list[Task]) -> dict[str, dict[str, Any]]:
    """Predictions keyed by instance id, from a .json / .jsonl file, or `gold` (the tasks' patches)."""
    if source == "gold":
        return {t.instance_id: {"instance_id": t.instance_id, "model_name_or_path": "gold", "model_patch": t.patch}
                for t in tasks}
    path = Path(source)
    try:
        text = path.read_text()
        if path.suffix == ".jsonl":
            entries = [json.loads(line) for line in text.splitlines() if line.strip()]
        elif path.suffix == ".json":
            data = json.loads(text)
            entries = list(data.values()) if isinstance(data, dict) else data
        else:
            raise PredictionsError(f"{path}: predictions must be a .json or .jsonl file")
    except (OSError, json.JSONDecodeError) as e:
        raise PredictionsError(f"{path}: cannot read predictions: {e}") from e
    if not isinstance(entries, list):
        raise PredictionsError(f"{path}: expected a list of predictions")
    known = {t.instance_id for t in tasks}
    out: dict[str, dict[str, Any]] = {}
    for i, p in enumerate(entries):
        if not isinstance(p, dict) or not isinstance(p.get("instance_id"), str):
            raise PredictionsError(f"{path}: entry {i}: field 'instance_id' is missing or not a string")
        iid = p["instance_id"]
        if iid not in known:
            raise PredictionsError(f"{path}: entry {i}: instance_id {iid!r} is not in the dataset")
        patch = p.get("model_patch")
        if patch is not None and not isinstance(patch, str):
            raise PredictionsError(f"{path}: entry {i} ({iid}): field 'model_patch' must be a string or null")
        out[iid] = {"instance_id": iid, "model_name_or_path": str(p.get("model_name_or_path", "unknown")),
                    "model_patch": patch}
    return out


@dataclass
class InstanceOutcome:
    instance_id: str
    status: str  # resolved | unresolved | empty_patch | error | incomplete
    result: GradeResult | None = None
    error: str | None = None
    # counted apart in every report (SWE-bench's grading does not reject them): test
    # infrastructure the patch edits unasked, and a log whose canary tests were tampered with
    test_edits: list[str] = field(default_factory=list)
    tampered: str | None = None
    swebench_resolved: bool = False  # swebench's own verdict of the log (a tampered one included)


def grade_one(task: Task, prediction: dict[str, Any], env: Env, pool: SandboxPool, out_dir: Path) -> InstanceOutcome:
    """Grade one prediction in a fresh sandbox; never raises (an exception becomes `error`)."""
    iid = task.instance_id
    inst_dir = out_dir / iid
    inst_dir.mkdir(parents=True, exist_ok=True)
    for name in ("error.txt", "test_output.txt", "report.json"):  # an earlier grading's, into this --output
        (inst_dir / name).unlink(missing_ok=True)
    patch = prediction.get("model_patch") or ""
    (inst_dir / "patch.diff").write_text(patch)
    if not patch.strip():  # as swebench: an empty patch is counted, not run
        return InstanceOutcome(iid, "empty_patch")
    try:
        with pool.sandbox(env.image_for(task)) as sb:
            env.reset(task, sb)
            result = env.grade(task, sb, patch)
    except Exception as e:  # sandbox crash, missing image, engine error: recorded, never fatal
        reason = f"{type(e).__name__}: {e}"
        (inst_dir / "error.txt").write_text(reason + "\n\n" + traceback.format_exc())
        return InstanceOutcome(iid, "error", error=reason)
    (inst_dir / "test_output.txt").write_text(result.log)
    report = {iid: {**result.report, "tests_status_map": result.tests_status, "error": result.error,
                    "timed_out": result.timed_out, "duration_s": round(result.duration_s, 2),
                    "canary": result.canary, "tampered": result.tampered, "test_edits": result.test_edits}}
    (inst_dir / "report.json").write_text(json.dumps(report, indent=2))
    return InstanceOutcome(iid, "resolved" if result.resolved else "unresolved", result, test_edits=result.test_edits,
                           tampered=result.tampered, swebench_resolved=bool(result.report.get("resolved")))


def grade_all(
    tasks: list[Task],
    predictions: dict[str, dict[str, Any]],
    env: Env,
    pool: SandboxPool,
    out_dir: Path,
    max_workers: int = 4,
) -> list[InstanceOutcome]:
    """Grade every task that has a prediction, `max_workers` at a time, with a progress bar."""
    out_dir.mkdir(parents=True, exist_ok=True)
    todo = [t for t in tasks if t.instance_id in predictions]
    outcomes = [InstanceOutcome(t.instance_id, "incomplete") for t in tasks if t.instance_id not in predictions]
    columns = [TextColumn("grading"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("resolved {task.fields[resolved]}")]
    with Progress(*columns, transient=False) as progress, ThreadPoolExecutor(max_workers) as pool_exec:
        bar = progress.add_task("grading", total=len(todo), resolved=0)
        futures = [pool_exec.submit(grade_one, t, predictions[t.instance_id], env, pool, out_dir) for t in todo]
        resolved = 0
        for fut in as_completed(futures):
            outcome = fut.result()
            resolved += outcome.status == "resolved"
            progress.update(bar, advance=1, resolved=resolved)
            outcomes.append(outcome)
    order = {t.instance_id: i for i, t in enumerate(tasks)}
    return sorted(outcomes, key=lambda o: order[o.instance_id])
