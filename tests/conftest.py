"""Shared fixtures: the Docker engine check, a leak check, and a tiny real git repo task."""

from __future__ import annotations

import os
import subprocess
import textwrap
import uuid
from pathlib import Path

import pytest

RUN_ID = f"pytest-{uuid.uuid4().hex[:8]}"
os.environ.setdefault("SAO_TEST_RUN_ID", RUN_ID)
# No hub at test time: set before anything imports huggingface_hub (it reads these once), so a
# lookup that must fail fails at once instead of after the network's retries (20 s and more),
# in this process and in every run the tests start.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

_GIT_ENV = {
    "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
    "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z",
}


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, **_GIT_ENV}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout


@pytest.fixture(scope="session")
def docker_client():
    """The real engine, or a failure that says how to start it (tests never fake it)."""
    from sandbox.docker import client
    from sandbox.images import ensure_base_image

    c = client()
    ensure_base_image()
    return c


@pytest.fixture(scope="session", autouse=True)
def no_leftover_containers():
    """After the whole session, no sandbox container of this test run may remain."""
    yield
    try:
        from sandbox.docker import LABEL, client

        c = client()
    except Exception:
        return
    left = c.containers.list(all=True, filters={"label": [f"{LABEL}=1", f"sao.run_id={RUN_ID}"]}, sparse=True)
    for ct in left:
        c.api.remove_container(ct.id, force=True)
    assert not left, f"{len(left)} sandbox container(s) left after the test session"


CALC_V1 = '''\
def add(a, b):
    return a + b


def clamp(x, lo, hi):
    """Return x limited to [lo, hi]."""
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x
'''
CALC_BUGGY = CALC_V1.replace("if x > hi:", "if x < hi:")
TESTS = '''\
from calc import add, clamp


def test_add():
    assert add(2, 3) == 5


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5
'''
NEW_TEST = '''\
from calc import clamp


def test_clamp_high():
    assert clamp(12, 0, 10) == 10


def test_clamp_low():
    assert clamp(-1, 0, 10) == 0
'''


def _diff(repo: Path, path: str, new: str) -> str:
    """The patch that turns the committed `path` into `new` (left uncommitted: restored after)."""
    old = (repo / path).read_text() if (repo / path).exists() else None
    (repo / path).write_text(new)
    if old is None:
        git(repo, "add", "-N", path)
    out = git(repo, "diff", "--", path)
    if old is None:
        git(repo, "rm", "-q", "--cached", path)
        (repo / path).unlink()
    else:
        (repo / path).write_text(old)
    return out


@pytest.fixture(scope="session")
def calc_task(tmp_path_factory):
    """A real SWE-style task: a git repo whose `clamp` has a bug, a gold patch, and a test
    patch that adds the tests which catch it (FAIL_TO_PASS) beside ones that pass (PASS_TO_PASS)."""
    from envs.base import Task

    repo = tmp_path_factory.mktemp("calc") / "calc"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "calc.py").write_text(CALC_BUGGY)
    (repo / "test_calc.py").write_text(TESTS)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "calc with a bug")
    base = git(repo, "rev-parse", "HEAD").strip()
    gold = _diff(repo, "calc.py", CALC_V1)
    test_patch = _diff(repo, "test_new.py", NEW_TEST)
    return Task(
        instance_id="calc__calc-1",
        repo=str(repo),
        repo_path=str(repo),
        base_commit=base,
        problem_statement="clamp(12, 0, 10) returns 12; it should return 10.",
        patch=gold,
        test_patch=test_patch,
        FAIL_TO_PASS=["test_new.py::test_clamp_high"],
        PASS_TO_PASS=["test_new.py::test_clamp_low", "test_calc.py::test_add", "test_calc.py::test_clamp_inside"],
    )


def dedent(s: str) -> str:
    return textwrap.dedent(s).lstrip("\n")


@pytest.fixture
def make_sandbox(docker_client):
    """Open real sandboxes labelled with this test run; all are closed at the end of the test."""
    from sandbox.base import Limits
    from sandbox.docker import DockerSandbox

    opened = []

    def make(**limits):
        sb = DockerSandbox(limits=Limits(**limits), run_id=RUN_ID, docker_client=docker_client)
        opened.append(sb)
        return sb

    yield make
    for sb in opened:
        sb.close()


def unified_patch(path: str, old: str, new: str) -> str:
    """A git-style patch of one file from `old` to `new` text."""
    import difflib

    src = f"a/{path}" if old else "/dev/null"
    lines = difflib.unified_diff(old.splitlines(True), new.splitlines(True), src, f"b/{path}")
    header = f"diff --git a/{path} b/{path}\n" + ("" if old else "new file mode 100644\n")
    return header + "".join(lines)
