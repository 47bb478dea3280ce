"""Images laid out as the dataset families' own images are, built locally (no registry is
reachable here) from one small repository, `acme/shapes`, with fixed commits: the rows in
tests/data/*.jsonl name these commits and images.

- SWE-smith (`jyangballin/swesmith.x86_64.acme_1776_shapes.<commit8>`): /testbed is the
  mirror's clone, `main` one "Initial commit"; the branch of one instance holds "Bug Patch" and
  "Remove F2P Tests"; the other instance has no branch baked in (an image built before it).
- R2E-Gym (`namanjain12/shapes_final:<fix>`): /testbed at the fix's parent with its history,
  a venv at /testbed/.venv, `run_tests.sh` in /testbed, the hidden tests at /r2e_tests, and an
  uncommitted compatibility edit in the tree.
- SWE-Next (`lllqaq/acme_shapes-final:<fix>`): /workspace (no /testbed, no git history)
  with `.venv`, `r2e_tests/` and `run_tests.sh` inside.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from sandbox.docker import DEFAULT_IMAGE, client

AREA = '''def square(side):
    return side * side


def rect(width, height):
    return width * height


def triangle(base, height):
    return base * height / 2
'''
TEST_AREA = '''from shapes.area import rect, square, triangle


def test_square():
    assert square(3) == 9


def test_rect():
    assert rect(2, 5) == 10


def test_triangle():
    assert triangle(4, 3) == 6
'''
TEST_OTHER = '''from shapes.area import square


def test_square_of_zero():
    assert square(0) == 0
'''
# R2E: the fix's commit edits rect; its hidden test file (the fix's edited tests)
R2E_BUG = AREA.replace("return width * height", "return width + height")
R2E_TESTS = '''from shapes.area import rect, square


class TestRect:
    def test_rect(self):
        assert rect(2, 5) == 10

    def test_rect_unit(self):
        assert rect(1, 1) == 1


def test_square():
    assert square(3) == 9


def test_known_broken():
    assert square(2) == 5
'''
R2E_RUN_TESTS = ("PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' "
                 ".venv/bin/python -W ignore -m pytest -rA r2e_tests\n")
SMITH_IMAGE = "jyangballin/swesmith.x86_64.acme_1776_shapes.{commit8}"
R2E_IMAGE = "namanjain12/shapes_final:{fix}"
NEXT_IMAGE = "lllqaq/acme_shapes-final:{fix}"
_ENV = {"GIT_AUTHOR_NAME": "acme", "GIT_AUTHOR_EMAIL": "dev@acme.test", "GIT_COMMITTER_NAME": "acme",
        "GIT_COMMITTER_EMAIL": "dev@acme.test", "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z",
        "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_SYSTEM": "/dev/null"}


def git(repo: Path, *args: str, input: str | None = None, name: str = "acme") -> str:
    env = {**os.environ, **_ENV, "GIT_AUTHOR_NAME": name, "GIT_COMMITTER_NAME": name}
    return subprocess.run(["git", "-C", str(repo), *args], input=input, env=env, check=True,
                          capture_output=True, text=True).stdout.strip()


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def shapes_repo(root: Path, area: str = AREA) -> Path:
    """The clean repository, one commit on `main`."""
    root.mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    _write(root, {"README.md": "# shapes\n", "shapes/__init__.py": "", "shapes/area.py": area,
                  "tests/test_area.py": TEST_AREA, "tests/test_other.py": TEST_OTHER})
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "Initial commit")
    return root


def smith_commit() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        return git(shapes_repo(Path(tmp) / "r"), "rev-parse", "HEAD")


def r2e_commits() -> tuple[str, str]:
    """(the fix's parent, the fix) of the R2E repository."""
    with tempfile.TemporaryDirectory() as tmp:
        repo = _r2e_repo(Path(tmp) / "r")
        return git(repo, "rev-parse", "HEAD~1"), git(repo, "rev-parse", "HEAD")


def _r2e_repo(root: Path) -> Path:
    repo = shapes_repo(root, R2E_BUG)
    _write(repo, {"shapes/area.py": AREA, "tests/test_area.py": TEST_AREA + "\n\ndef test_rect_unit():\n"
                  "    assert rect(1, 1) == 1\n"})
    git(repo, "commit", "-qam", "Fix rect")
    return repo


def _build(context: Path, tag: str, dockerfile: str) -> str:
    (context / "Dockerfile").write_text(dockerfile)
    client().images.build(path=str(context), tag=tag, rm=True, forcerm=True)
    return tag


def _have(tag: str) -> bool:
    try:
        client().images.get(tag)
        return True
    except Exception:
        return False


def smith_image(branch_instance: str, bug_patch: str, f2p_files: list[str]) -> str:
    """The SWE-smith image; `branch_instance` has its branch (Bug Patch, Remove F2P Tests)."""
    tag = SMITH_IMAGE.format(commit8=smith_commit()[:8])
    if _have(tag):
        return tag
    with tempfile.TemporaryDirectory() as tmp:
        repo = shapes_repo(Path(tmp) / "testbed")
        git(repo, "checkout", "-q", "-b", branch_instance)
        git(repo, "apply", "-", input=bug_patch)
        git(repo, "commit", "-qam", "Bug Patch", name="swesmith")
        git(repo, "rm", "-q", *f2p_files)
        git(repo, "commit", "-qm", "Remove F2P Tests", name="swesmith")
        git(repo, "checkout", "-q", "main")
        # swesmith's images install the package into their environment; PYTHONPATH stands for that
        return _build(Path(tmp), tag, f"FROM {DEFAULT_IMAGE}\nCOPY testbed /testbed\nENV PYTHONPATH=/testbed\n"
                                      "WORKDIR /testbed\n")


def r2e_image() -> str:
    _, fix = r2e_commits()
    tag = R2E_IMAGE.format(fix=fix)
    if _have(tag):
        return tag
    with tempfile.TemporaryDirectory() as tmp:
        repo = _r2e_repo(Path(tmp) / "testbed")
        git(repo, "checkout", "-q", "HEAD~1")  # the parent, the fix reachable in the history
        (repo / "README.md").write_text("# shapes\n(compat edit)\n")  # the images' trees are not clean
        (repo / "run_tests.sh").write_text(R2E_RUN_TESTS)
        _write(Path(tmp), {"r2e_tests/test_1.py": R2E_TESTS, "r2e_tests/__init__.py": ""})
        return _build(Path(tmp), tag, f"FROM {DEFAULT_IMAGE}\nCOPY testbed /testbed\nCOPY r2e_tests /r2e_tests\n"
                                      "RUN python3 -m venv --without-pip --system-site-packages /testbed/.venv\nWORKDIR /testbed\n")


def swe_next_image() -> str:
    _, fix = r2e_commits()
    tag = NEXT_IMAGE.format(fix=fix)
    if _have(tag):
        return tag
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp) / "workspace"
        _write(ws, {"README.md": "# shapes\n", "shapes/__init__.py": "", "shapes/area.py": R2E_BUG,
                    "tests/test_area.py": TEST_AREA, "tests/test_other.py": TEST_OTHER,
                    "r2e_tests/test_1.py": R2E_TESTS, "r2e_tests/__init__.py": "", "run_tests.sh": R2E_RUN_TESTS})
        shutil.rmtree(ws / ".git", ignore_errors=True)
        return _build(Path(tmp), tag, f"FROM {DEFAULT_IMAGE}\nCOPY workspace /workspace\n"
                                      "RUN python3 -m venv --without-pip --system-site-packages /env/.venv && "
                                      "ln -s /env/.venv /workspace/.venv\n")
