"""Each dataset family's rows (tests/data/*.jsonl, shaped as their dataset cards publish them):
loaded, mapped to their images, workspace setup, test commands and parsers; three families
graded end to end in images laid out as theirs are (tests/family_images.py)."""

import json
import subprocess
from pathlib import Path

import pytest

from taskdata.__main__ import main
from taskdata.load import decontaminated, layout_for, load_tasks
from taskdata.rows import DatasetError
from envs.log_parsers import expected_verdict, parse_log_r2e_gym, parse_log_swe_next

DATA = Path(__file__).parent / "data"


def one(name, **kw):
    return load_tasks(DATA / name, **kw)


def test_swe_bench_rows_keep_swebench_conventions():
    astropy, django = one("swe_bench_verified.jsonl")
    assert astropy.layout == "swe-bench" and astropy.image == "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest"
    assert astropy.FAIL_TO_PASS[0].endswith("test_separable[compound_model6-result6]")  # a JSON string in the row
    script = astropy.eval_script
    assert "conda activate testbed" in script and "git apply --verbose - <<" in script
    assert "pytest -rA astropy/modeling/tests/test_separable.py" in script  # the test patch's files
    assert script.index("Start Test Output") < script.index("pytest -rA") < script.index("End Test Output")
    assert django.image == "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"


def test_swe_gym_rows_use_their_images_and_their_harness_commands():
    dask, mypy = one("swe_gym.jsonl", layout="swe-gym")
    assert dask.image == "xingyaoww/sweb.eval.x86_64.dask_s_dask-7656:latest"
    assert "pytest -n0 -rA  --color=no dask/tests/test_delayed.py" in dask.eval_script
    assert mypy.image == "xingyaoww/sweb.eval.x86_64.python_s_mypy-11126:latest"
    assert 'pytest -rA -k "testNewTypeFromForwardNamedTuple or testSelfTypeOverrideCompatibility"' in mypy.eval_script
    assert layout_for("SWE-Gym/SWE-Gym", [], "x") == "swe-gym"


def test_swe_rebench_rows_bring_their_command_parser_and_image():
    (task,) = one("swe_rebench.jsonl")  # detected by its install_config
    assert task.layout == "swe-rebench" and task.image == "swerebench/sweb.eval.x86_64.encode_1776_starlette-1147:latest"
    assert ("LANG=C.UTF-8 LC_ALL=C.UTF-8 pytest --no-header -rA --tb=line --color=no -p no:cacheprovider "
            "-W ignore::DeprecationWarning tests/middleware/test_session.py") in task.eval_script
    run = task.eval_script.split("Start Test Output")[1].split("End Test Output")[0]
    assert "test_session.py" in run and "cookies.json" not in run  # data files are no directives
    assert task.log_parser == "parse_log_pytest" and task.extra["meta"]["has_test_patch"]


def test_swe_smith_rows_map_to_branch_setup_reversed_patch_and_profile():
    rect, square = one("swe_smith.jsonl")
    assert rect.layout == "swe-smith" and rect.image == "jyangballin/swesmith.x86_64.acme_1776_shapes.20f1ae27"
    assert rect.extra["upstream"] == "acme/shapes" and rect.extra["commit"] == "20f1ae27"
    assert "-    return width + height\n+    return width * height" in rect.patch  # the bug patch, reversed
    assert "git checkout -q -f acme__shapes.20f1ae27.func_pm_op_change__k3v9x2ab" in rect.setup_script
    assert "pytest --disable-warnings --color=no --tb=no --verbose" in rect.eval_script
    assert rect.log_parser.startswith("parse_log_smith_")
    (go,) = one("swe_smith_go.jsonl", layout="swe-smith-go")
    assert "go test -v ./..." in go.eval_script and go.extra["language"] == "go"
    assert layout_for("SWE-bench/SWE-smith", [], "x") == "swe-smith"
    assert layout_for("SWE-bench/SWE-smith-rs", [], "x") == "swe-smith-rs"


def test_r2e_rows_rebuild_the_gold_patch_and_hide_their_tests():
    (r2e,) = one("r2e_gym.jsonl")
    assert r2e.layout == "r2e-gym" and r2e.eval_type == "expected_exact"
    assert r2e.problem_statement.startswith("**Title:**") and "[ISSUE]" not in r2e.problem_statement
    assert "expert software engineer" not in r2e.problem_statement  # the generation prompt holds the gold patch
    assert "shapes/area.py" in r2e.patch and "tests/test_area.py" not in r2e.patch  # non-test files only
    assert "mv /r2e_tests /root/r2e_tests" in r2e.setup_script and "bash /root/run_tests.sh" in r2e.eval_script
    (nxt,) = one("swe_next.jsonl")
    assert nxt.layout == "swe-next" and nxt.eval_type == "expected_passed"
    assert "ln -s /workspace /testbed" in nxt.setup_script and "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1" in nxt.eval_script


