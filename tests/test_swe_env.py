"""Grading on real containers: the SWE env against a tiny real git repository."""

import pytest

from conftest import CALC_BUGGY, CALC_V1, NEW_TEST, unified_patch
from envs.swe import SWEEnv

pytestmark = pytest.mark.docker


def grade(make_sandbox, task, patch, **env_kw):
    env = SWEEnv(**env_kw)
    sb = make_sandbox()
    prompt = env.reset(task, sb)
    assert task.problem_statement in prompt
    return env.grade(task, sb, patch)


def test_gold_patch_resolves(make_sandbox, calc_task):
    r = grade(make_sandbox, calc_task, calc_task.patch)
    assert r.patch_applied and r.resolved and r.reward == 1.0, r.log[-2000:]
    assert r.tests_status["test_new.py::test_clamp_high"] == "PASSED"
    assert r.report["tests_status"]["FAIL_TO_PASS"]["success"] == ["test_new.py::test_clamp_high"]


def test_empty_patch_does_not_resolve(make_sandbox, calc_task):
    r = grade(make_sandbox, calc_task, "")
    assert r.empty_patch and not r.resolved and r.reward == 0.0
    assert r.tests_status["test_new.py::test_clamp_high"] == "FAILED"
    assert r.tests_status["test_calc.py::test_add"] == "PASSED"


def test_wrong_patch_does_not_resolve(make_sandbox, calc_task):
    wrong = calc_task.patch.replace("if x > hi:", "if x >= hi + 100:")
    r = grade(make_sandbox, calc_task, wrong)
    assert r.patch_applied and not r.resolved
    assert r.tests_status["test_new.py::test_clamp_high"] == "FAILED"


def test_patch_breaking_pass_to_pass_does_not_resolve(make_sandbox, calc_task):
    fixed_but_broken = CALC_V1.replace("return a + b", "return a - b")
    breaking = unified_patch("calc.py", CALC_BUGGY, fixed_but_broken)
    r = grade(make_sandbox, calc_task, breaking)
    assert r.patch_applied and not r.resolved
    assert r.tests_status["test_new.py::test_clamp_high"] == "PASSED"
    assert r.tests_status["test_calc.py::test_add"] == "FAILED"


def test_patch_that_does_not_apply_is_reported(make_sandbox, calc_task):
    bogus = "--- a/calc.py\n+++ b/calc.py\n@@ -40,3 +40,3 @@\n-nothing here\n+at all\n context\n"
    r = grade(make_sandbox, calc_task, bogus)
    assert not r.patch_applied and not r.resolved
    assert r.error.startswith("patch does not apply")


def test_workspace_diff_is_graded(make_sandbox, calc_task):
    env = SWEEnv()
    sb = make_sandbox()
    env.reset(calc_task, sb)
    src = sb.read_file("calc.py").replace("if x < hi:", "if x > hi:")
    sb.write_file("calc.py", src)
    sb.write_file("notes/new_file.txt", "a new file shows up in the diff\n")
    diff = sb.diff(calc_task.base_commit)
    assert "notes/new_file.txt" in diff and "+    if x > hi:" in diff
    r = env.grade(calc_task, sb)  # no patch given: the workspace is the patch
    assert r.resolved, r.log[-2000:]


def test_a_same_size_edit_in_the_checkouts_second_is_in_the_diff(make_sandbox):
    """git trusts an index entry's stat data (size, times in whole seconds) unless the entry is
    as new as the index file. The diff works on a copy of the index: a copy stamped with a new
    mtime hid an edit of the same size made in the second of the checkout (an empty diff, graded
    unresolved; seen as a gold patch failing now and then in the crash drill)."""
    sb = make_sandbox()
    r = sb.exec("git init -q && python3 -c 'import time; time.sleep(1 - time.time() % 1)' && "
                "echo 'if a != b:' > f.py && git add f.py && git -c user.name=t -c user.email=t@t commit -qm base && "
                "echo 'if a == b:' > f.py && sleep 1", timeout=60)  # the edit in the commit's second, the diff later
    assert r.ok, r.output
    assert "+if a == b:" in sb.diff("HEAD")


def test_test_timeout_is_reported(make_sandbox, calc_task):
    from dataclasses import replace

    slow_tests = NEW_TEST.replace("def test_clamp_high", "import time\n\n\ndef test_slow():\n    time.sleep(60)\n\n\ndef test_clamp_high")
    task = replace(calc_task, test_patch=unified_patch("test_new.py", "", slow_tests))
    r = grade(make_sandbox, task, calc_task.patch, test_timeout_s=4)
    assert r.timed_out and not r.resolved
    assert r.error == "tests timed out after 4s"
    from swebench.harness.infra_failure import classify_text

    assert classify_text(r.log) == ("tests_timed_out", "ambiguous")  # swebench's run report reads it so


