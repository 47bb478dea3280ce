"""Load SWE-bench-format tasks from JSON / JSONL / parquet files, hub datasets, or `builtin`.

A bad row fails with the file, the row number and the field named. A row whose `repo` starts
with "." or "/" (or names a directory beside the file) is a local git repository, resolved
relative to the dataset file into `Task.repo_path`.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any, Iterable

from envs.base import Task

REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement")
_LIST_FIELDS = ("FAIL_TO_PASS", "PASS_TO_PASS")
_TASK_FIELDS = {f.name for f in fields(Task)} - {"extra", "repo_path"}
_DEFAULTS = {"log_parser": "parse_log_pytest", "eval_type": "pass_and_fail"}


class DatasetError(ValueError):
    """A dataset a user gave cannot be read; the message names the file, row and field."""


def load_tasks(source: str | Path, split: str = "test", instance_ids: Iterable[str] | None = None) -> list[Task]:
    """Tasks from `source`: "builtin", a .json/.jsonl/.parquet file, or a hub dataset name."""
    source = str(source)
    if source == "builtin":
        from envs.builtin import DATASET, ensure_repos

        ensure_repos()
        source = str(DATASET)
    path = Path(source)
    if path.suffix in (".json", ".jsonl", ".parquet"):
        if not path.is_file():
            raise DatasetError(f"{path}: no such dataset file")
        rows, base_dir, where = _read_file(path), path.resolve().parent, str(path)
    else:
        rows, base_dir, where = _read_hub(source, split), None, f"{source}[{split}]"
    tasks = [row_to_task(row, where, i, base_dir) for i, row in enumerate(rows)]
    seen: dict[str, int] = {}
    for i, task in enumerate(tasks):
        if task.instance_id in seen:
            raise DatasetError(f"{where}: row {i}: instance_id {task.instance_id!r} repeats row {seen[task.instance_id]}")
        seen[task.instance_id] = i
    if instance_ids is not None:
        wanted = list(dict.fromkeys(instance_ids))
        missing = [i for i in wanted if i not in seen]
        if missing:
            raise DatasetError(f"{where}: instance ids not in the dataset: {', '.join(missing[:10])}")
        tasks = [tasks[seen[i]] for i in wanted]
    return tasks


def _read_file(path: Path) -> list[dict[str, Any]]:
    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path).to_pylist()
        text = path.read_text()
        if path.suffix == ".jsonl":
            rows = []
            for n, line in enumerate(text.splitlines(), 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise DatasetError(f"{path}: line {n} is not JSON: {e}") from e
            return rows
        data = json.loads(text)
    except (OSError, json.JSONDecodeError) as e:
        raise DatasetError(f"{path}: cannot read: {e}") from e
    if isinstance(data, dict):  # {"instance_id": row} is accepted too
        data = list(data.values())
    if not isinstance(data, list):
        raise DatasetError(f"{path}: expected a list of rows, got {type(data).__name__}")
    return data


def _read_hub(name: str, split: str) -> list[dict[str, Any]]:
    from swebench.harness.utils import load_swebench_dataset

    try:
        return [dict(r) for r in load_swebench_dataset(name, split)]
    except Exception as e:  # network, unknown name, missing split: say which dataset
        raise DatasetError(
            f"cannot load dataset {name!r} split {split!r} from the hub or disk ({type(e).__name__}: {e}). "
            "Give a local .json/.jsonl/.parquet file, or a directory holding <split>.parquet."
        ) from e


def _as_list(value: Any, where: str, field: str) -> list[str]:
    if value is None or value == "":
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{where}: field {field!r} is not a JSON list: {value[:80]!r}") from e
    if hasattr(value, "tolist"):  # numpy arrays from parquet
        value = value.tolist()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise DatasetError(f"{where}: field {field!r} must be a list of test ids, got {str(value)[:80]!r}")
    return value


def row_to_task(row: dict[str, Any], source: str, index: int, base_dir: Path | None) -> Task:
    """One dataset row as a Task; DatasetError names `source`, the row and the field."""
    if not isinstance(row, dict):
        raise DatasetError(f"{source}: row {index} is not an object: {str(row)[:80]!r}")
    where = f"{source}: row {index}" + (f" ({row['instance_id']})" if isinstance(row.get("instance_id"), str) else "")
    for name in REQUIRED:
        value = row.get(name)
        if not isinstance(value, str) or not value.strip():
            raise DatasetError(f"{where}: field {name!r} is missing or not a non-empty string (value {value!r:.80})")
    kwargs: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in row.items():
        if key in _LIST_FIELDS:
            kwargs[key] = _as_list(value, where, key)
        elif key in _TASK_FIELDS:
            if key == "version" and isinstance(value, (int, float)):
                value = str(value)  # some exports store "3.0" as a number
            if value is not None and not isinstance(value, str):
                raise DatasetError(f"{where}: field {key!r} must be a string, got {type(value).__name__}")
            if value is None and key in _DEFAULTS:
                value = _DEFAULTS[key]
            kwargs[key] = value if value is not None or key in ("image", "test_cmd", "eval_script") else ""
        else:
            extra[key] = value
    task = Task(**kwargs, extra=extra)
    task.repo_path = _local_repo(task.repo, base_dir, where)
    return task


def _local_repo(repo: str, base_dir: Path | None, where: str) -> str | None:
    explicit = repo.startswith((".", "/", "~"))
    path = Path(repo).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if not explicit and not path.is_dir():
        return None  # an "owner/name" repository, provided by the task's image
    if not (path / ".git").exists():
        raise DatasetError(f"{where}: field 'repo' = {repo!r} -> {path} is not a git repository")
    return str(path.resolve())