def test_r2e_parsers_and_verdicts():
    log = ("== short test summary info ==\nPASSED r2e_tests/test_1.py::TestRect::test_rect\n"
           "FAILED r2e_tests/test_1.py::test_known_broken - assert 4 == 5\nERROR r2e_tests/test_2.py::test_x\n")
    assert parse_log_r2e_gym(log) == {"TestRect.test_rect": "PASSED", "test_known_broken": "FAILED", "test_x": "ERROR"}
    assert parse_log_swe_next(log) == {"TestRect::test_rect": "PASSED", "test_known_broken": "FAILED", "test_x": "ERROR"}
    assert parse_log_r2e_gym("no summary here\nPASSED a.py::t\n") == {}
    expected = {"a": "PASSED", "b": "FAILED"}
    assert expected_verdict("expected_exact", expected, {"a": "PASSED", "b": "FAILED"})[0]
    assert not expected_verdict("expected_exact", expected, {"a": "PASSED", "b": "PASSED"})[0]  # b must still fail
    assert not expected_verdict("expected_exact", expected, {"a": "PASSED", "b": "FAILED", "c": "PASSED"})[0]
    assert expected_verdict("expected_passed", expected, {"a": "PASSED", "b": "PASSED"})[0]  # b is free
    assert not expected_verdict("expected_passed", expected, {"b": "FAILED"})[0]
    assert not expected_verdict("expected_passed", {}, {})[0]  # nothing expected is no pass


def test_an_unknown_layout_names_the_row_the_fields_and_the_layouts(tmp_path):
    path = tmp_path / "odd.jsonl"
    path.write_text(json.dumps({"id": "x-1", "question": "?"}) + "\n")
    with pytest.raises(DatasetError, match=r"odd\.jsonl: row 0 is in no known layout .*r2e-gym need\(s\) repo_name.*"
                                           r"swe-smith, swe-smith-go, .* need\(s\) instance_id, repo, patch, image_name"):
        load_tasks(path)
    with pytest.raises(DatasetError, match="unknown layout 'nope'; known layouts: r2e-gym, swe-next, swe-smith"):
        load_tasks(path, layout="nope")
    rows = [json.loads(line) for line in (DATA / "swe_smith.jsonl").read_text().splitlines()]
    rows[1].pop("image_name")
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(DatasetError, match=r"row 1 \(acme__shapes.*\): field 'image_name' is missing"):
        load_tasks(path)
    assert [t.instance_id for t in load_tasks(path, skip_bad_rows=True)] == [rows[0]["instance_id"]]


def test_decontamination_drops_eval_ids_and_repos_at_eval_commits(tmp_path):
    rows = [json.loads(line) for line in (DATA / "swe_gym.jsonl").read_text().splitlines()]
    rows.append({**rows[0], "instance_id": "astropy__astropy-99999", "repo": "astropy/astropy",
                 "base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607"})  # Verified's repo at Verified's commit
    rows.append({**rows[0], "instance_id": "django__django-11099"})  # Verified's id
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    tasks = load_tasks(path, layout="swe-gym", decontaminate=str(DATA / "swe_bench_verified.jsonl"))
    assert [t.instance_id for t in tasks] == ["dask__dask-7656", "python__mypy-11126"]
    # swesmith names its snapshot by 8 hex digits: a prefix of Verified's commit in the same repository
    smith = one("swe_smith.jsonl")
    smith[0].extra.update(upstream="astropy/astropy", commit="d16bfe05")
    kept, dropped = decontaminated(smith, str(DATA / "swe_bench_verified.jsonl"))
    assert [t.instance_id for t in dropped] == [smith[0].instance_id] and kept == smith[1:]
    with pytest.raises(DatasetError, match="cannot load the eval set .* decontaminate=null"):
        load_tasks(path, layout="swe-gym", decontaminate=str(tmp_path / "missing.jsonl"))


