"""Load SWE tasks from JSON / JSONL / parquet files, hub datasets, or `builtin`.

Each dataset family that SWE agents train on publishes its rows in its own layout and grades
them with its own harness; one adapter per family (a file beside this one) maps a row to a
`Task` that lays out the workspace, runs the tests and grades as that harness does:

- `envs/data_swebench.py`: swe-bench, swe-gym, swe-rebench (SWE-bench-format rows)
- `envs/data_smith.py`: swe-smith
- `envs/data_r2e.py`: r2e-gym, swe-next

The layout is picked from the dataset's name, else detected from the first row's fields
(`layout=` forces one). A bad row fails with the file, the row number and the field named; a
row no layout can map names the fields each layout misses. A row whose `repo` starts with "."
or "/" (or names a directory beside the file) is a local git repository, resolved relative to
the dataset file into `Task.repo_path`.

    python -m envs.data --dataset NAME|FILE [--split S] [--layout L] --check

loads every row and reports the rows it cannot map, the images missing on the local Docker
engine, and the rows per repository.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from collections import Counter
from dataclasses import fields
from pathlib import Path
from types import ModuleType
from typing import Any, Iterable

from envs.base import Task

log = logging.getLogger(__name__)
_LIST_FIELDS = ("FAIL_TO_PASS", "PASS_TO_PASS")
_TASK_FIELDS = {f.name for f in fields(Task)} - {"extra", "repo_path", "expected_output"}
_AS_TEXT = ("version", "created_at")  # exports store "3.0" as a number, dates as timestamps
_DEFAULTS = {"log_parser": "parse_log_pytest", "eval_type": "pass_and_fail"}


class DatasetError(ValueError):
    """A dataset a user gave cannot be read; the message names the file, row and field."""


def layouts() -> dict[str, ModuleType]:
    """Every known layout by name, in detection order (the most specific first)."""
    from envs import data_r2e, data_smith, data_swebench

    out: dict[str, ModuleType] = {}
    for module in (data_r2e, data_smith, data_swebench):
        for name in module.LAYOUTS:
            out[name] = module
    return out


def layout_for(source: str, rows: list[dict[str, Any]], where: str, layout: str | None = None) -> str:
    """The layout `source`'s rows are in: `layout` when given, else the one the dataset's name
    belongs to, else the first whose fields the first row has."""
    known = layouts()
    if layout not in (None, "auto"):
        if layout not in known:
            raise DatasetError(f"{where}: unknown layout {layout!r}; known layouts: {', '.join(known)}")
        return layout
    if Path(source).suffix not in (".json", ".jsonl", ".parquet"):  # a hub name: its family by name
        name = source.lower()
        by_name = [(len(prefix), lay) for lay, module in known.items() for prefix in module.LAYOUTS[lay]["datasets"]
                   if name == prefix or name.startswith(prefix)]
        if by_name:
            return max(by_name)[1]  # the longest match: swe-bench/swe-smith-go, not swe-bench
    if not rows:
        return "swe-bench"
    row = rows[0]
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: row 0 is not an object: {str(row)[:80]!r}")
    for lay, module in known.items():
        if module.detect(lay, row):
            return lay
    needs: dict[str, list[str]] = {}  # what the row misses -> the layouts that need it
    for lay, m in known.items():
        absent = ", ".join(f for f in m.LAYOUTS[lay]["required"] if not row.get(f)) or "(its marker fields)"
        needs.setdefault(absent, []).append(lay)
    missing = "; ".join(f"{', '.join(lays)} need(s) {absent}" for absent, lays in needs.items())
    raise DatasetError(f"{where}: row 0 is in no known layout (fields: {', '.join(sorted(row))[:300]}). "
                       f"Known layouts and what this row misses: {missing}. Force one with layout=NAME.")


def load_tasks(source: str | Path, split: str = "test", instance_ids: Iterable[str] | None = None,
               layout: str | None = None, decontaminate: str | None = None, decontaminate_split: str = "test",
               skip_bad_rows: bool = False) -> list[Task]:
    """Tasks from `source`: "builtin", a .json/.jsonl/.parquet file, or a hub dataset name.
    `decontaminate`: an eval set (a name or file) whose instance ids, and repositories at their
    base commits, are dropped from these tasks. `skip_bad_rows`: a row no adapter can map is
    counted and said (its first few) instead of failing the load (large hub sets hold a few)."""
    where = _where(source, split)
    errors: list[str] | None = [] if skip_bad_rows else None
    tasks, _ = read_tasks(source, split, layout, errors)
    if errors:
        log.warning("%s: %d row(s) skipped that cannot be mapped; the first: %s", where, len(errors),
                    " | ".join(errors[:3]))
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
    if decontaminate:
        tasks, dropped = decontaminated(tasks, decontaminate, decontaminate_split)
        if dropped:
            log.warning("%s: %d row(s) dropped that the eval set %s holds (first: %s)", where, len(dropped),
                        decontaminate, ", ".join(t.instance_id for t in dropped[:5]))
    return tasks


def _repo_name(task: Task) -> str:
    """The repository's own name, whatever the family writes around it (owner/, swesmith's
    `owner__name.commit8`, R2E's bare name)."""
    name = task.extra.get("upstream") or task.repo
    return name.rsplit("/", 1)[-1].lower()


