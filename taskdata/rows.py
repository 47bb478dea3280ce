"""Rows become Tasks: reading a dataset's rows (a .json / .jsonl / .parquet file or a hub
dataset) and the checks every family's adapter shares. Each `DatasetError` names the source, the
row and the field, so a user can fix the file.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any, Iterable

from envs.base import Task

LIST_FIELDS = ("FAIL_TO_PASS", "PASS_TO_PASS")
_TASK_FIELDS = {f.name for f in fields(Task)} - {"extra", "repo_path", "expected_output"}
_AS_TEXT = ("version", "created_at")  # exports store "3.0" as a number, dates as timestamps
_DEFAULTS = {"log_parser": "parse_log_pytest", "eval_type": "pass_and_fail"}
FILE_SUFFIXES = (".json", ".jsonl", ".parquet")


class DatasetError(ValueError):
    """A dataset a user gave cannot be read; the message names the file, row and field."""


def read_rows(source: str | Path, split: str = "test") -> tuple[list[dict[str, Any]], Path | None, str]:
    """The raw rows of `source`, the directory local repositories are relative to, and how to
    name the source in messages."""
    source = str(source)
    path = Path(source)
    if path.suffix in FILE_SUFFIXES:
        if not path.is_file():
            raise DatasetError(f"{path}: no such dataset file")
        return _read_file(path), path.resolve().parent, str(path)
    return _read_hub(source, split), None, f"{source}[{split}]"


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


def as_list(value: Any, where: str, field: str) -> list[str]:
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


def require(row: dict[str, Any], names: Iterable[str], where: str) -> None:
    """Each of `names` a non-empty string in `row`, else a DatasetError naming the field."""
    for name in names:
        value = row.get(name)
        if not isinstance(value, str) or not value.strip():
            raise DatasetError(f"{where}: field {name!r} is missing or not a non-empty string (value {value!r:.80})")


def row_to_task(row: dict[str, Any], where: str, base_dir: Path | None,
                required: Iterable[str] = ("instance_id", "repo", "base_commit", "problem_statement")) -> Task:
    """A SWE-bench-format row as a Task, its columns one to one (others kept in `extra`);
    DatasetError names `where` (the source and row) and the field."""
    require(row, required, where)
    kwargs: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in row.items():
        if key in LIST_FIELDS:
            kwargs[key] = as_list(value, where, key)
        elif key in _TASK_FIELDS:
            if key in _AS_TEXT and value is not None and not isinstance(value, str):
                value = str(value)
            if value is not None and not isinstance(value, str):
                raise DatasetError(f"{where}: field {key!r} must be a string, got {type(value).__name__}")
            if value is None and key in _DEFAULTS:
                value = _DEFAULTS[key]
            kwargs[key] = value if value is not None or key in ("image", "test_cmd", "eval_script", "setup_script") else ""
        else:
            extra[key] = value
    task = Task(**kwargs, extra=extra)
    task.repo_path = local_repo(task.repo, base_dir, where)
    return task


def local_repo(repo: str, base_dir: Path | None, where: str) -> str | None:
    explicit = repo.startswith((".", "/", "~"))
    path = Path(repo).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if not explicit and not path.is_dir():
        return None  # an "owner/name" repository, provided by the task's image
    if not (path / ".git").exists():
        raise DatasetError(f"{where}: field 'repo' = {repo!r} -> {path} is not a git repository")
    return str(path.resolve())