def test_check_reports_rows_images_and_repositories(tmp_path, capsys):
    rows = (DATA / "swe_smith.jsonl").read_text() + json.dumps({"instance_id": "broken", "repo": "swesmith/x__y.1"}) + "\n"
    (tmp_path / "mix.jsonl").write_text(rows)
    rc = main(["--dataset", str(tmp_path / "mix.jsonl"), "--check"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "layout swe-smith, 3 rows, 2 mapped, 1 cannot be" in err and "row 2 (broken): field 'patch'" in err
    assert "swesmith/acme__shapes.20f1ae27" in err and "rows per repository" in err
    assert "images: 1 distinct" in err
    assert main(["--dataset", str(DATA / "r2e_gym.jsonl"), "--layout", "nope", "--check"]) == 2


# ---- end to end, in images laid out as each family's ----

def _grade(task, patch, image):
    from conftest import RUN_ID
    from envs.swe import SWEEnv
    from sandbox.docker import DockerSandbox

    env = SWEEnv(test_timeout_s=120)
    assert env.image_for(task) == image
    sb = DockerSandbox(image, run_id=RUN_ID)
    try:
        env.reset(task, sb)
        seen = sb.exec("ls -A /testbed /testbed/tests 2>&1; ls /r2e_tests 2>&1", timeout=30).output
        return env.grade(task, sb, patch), seen
    finally:
        sb.close()


@pytest.mark.docker
def test_swe_smith_graded_as_swesmith_does(docker_client):
    from tests.family_images import smith_image

    rect, square = one("swe_smith.jsonl")
    image = smith_image(rect.instance_id, rect.extra["bug_patch"], ["tests/test_area.py"])
    for task in (rect, square):  # the branch baked in; none (the setup lays it out itself)
        gold, seen = _grade(task, task.patch, image)
        assert gold.resolved, (task.instance_id, gold.error, gold.log[-3000:])
        assert "test_area.py" not in seen and "test_other.py" in seen  # the F2P file hidden from the agent
        assert gold.tests_status[task.FAIL_TO_PASS[0]] == "PASSED"
        empty, _ = _grade(task, "", image)
        assert not empty.resolved and empty.tests_status[task.FAIL_TO_PASS[0]] == "FAILED"
    # a fix that also rewrites the hidden test to pass: the test file is checked out again
    cheat = rect.patch + ("diff --git a/tests/test_area.py b/tests/test_area.py\nnew file mode 100644\n--- /dev/null\n"
                          "+++ b/tests/test_area.py\n@@ -0,0 +1,2 @@\n+def test_rect():\n+    pass\n")
    wrong = rect.patch.replace("+    return width * height", "+    return width * height + 1")
    for patch in (wrong, cheat.replace("+    return width * height", "+    return width + height")):
        result, _ = _grade(rect, patch, image)
        assert not result.resolved, result.log[-2000:]


@pytest.mark.docker
def test_r2e_gym_and_swe_next_graded_against_their_expected_output(docker_client):
    from tests.family_images import r2e_image, swe_next_image

    (r2e,) = one("r2e_gym.jsonl")
    (nxt,) = one("swe_next.jsonl")
    # makes the known-broken test pass too: not what the fixed commit gave (R2E-Gym), free in SWE-Next
    overfix = nxt.patch + ("diff --git a/shapes/area.py b/shapes/area.py\n--- a/shapes/area.py\n+++ b/shapes/area.py\n"
                           "@@ -1,2 +1,2 @@\n def square(side):\n-    return side * side\n+    return 5 if side == 2 else side * side\n")
    wrong = nxt.patch.replace("+    return width * height", "+    return width * height if width > 1 else 0")
    for task, image in ((r2e, r2e_image()), (nxt, swe_next_image())):
        gold, seen = _grade(task, task.patch, image)
        assert gold.resolved, (task.instance_id, gold.error, gold.report, gold.log[-3000:])
        assert "r2e_tests" not in seen.split("/r2e_tests")[0] and "run_tests.sh" not in seen  # hidden
        empty, _ = _grade(task, "", image)
        assert not empty.resolved and empty.report["tests_status"]["mismatched"]
        bad, _ = _grade(task, wrong, image)
        assert not bad.resolved
        over, _ = _grade(task, overfix, image)
        assert over.resolved == (task.layout == "swe-next"), over.report
    # the image's uncommitted compatibility edit stays in the tree the agent starts from
    from conftest import RUN_ID
    from envs.swe import SWEEnv
    from sandbox.docker import DockerSandbox

    sb = DockerSandbox(r2e.image, run_id=RUN_ID)
    try:
        SWEEnv().reset(r2e, sb)
        assert "(compat edit)" in sb.exec("cat README.md", timeout=30).output
        assert SWEEnv().grade(r2e, sb).empty_patch
    finally:
        sb.close()


@pytest.mark.docker
def test_eval_grades_swe_smith_gold_predictions(tmp_path, docker_client):
    """`python -m eval.swebench --predictions gold` on SWE-smith rows: both resolve (the gold
    patch is the bug patch reversed, graded in a fresh sandbox from the task's start)."""
    import sys

    from tests.family_images import smith_image

    rect, _ = one("swe_smith.jsonl")
    smith_image(rect.instance_id, rect.extra["bug_patch"], ["tests/test_area.py"])
    r = subprocess.run([sys.executable, "-m", "eval.swebench", "--dataset", str(DATA / "swe_smith.jsonl"),
                        "--predictions", "gold", "--output", str(tmp_path / "out")],
                       cwd=Path(__file__).parent.parent, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["resolved_instances"] == 2, report
