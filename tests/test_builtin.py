"""The built-in suite: its repositories rebuild with the dataset's exact hashes anywhere, its
rows are well formed, and one task per project grades right on real containers."""

import json
from collections import Counter

import pytest

from conftest import git
from taskdata.builtin import DATASET, REPOS, SOURCES, ensure_repos, project_of, read_rows
from taskdata.load import load_tasks
from envs.swe import SWEEnv

ROWS = read_rows()


def test_suite_is_large_spread_and_unique():
    ids = [r["instance_id"] for r in ROWS]
    per_project = Counter(project_of(i) for i in ids)
    assert len(ids) >= 30 and len(set(ids)) == len(ids)
    assert len(per_project) >= 3 and min(per_project.values()) >= 5, per_project
    assert set(per_project) <= {p.name for p in SOURCES.iterdir() if p.is_dir()}


def test_rows_are_swe_bench_rows():
    for r in ROWS:
        project = project_of(r["instance_id"])
        f2p, p2p = json.loads(r["FAIL_TO_PASS"]), json.loads(r["PASS_TO_PASS"])
        assert 1 <= len(f2p) <= 25 and p2p and not set(f2p) & set(p2p)
        assert r["repo"] == f"./repos/{project}" and r["test_patch"] == "" and len(r["base_commit"]) == 40
        edited = [ln[6:] for ln in r["patch"].splitlines() if ln.startswith("--- a/")]
        assert len(edited) == 1 and edited[0] not in r["problem_statement"]
        assert "Failing tests:" in r["problem_statement"] and f2p[0] in r["problem_statement"]


def test_repos_rebuild_with_identical_hashes(tmp_path):
    root = ensure_repos(root=tmp_path / "repos")
    again = ensure_repos(root=tmp_path / "again", force=True)
    for r in ROWS:
        repo = root / project_of(r["instance_id"])
        assert git(repo, "rev-parse", f"refs/tasks/{r['instance_id']}").strip() == r["base_commit"]
        # a bug commit sits right on the initial commit and differs from it by the gold patch only
        assert git(repo, "rev-parse", f"{r['base_commit']}^").strip() == git(repo, "rev-parse", "HEAD").strip()
    for project in {project_of(r["instance_id"]) for r in ROWS}:
        assert git(root / project, "rev-parse", "HEAD") == git(again / project, "rev-parse", "HEAD")
        assert git(root / project, "status", "--porcelain") == ""


def test_ensure_repos_is_fast_when_built():
    import time

    ensure_repos()
    start = time.monotonic()
    assert ensure_repos() == REPOS
    assert time.monotonic() - start < 2.0


@pytest.mark.docker
def test_gold_resolves_and_empty_does_not_one_task_per_project(make_sandbox):
    ensure_repos()
    tasks = load_tasks(DATASET)
    first = {}
    for t in tasks:
        first.setdefault(project_of(t.instance_id), t)
    env = SWEEnv()
    for project, task in sorted(first.items()):
        sb = make_sandbox()
        env.reset(task, sb)
        gold = env.grade(task, sb, task.patch)
        assert gold.resolved, (task.instance_id, gold.error, gold.log[-2000:])
        empty = env.grade(task, sb, "")
        assert not empty.resolved and empty.tests_status[task.FAIL_TO_PASS[0]] in ("FAILED", "ERROR")
        sb.close()
