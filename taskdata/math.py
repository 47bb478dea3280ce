"""Math problems as Tasks: the benchmarks' hub datasets by name, local files, or a built-in set.

A row needs a problem and its answer; an id is optional (the row's number stands in). The
field names vary by dataset and map onto one schema:

    id       id | problem_id | problem_idx | Problem ID | unique_id    (MathArena: problem_idx)
    problem  problem | question | Problem                                (IMO-AnswerBench: Problem)
    answer   answer | Short Answer | final_answer                       (IMO-AnswerBench: Short Answer)

`source` is a benchmark's short name (`BENCHMARKS`), a hub dataset name (loaded through
`datasets`, from its cache when the hub cannot be reached), a .json/.jsonl/.parquet file, or
`builtin`: generated problems with exact answers (arithmetic, fractions, modular powers,
divisor counts, root sets, intervals, surds), the same for the same seed, each with the Python
that computes its answer (envs/math_problems.py). A bad row fails with
the source, the row and the field named.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from envs.base import Task
from envs.math_problems import BUILTIN_N, make_math_tasks
from taskdata.rows import DatasetError, read_rows

ID_FIELDS = ("id", "problem_id", "problem_idx", "Problem ID", "unique_id")
PROBLEM_FIELDS = ("problem", "question", "Problem")
ANSWER_FIELDS = ("answer", "Short Answer", "final_answer")


@dataclass(frozen=True)
class Benchmark:
    hub: str  # the hub dataset
    split: str | None  # None: its only split
    runs: int  # the paper's protocol: Pass@1 averaged over this many runs
    title: str


# The paper's math benchmarks (Pass@1 at temperature 1.0, top-p 1.0: 16 runs, 4 for BeyondAIME).
BENCHMARKS = {
    "aime25": Benchmark("MathArena/aime_2025", "train", 16, "AIME 2025"),
    "beyondaime": Benchmark("ByteDance-Seed/BeyondAIME", None, 4, "BeyondAIME"),
    "hmmt_nov25": Benchmark("MathArena/hmmt_nov_2025", "train", 16, "HMMT November 2025"),
    "imo_answerbench": Benchmark("Hwilner/imo-answerbench", "train", 16, "IMO-AnswerBench"),
}


def benchmark(source: str) -> Benchmark | None:
    """The benchmark `source` names, by short name or hub name."""
    return BENCHMARKS.get(source) or next((b for b in BENCHMARKS.values() if b.hub == source), None)


def load_math_tasks(source: str | Path = "builtin", split: str | None = None, ids: Iterable[str] | None = None,
                    limit: int | None = None) -> list[Task]:
    """The tasks of `source` (module docstring), those named by `ids` (in their order) or the
    first `limit`; a DatasetError names the source, the row and the field of a bad row."""
    source = str(source)
    if source == "builtin" or source.startswith("builtin:"):
        seed = source.partition(":")[2]
        if seed and not seed.lstrip("-").isdigit():
            raise DatasetError(f"{source}: the built-in set's seed must be a whole number (builtin:SEED)")
        tasks = make_math_tasks(BUILTIN_N, seed=int(seed or 0))
    else:
        rows, where = _rows(source, split)
        tasks = rows_to_tasks(rows, where, name=_name(source))
    return _select(tasks, ids, limit, source)


def rows_to_tasks(rows: list[Any], where: str, name: str) -> list[Task]:
    tasks, seen = [], {}
    for i, row in enumerate(rows):
        task = row_to_task(row, f"{where}: row {i}", i, name)
        if task.instance_id in seen:
            raise DatasetError(f"{where}: row {i}: id {task.instance_id!r} repeats row {seen[task.instance_id]}")
        seen[task.instance_id] = i
        tasks.append(task)
    if not tasks:
        raise DatasetError(f"{where}: no rows")
    return tasks


def row_to_task(row: Any, where: str, index: int, name: str) -> Task:
    """One row as a Task (the answer in `extra["answer"]`, other columns kept in `extra`)."""
    if not isinstance(row, dict):
        raise DatasetError(f"{where}: not an object but {type(row).__name__} {str(row)[:80]!r}")
    id_field = _field(row, ID_FIELDS)
    problem_field = _field(row, PROBLEM_FIELDS)
    answer_field = _field(row, ANSWER_FIELDS)
    fields = ", ".join(sorted(map(str, row)))[:300]
    if problem_field is None:
        raise DatasetError(f"{where}: no problem field (one of {', '.join(PROBLEM_FIELDS)}; the row has {fields})")
    if answer_field is None:
        raise DatasetError(f"{where}: no answer field (one of {', '.join(ANSWER_FIELDS)}; the row has {fields})")
    problem, answer = row[problem_field], row[answer_field]
    if not isinstance(problem, str) or not problem.strip():
        raise DatasetError(f"{where}: field {problem_field!r} must be a non-empty string, got {problem!r:.80}")
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)) or not str(answer).strip():
        raise DatasetError(f"{where}: field {answer_field!r} must be a non-empty string or a number, "
                           f"got {answer!r:.80}")
    iid = row[id_field] if id_field is not None else f"{name}-{index}"
    if isinstance(iid, bool) or not isinstance(iid, (str, int)) or not str(iid).strip():
        raise DatasetError(f"{where}: field {id_field!r} must be a non-empty string or a whole number, got {iid!r:.80}")
    extra = {k: v for k, v in row.items() if k not in (id_field, problem_field, answer_field)}
    return Task(instance_id=str(iid), repo=name, base_commit="-", problem_statement=problem.strip(),
                extra={**extra, "answer": str(answer).strip()})


def _field(row: dict, names: tuple[str, ...]) -> str | None:
    return next((n for n in names if n in row and row[n] is not None), None)


def _name(source: str) -> str:
    b = benchmark(source)
    return b.hub if b else (Path(source).stem if Path(source).suffix else source)


def _rows(source: str, split: str | None) -> tuple[list[Any], str]:
    if Path(source).suffix in (".json", ".jsonl", ".parquet"):
        rows, _, where = read_rows(source)
        return rows, where
    b = benchmark(source)
    name, split = (b.hub, split or b.split) if b else (source, split)
    what = f"{b.title} ({name})" if b else name
    return _hub_rows(name, split, what), f"{name}[{split or 'its only split'}]"


def _hub_rows(name: str, split: str | None, what: str) -> list[dict[str, Any]]:
    """The rows of a hub dataset through `datasets` (its cache when the hub is out of reach)."""
    try:
        import datasets

        loaded = datasets.load_dataset(name)
    except Exception as e:  # network, unknown name: say which dataset and what to do
        raise DatasetError(
            f"cannot load the math dataset {what} from the hub or its cache ({type(e).__name__}: {str(e)[:300]}). "
            "Load it once where the hub is reachable (it is cached), or give a local .json/.jsonl/.parquet file "
            "with the fields id, problem (or question) and answer."
        ) from e
    splits = list(loaded)
    if split is None and len(splits) == 1:
        split = splits[0]
    if split not in loaded:
        raise DatasetError(f"math dataset {what}: no split {split!r} (it has {', '.join(splits)}); pass --split")
    return [dict(r) for r in loaded[split]]


def _select(tasks: list[Task], ids: Iterable[str] | None, limit: int | None, source: str) -> list[Task]:
    if ids is not None:
        by_id = {t.instance_id: t for t in tasks}
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise DatasetError(f"{source}: ids not in the dataset: {', '.join(missing[:10])}")
        tasks = [by_id[i] for i in ids]
    if limit is not None:
        tasks = tasks[:limit]
    return tasks
