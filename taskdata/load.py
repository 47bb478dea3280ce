"""Load SWE tasks from JSON / JSONL / parquet files, hub datasets, or `builtin`.

Each dataset family that SWE agents train on publishes its rows in its own layout and grades
them with its own harness; one adapter per family (a file beside this one) maps a row to a
`Task` that lays out the workspace, runs the tests and grades as that harness does:

- `taskdata/swebench.py`: swe-bench, swe-gym, swe-rebench (SWE-bench-format rows)
- `taskdata/smith.py`: swe-smith
- `taskdata/r2e.py`: r2e-gym, swe-next

The layout is picked from the dataset's name, else detected from the first row's fields
(`layout=` forces one). A bad row fails with the file, the row number and the field named; a
row no layout can map names the fields each layout misses. A row whose `repo` starts with "."
or "/" (or names a directory beside the file) is a local git repository, resolved relative to
the dataset file into `Task.repo_path`. `builtin` is the suite shipped in `taskdata/builtin/`
(its git repositories are built on first use).

`python -m taskdata --dataset NAME|FILE --check` (taskdata/__main__.py) checks a dataset.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from types import ModuleType
from typing import Any, Iterable

from envs.base import Task
from taskdata import builtin, r2e, smith, swebench
from taskdata.rows import FILE_SUFFIXES, DatasetError, read_rows

log = logging.getLogger(__name__)
ADAPTERS = (r2e, smith, swebench)  # in detection order: the most specific first


def layouts() -> dict[str, ModuleType]:
    """Every known layout by name, in detection order (the most specific first)."""
    out: dict[str, ModuleType] = {}
    for module in ADAPTERS:
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
    if Path(source).suffix not in FILE_SUFFIXES:  # a hub name: its family by name
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
    where = where_of(source, split)
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


def where_of(source, split) -> str:
    source = str(source)
    return source if Path(source).suffix in FILE_SUFFIXES else f"{source}[{split}]"


def read_tasks(source: str | Path, split: str = "test", layout: str | None = None,
               errors: list[str] | None = None, progress=None) -> tuple[list[Task], str]:
    """Every row of `source` as a Task, and the layout; with `errors` a list, a row that
    cannot be mapped is said there and skipped instead of raised."""
    if str(source) == "builtin":
        builtin.ensure_repos()
        source = builtin.DATASET
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


def load_builtin_tasks(instance_ids: Iterable[str] | None = None) -> list[Task]:
    """The built-in suite as Tasks (its repositories built first, when they are not yet)."""
    return load_tasks("builtin", instance_ids=instance_ids)