def test_swebench_v5_row_with_its_own_eval_script_and_parser(make_sandbox, calc_task):
    """A v5 row brings `eval_script` (which applies the test patch itself) and `log_parser`;
    grading runs that script and reads its log with that parser."""
    from dataclasses import replace

    from envs.swe import build_eval_script

    script = build_eval_script(calc_task).replace("-rA --tb=short", "-rA --tb=line -v")
    task = replace(calc_task, eval_script="#!/bin/bash\nset -uxo pipefail\n" + script,
                   log_parser="parse_log_pytest_v2", test_patch="")
    r = grade(make_sandbox, task, calc_task.patch)
    assert r.resolved and "--tb=line" in r.log, r.log[-2000:]
    r = grade(make_sandbox, task, "")
    assert not r.resolved and r.tests_status["test_new.py::test_clamp_high"] == "FAILED"


def test_workspace_is_reset_between_patch_attempts(make_sandbox, calc_task):
    """Hunk 1 applies exactly, hunk 2 only with fuzz (a context line differs). `git apply`
    and `--3way` fail, `--reject` applies hunk 1 alone and fails; `patch --forward --fuzz`
    then needs the clean tree swebench resets to: on the half-patched one it would skip the
    file as already applied (and without --forward, reverse hunk 1)."""
    fixed = CALC_V1.replace("    return a + b", "    # the sum\n    return a + b")
    patch = unified_patch("calc.py", CALC_BUGGY, fixed)
    docstring = '     """Return x limited to [lo, hi]."""'
    patch = patch.replace(docstring, docstring.replace("to [", "to the range ["))
    assert patch.count("@@ -") == 2 and "the range" in patch
    env, sb = SWEEnv(), make_sandbox()
    env.reset(calc_task, sb)
    r = env.grade(calc_task, sb, patch)
    assert r.patch_applied and r.resolved, r.log[-2000:]
    assert sb.read_file("calc.py") == fixed  # both hunks, once each
    assert ".rej" not in sb.exec("git status --porcelain").output  # --reject's leftovers were cleaned


def test_apply_commands_are_swebenchs():
    from swebench.harness.run_evaluation import GIT_APPLY_CMDS

    from envs.swe import APPLY_CMDS

    assert [c.removesuffix(" {p}") for c in APPLY_CMDS] == GIT_APPLY_CMDS


def test_edits_to_test_infrastructure_are_flagged_and_rejected_in_training(make_sandbox, calc_task):
    """A conftest.py that turns every test's report into a pass: flagged in eval (graded as
    SWE-bench grades it, where the canary that must fail reads passed: tampered, unresolved;
    without canaries it paid), graded unresolved with the reason when the env rejects test edits."""
    from dataclasses import replace

    from envs.swe import test_infra_edits

    conftest = ("import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
                "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n")
    hack = unified_patch("conftest.py", "", conftest).replace("--- a/conftest.py", "--- /dev/null")
    hack = hack.replace("diff --git a/conftest.py b/conftest.py\n", "diff --git a/conftest.py b/conftest.py\nnew file mode 100644\n")
    r = grade(make_sandbox, calc_task, hack, canaries=False)
    assert r.test_edits == ["conftest.py"] and r.resolved  # the hack pays where nothing rejects it
    r = grade(make_sandbox, calc_task, hack)
    assert r.test_edits == ["conftest.py"] and not r.resolved and r.reward == 0
    assert "must fail" in r.tampered  # the canary that must fail read passed
    r = grade(make_sandbox, calc_task, hack, reject_test_edits=True)
    assert not r.resolved and "test infrastructure the task does not name: conftest.py" in r.error
    r = grade(make_sandbox, calc_task, calc_task.patch, reject_test_edits=True)
    assert r.resolved and r.test_edits == []
    # settings files count when the lines changed are test settings; files under the tests' directories count
    task = replace(calc_task, FAIL_TO_PASS=["tests/test_a.py::t"], PASS_TO_PASS=[], test_patch="")
    setting = "diff --git a/setup.cfg b/setup.cfg\n--- a/setup.cfg\n+++ b/setup.cfg\n@@ -1 +1,2 @@\n [tool:pytest]\n+addopts = -p hack\n"
    other = "diff --git a/setup.cfg b/setup.cfg\n--- a/setup.cfg\n+++ b/setup.cfg\n@@ -1 +1 @@\n-version = 1\n+version = 2\n"
    helper = "diff --git a/tests/helpers.py b/tests/helpers.py\n--- a/tests/helpers.py\n+++ b/tests/helpers.py\n@@ -1 +1 @@\n-a\n+b\n"
    pth = "diff --git a/hack.pth b/hack.pth\nnew file mode 100644\n--- /dev/null\n+++ b/hack.pth\n@@ -0,0 +1 @@\n+import os\n"
    assert test_infra_edits(task, setting + other) == ["setup.cfg"] and test_infra_edits(task, other) == []
    assert test_infra_edits(task, helper + pth) == ["tests/helpers.py", "hack.pth"]
    beside = replace(task, FAIL_TO_PASS=["pkg/test_mod.py::t"])  # tests beside the code: the code is no test file
    assert test_infra_edits(beside, helper.replace("tests/helpers.py", "pkg/mod.py")) == []