def _commit(task: Task) -> str:
    commit = task.extra.get("commit") or task.base_commit
    return commit.lower() if re.fullmatch(r"[0-9a-fA-F]{7,40}", commit or "") else ""


def decontaminated(tasks: list[Task], eval_set: str, split: str = "test") -> tuple[list[Task], list[Task]]:
    """`tasks` without those whose instance id, or repository at a base commit (a prefix of
    one: swesmith names 8 hex digits), the eval set holds; and the dropped ones."""
    try:
        held, _ = read_tasks(eval_set, split)
    except DatasetError as e:
        raise DatasetError(f"decontaminate={eval_set!r}: cannot load the eval set ({e}). Give a local file of it, "
                           "or decontaminate=null to train without this check.") from e
    ids = {t.instance_id for t in held}
    commits: dict[str, set[str]] = {}
    for t in held:
        if _commit(t):
            commits.setdefault(_repo_name(t), set()).add(_commit(t))
    kept, dropped = [], []
    for t in tasks:
        c = _commit(t)
        hit = t.instance_id in ids or (c and any(e.startswith(c) or c.startswith(e) for e in commits.get(_repo_name(t), ())))
        (dropped if hit else kept).append(t)
    return kept, dropped


def _where(source, split) -> str:
    source = str(source)
    return source if Path(source).suffix in (".json", ".jsonl", ".parquet") else f"{source}[{split}]"


def read_rows(source: str | Path, split: str = "test") -> tuple[list[dict[str, Any]], Path | None, str]:
    """The raw rows of `source`, the directory local repositories are relative to, and how to
    name the source in messages."""
    source = str(source)
    if source == "builtin":
        from envs.builtin import DATASET, ensure_repos

        ensure_repos()
        source = str(DATASET)
    path = Path(source)
    if path.suffix in (".json", ".jsonl", ".parquet"):
        if not path.is_file():
            raise DatasetError(f"{path}: no such dataset file")
        return _read_file(path), path.resolve().parent, str(path)
    return _read_hub(source, split), None, f"{source}[{split}]"


def read_tasks(source: str | Path, split: str = "test", layout: str | None = None,
               errors: list[str] | None = None, progress=None) -> tuple[list[Task], str]:
    """Every row of `source` as a Task, and the layout; with `errors` a list, a row that
    cannot be mapped is said there and skipped instead of raised."""
    rows, base_dir, where = read_rows(source, split)
    lay = layout_for(str(source), rows, where, layout)
    module = layouts()[lay]
    tasks = []
    for i, row in enumerate(rows):
        try:
            if not isinstance(row, dict):
                raise DatasetError(f"{where}: row {i} is not an object: {str(row)[:80]!r}")
            tasks.append(module.to_task(lay, row, _row_where(where, i, row), base_dir))
        except DatasetError as e:
            if errors is None:
                raise
            errors.append(str(e))
        if progress is not None:
            progress(i + 1, len(rows))
    return tasks, lay


def _row_where(where: str, index: int, row: dict[str, Any]) -> str:
    return f"{where}: row {index}" + (f" ({row['instance_id']})" if isinstance(row.get("instance_id"), str) else "")


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
        if key in _LIST_FIELDS:
            kwargs[key] = _as_list(value, where, key)
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


