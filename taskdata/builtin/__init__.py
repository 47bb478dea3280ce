"""The built-in SWE task suite: bugs injected by `taskgen.smith` into five small pure-Python
projects whose sources are committed under `sources/`.

`DATASET` (tasks.jsonl) names each task's repository as `./repos/<project>`; those git
repositories are not committed but rebuilt by `ensure_repos()`: an initial commit of
`sources/<project>` and, per task, its buggy base commit (the gold patch applied in reverse),
all with fixed author, committer and dates, so every hash equals the one in the dataset.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from taskgen.git import bug_message, commit_tree, git

ROOT = Path(__file__).resolve().parent
SOURCES = ROOT / "sources"
REPOS = ROOT / "repos"
DATASET = ROOT / "tasks.jsonl"
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", "*.egg-info", ".git")
_STAMP = "sao-builtin-stamp"  # in .git/: what the repository was built from, for the fast path

# How `python -m taskdata.builtin --regenerate` makes the suite: mutate only the package, a seed each.
PROJECTS: dict[str, dict] = {
    "inflection": {"src_dirs": ("inflection",), "version": "0.5.1"},
    "isodate": {"src_dirs": ("isodate",), "version": "0.7.2"},
    "more_itertools": {"src_dirs": ("more_itertools",), "version": "11.2.1"},
    "tabulate": {"src_dirs": ("tabulate",), "version": "0.10.0"},
    "toolz": {"src_dirs": ("toolz",), "version": "1.2.0"},
}


def project_of(instance_id: str) -> str:
    return instance_id.split("__", 1)[0]


def read_rows(dataset: Path = DATASET) -> list[dict]:
    """The dataset's rows as dicts (none when the file does not exist yet)."""
    if not dataset.exists():
        return []
    return [json.loads(line) for line in dataset.read_text().splitlines() if line.strip()]


def ensure_repos(force: bool = False, root: Path = REPOS, dataset: Path = DATASET,
                 on_project: Callable[[str], None] | None = None) -> Path:
    """Build (or check) `root/<project>` for every folder of `sources/`; returns `root`.
    A repository already built from the same sources and rows is left alone unless `force`.
    Raises RuntimeError when a task's base commit cannot be reproduced."""
    rows = read_rows(dataset)
    known = {p.name for p in SOURCES.iterdir() if p.is_dir()}
    stray = sorted({project_of(r["instance_id"]) for r in rows} - known)
    if stray:
        raise RuntimeError(f"{dataset}: tasks of {stray} have no sources under {SOURCES}")
    for project in sorted(known):
        if on_project:
            on_project(project)
        build_repo(project, [r for r in rows if project_of(r["instance_id"]) == project], root / project, force)
    return root


def sources_digest(project: str) -> str:
    """A hash of the files `build_repo` commits for `project` (names and bytes)."""
    h = hashlib.sha1()
    src = SOURCES / project
    for path in sorted(p for p in src.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                       and p.suffix != ".pyc"):
        h.update(path.relative_to(src).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def build_repo(project: str, rows: list[dict], dest: Path, force: bool = False) -> str:
    """Make `dest` a git repository of `sources/<project>` with one `refs/tasks/<id>` per row;
    returns the initial commit. Idempotent: a matching earlier build is kept as it is."""
    stamp = json.dumps([sources_digest(project), sorted((r["instance_id"], r["base_commit"]) for r in rows)])
    stamp_file = dest / ".git" / _STAMP
    if not force and stamp_file.exists() and stamp_file.read_text() == stamp:
        return git(dest, "rev-parse", "HEAD").strip()
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(SOURCES / project, dest, ignore=_IGNORE)
    git(dest, "init", "-q", "-b", "main")
    git(dest, "-c", "core.excludesFile=/dev/null", "add", "-A")
    initial = commit_tree(dest, git(dest, "write-tree").strip(), None, f"{project}: sources of the SAO built-in suite")
    git(dest, "update-ref", "refs/heads/main", initial)
    for row in rows:
        _rebuild_task(dest, initial, row)
    stamp_file.write_text(stamp)
    return initial


def _rebuild_task(repo: Path, initial: str, row: dict) -> None:
    """Re-create one task's buggy commit: the gold patch reversed on the initial commit."""
    iid = row["instance_id"]
    with tempfile.TemporaryDirectory() as tmp:
        index = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git(repo, "read-tree", initial, env=index)
        try:
            git(repo, "apply", "--cached", "-R", "-", input=row["patch"], env=index)
        except RuntimeError as e:
            raise RuntimeError(f"{DATASET.name}: task {iid}: its gold patch does not reverse onto "
                               f"sources/{project_of(iid)} ({e}); regenerate the suite") from e
        tree = git(repo, "write-tree", env=index).strip()
    commit = commit_tree(repo, tree, initial, bug_message(iid))
    if commit != row["base_commit"]:
        raise RuntimeError(
            f"{DATASET.name}: task {iid}: rebuilt base commit {commit[:12]} != base_commit {row['base_commit'][:12]}; "
            f"sources/{project_of(iid)} changed since the suite was made (run `python -m taskdata.builtin --regenerate`)"
        )
    git(repo, "update-ref", f"refs/tasks/{iid}", commit)
