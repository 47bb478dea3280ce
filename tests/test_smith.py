"""The SWE-smith generator: each mutation operator on small sources (exact output, the rest of
the file untouched), the problem statement, and a real end-to-end run on a tiny git repo."""

import difflib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import dedent, git
from taskdata.load import load_tasks
from taskgen.mutations import mutations, spread
from taskgen.smith import describe_failure, problem_statement
from envs.swe import SWEEnv

ROOT = Path(__file__).resolve().parents[1]


def mutate(src: str, kind: str, old: str, new: str) -> str:
    """The file after the one `kind` mutation that turns the text `old` into `new`."""
    found = [m for m in mutations("m.py", src) if m.kind == kind and src[m.start : m.end] == old and m.new == new]
    assert len(found) == 1, [(m.kind, src[m.start : m.end], m.new) for m in mutations("m.py", src)]
    return found[0].apply(src)


def changed_lines(a: str, b: str) -> list[str]:
    return [ln for ln in difflib.ndiff(a.splitlines(), b.splitlines()) if ln[:1] in "+-"]


SRC = dedent('''
    """Module docstring."""
    import os


    def f(a, b, xs):
        """Doc string."""
        if a < b and b is not None:  # keep me
            return xs[1:]
        total = a - b
        total += 3
        return total if a in xs else (a - xs[0]) - 2
''')


def test_flip_compare():
    assert mutate(SRC, "flip_compare", "<", ">=") == SRC.replace("if a < b", "if a >= b")
    assert mutate(SRC, "flip_compare", "is not", "is") == SRC.replace("b is not None", "b is None")
    assert mutate(SRC, "flip_compare", "in", "not in") == SRC.replace("a in xs", "a not in xs")
    chained = "ok = 0 <= x == y\n"
    assert mutate(chained, "flip_compare", "==", "!=") == "ok = 0 <= x != y\n"


def test_off_by_one():
    assert mutate(SRC, "off_by_one", "1", "2") == SRC.replace("xs[1:]", "xs[2:]")
    assert mutate(SRC, "off_by_one", "1", "0") == SRC.replace("xs[1:]", "xs[0:]")
    assert mutate("n = range(0x10)\n", "off_by_one", "0x10", "17") == "n = range(17)\n"


def test_swap_operands_keeps_precedence():
    assert mutate(SRC, "swap_operands", "a - b", "b - a") == SRC.replace("total = a - b", "total = b - a")
    # the left operand is itself a subtraction: it is parenthesised where it lands
    assert mutate(SRC, "swap_operands", "a - xs[0]) - 2", "2) - (a - xs[0])") == SRC.replace(
        "(a - xs[0]) - 2", "(2) - (a - xs[0])")
    assert mutate("y = x / (n + 1)\n", "swap_operands", "x / (n + 1", "(n + 1) / (x") == "y = (n + 1) / (x)\n"
    assert not [m for m in mutations("m.py", 'msg = "%s!" % name\n') if m.kind == "swap_operands"]


def test_drop_statement_removes_whole_lines_only():
    out = mutate(SRC, "drop_statement", "    total += 3\n", "")
    assert out == SRC.replace("    total += 3\n", "")
    dropped = {SRC[m.start : m.end] for m in mutations("m.py", SRC) if m.kind == "drop_statement"}
    assert '    """Doc string."""\n' not in dropped  # docstrings, imports and defs are never dropped
    assert not any("import" in d or "def " in d for d in dropped)
    last = {SRC[m.start : m.end] for m in mutations("m.py", SRC) if m.kind == "drop_statement"}
    assert not any(d.lstrip().startswith("return total") for d in last)  # a def's final return stays
    shared = "def g():\n    a = 1; b = 2\n    return a\n"  # a statement sharing its line stays
    assert not any("a = 1" in shared[m.start : m.end] for m in mutations("m.py", shared) if m.kind == "drop_statement")


def test_wrong_constant():
    src = 'def g(flag=True):\n    """Docs stay."""\n    return f"{flag}!" + ", ".join(["ab"])\n'
    assert mutate(src, "wrong_constant", "True", "False") == src.replace("flag=True", "flag=False")
    assert mutate(src, "wrong_constant", '", "', '","') == src.replace('", ".join', '",".join')
    assert mutate(src, "wrong_constant", '"ab"', '"a"') == src.replace('["ab"]', '["a"]')
    touched = {src[m.start : m.end] for m in mutations("m.py", src) if m.kind != "drop_statement"}
    assert '"""Docs stay."""' not in touched and not any("{flag}" in t for t in touched)