def check(source: str, split: str, layout: str | None, decontaminate: str | None, console) -> int:
    """`--check`: map every row (a progress bar), then say the rows that cannot be mapped, the
    images the local Docker engine lacks, the rows per repository; 1 when anything is amiss."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from envs.swe import SWEEnv

    errors: list[str] = []
    with Progress(TextColumn("mapping rows"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        bar = progress.add_task("rows", total=None)
        tasks, lay = read_tasks(source, split, layout, errors,
                                progress=lambda done, total: progress.update(bar, completed=done, total=total))
    where = _where(source, split)
    console.print(f"{where}: layout [bold]{lay}[/bold], {len(tasks) + len(errors)} rows, {len(tasks)} mapped, "
                  f"{len(errors)} cannot be")
    for e in errors[:20]:
        console.print(f"  [red]x[/red] {e}", soft_wrap=True, markup=False, highlight=False)
    if len(errors) > 20:
        console.print(f"  ... and {len(errors) - 20} more")
    ids = Counter(t.instance_id for t in tasks)
    repeated = [i for i, n in ids.items() if n > 1]
    if repeated:
        console.print(f"[red]{len(repeated)} instance id(s) repeat[/red]: {', '.join(repeated[:10])}")
    per_repo = Counter(t.repo for t in tasks)
    table = Table("repository", "rows", title=f"rows per repository ({len(per_repo)})")
    for repo, n in per_repo.most_common(30):
        table.add_row(repo, str(n))
    if len(per_repo) > 30:
        table.add_row(f"... {len(per_repo) - 30} more", str(sum(n for _, n in per_repo.most_common()[30:])))
    console.print(table)
    missing = _missing_images(tasks, SWEEnv(), console)
    dropped = 0
    if decontaminate:
        _, gone = decontaminated(tasks, decontaminate)
        dropped = len(gone)
        console.print(f"decontamination against {decontaminate}: {dropped} row(s) would be dropped"
                      + (f" (first: {', '.join(t.instance_id for t in gone[:5])})" if gone else ""))
    return 1 if errors or repeated or missing else 0


def _missing_images(tasks: list[Task], env, console) -> int:
    """The images the tasks run in that the local Docker engine lacks, said with how to get them."""
    import docker

    from sandbox.docker import DEFAULT_IMAGE, client

    images = Counter(env.image_for(t) for t in tasks)
    try:
        api = client()
        local = {tag for image in api.images.list() for tag in image.tags}
    except (docker.errors.DockerException, OSError) as e:
        console.print(f"[yellow]images not checked[/yellow]: no Docker engine answers ({e})")
        return 0
    absent = [i for i in images if i not in local and f"{i}:latest" not in local]
    console.print(f"images: {len(images)} distinct, {len(images) - len(absent)} on this Docker engine, {len(absent)} missing")
    for image in absent[:20]:
        how = "python -m sandbox.images" if image == DEFAULT_IMAGE else f"docker pull {image}"
        console.print(f"  [red]missing[/red] {image} ({images[image]} rows): {how}", markup=True, highlight=False)
    if len(absent) > 20:
        console.print(f"  ... and {len(absent) - 20} more")
    if absent and DEFAULT_IMAGE not in absent:
        console.print("  Pull them where a registry is reachable (or `docker save` there and `docker load` here).")
    return len(absent)


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.markup import escape

    p = argparse.ArgumentParser(prog="python -m envs.data", description="Load a SWE dataset and check it can train.")
    p.add_argument("--dataset", required=True, help="a hub name, a .json/.jsonl/.parquet file, or builtin")
    p.add_argument("--split", default="train")
    p.add_argument("--layout", default=None, help=f"force a layout (default: by the name, else the fields): "
                                                  f"{', '.join(layouts())}")
    p.add_argument("--decontaminate", default=None, help="an eval set (name or file): say how many rows it drops")
    p.add_argument("--check", action="store_true", help="map every row, find the images, count per repository")
    args = p.parse_args(argv)
    console = Console(stderr=True, soft_wrap=True)  # long ids and image names on one line each
    if not args.check:
        p.error("nothing to do: add --check")
    try:
        return check(args.dataset, args.split, args.layout, args.decontaminate, console)
    except DatasetError as e:
        console.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True)
        return 2


if __name__ == "__main__":
    # the adapters import `envs.data`: run its copy, not this `__main__` one, so errors are one class
    from envs.data import main as _main

    sys.exit(_main())