def test_and_or():
    src = "ok = a and b and (c or d)\n"
    assert mutate(src, "and_or", "and b and", "or b or") == "ok = a or b or (c or d)\n"
    assert mutate(src, "and_or", "or", "and") == "ok = a and b and (c and d)\n"


def test_offsets_are_characters_not_bytes():
    src = 'def g(a, b):\n    s = "ééé" if a < b else "ü"\n    return s\n'
    assert mutate(src, "flip_compare", "<", ">=") == src.replace("a < b", "a >= b")


def test_every_mutation_is_one_small_edit():
    for m in mutations("m.py", SRC):
        lines = changed_lines(SRC, m.apply(SRC))
        assert 1 <= len(lines) <= 4, (m, lines)  # one line changed (or one statement dropped)


def test_spread_is_seeded_and_visits_every_scope_first():
    src = "\n\n".join(f"def f{i}(a, b):\n    x = a - b\n    return x < {i}\n" for i in range(4))
    muts = mutations("m.py", src)
    assert spread(muts, 3) == spread(muts, 3) and spread(muts, 3) != spread(muts, 4)
    assert {m.scope for m in spread(muts, 3)[:4]} == {"f0", "f1", "f2", "f3"}


LOG = dedent('''
    =================================== FAILURES ===================================
    ___________________________ TestCalc.test_clamp[12] ____________________________
    tests/test_calc.py:9: in test_clamp
        assert clamp(12, 0, 10) == 10
    calc/core.py:7: in clamp
        if x < hi:
    E   assert 12 == 10
    E    +  where 12 = <function clamp at 0x7f3a9c01>(12, 0, 10) != <calc.Box ....x7f2750fc4790>
    ----------------------------- Captured stdout call -----------------------------
    got 12
    =========================== short test summary info ============================
    FAILED tests/test_calc.py::TestCalc::test_clamp[12] - assert 12 == 10
''')


def test_problem_statement_shows_the_failure_but_not_the_bug():
    text = problem_statement(["tests/test_calc.py::TestCalc::test_clamp[12]"], 5, LOG, "calc/core.py")
    assert "tests/test_calc.py::TestCalc::test_clamp[12]" in text and "5 tests" in text
    assert "assert clamp(12, 0, 10) == 10" in text and "E   assert 12 == 10" in text and "got 12" in text
    assert "calc/core.py" not in text and "if x < hi" not in text and "7f3a9c" not in text and "x7f27" not in text
    assert describe_failure([], "x.py") == []


# -- end to end, on real containers ------------------------------------------------------------
MODULE = dedent('''
    def clamp(x, lo, hi):
        """x limited to [lo, hi]."""
        if x < lo:
            return lo
        if x > hi:
            return hi
        return x


    def mean(xs):
        return sum(xs) / len(xs)
''')
TESTS = dedent('''
    from calc import clamp, mean


    def test_clamp_low():
        assert clamp(-5, 0, 10) == 0


    def test_clamp_high():
        assert clamp(50, 0, 10) == 10


    def test_clamp_inside():
        assert clamp(5, 0, 10) == 5


    def test_mean():
        assert mean([1, 2, 6]) == 3
''')


@pytest.mark.docker
def test_generator_end_to_end(tmp_path, docker_client, make_sandbox):
    repo = tmp_path / "data" / "repos" / "calc"
    repo.mkdir(parents=True)
    (repo / "calc.py").write_text(MODULE)
    (repo / "test_calc.py").write_text(TESTS)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "calc")
    out = tmp_path / "data" / "tasks.jsonl"
    cmd = [sys.executable, "-m", "taskgen.smith", "--repo", str(repo), "--out", str(out), "--max-tasks", "2",
           "--workers", "1", "--seed", "1"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 and all(row["repo"] == "./repos/calc" and row["test_patch"] == "" for row in rows)
    tasks = load_tasks(out)
    env = SWEEnv()
    for task in tasks:
        assert task.FAIL_TO_PASS and task.PASS_TO_PASS and task.instance_id.startswith("calc__smith-")
        assert not re.search(r"(?<!test_)calc\.py", task.problem_statement)  # the buggy file is never named
        assert task.patch.startswith("diff --git a/calc.py b/calc.py")
        assert git(repo, "rev-parse", f"refs/tasks/{task.instance_id}").strip() == task.base_commit
        sb = make_sandbox()
        env.reset(task, sb)
        assert env.grade(task, sb, task.patch).resolved
        assert not env.grade(task, sb, "").resolved
