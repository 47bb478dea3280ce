"""R2E-style rows: R2E-Gym (and the sets made with its pipeline, such as SWE-Next).

Their harness grades differently from swebench's: the task's tests are hidden files the
image brings (`r2e_tests/`), run by the image's `run_tests.sh` (pytest -rA over them), and
the verdict compares the parsed log with the row's `expected_output_json`, the statuses the
fixed commit gave (envs/log_parsers.py).

- **r2e-gym** (`R2E-Gym/R2E-Gym-Subset`, `-Lite`, `-V1`): image `docker_image`, the
  repository at /testbed at the fix's parent commit, its venv at /testbed/.venv, tests at
  /r2e_tests and `run_tests.sh` in /testbed. As upstream's newest runtime, the tests and the
  script move to /root before the agent starts, and the tests are linked into /testbed only
  while they run. The tree the image holds is kept as it is (it carries compatibility edits).
  Every test must end as expected (`expected_exact`); a test key drops its file
  (`TestX.test_a`). There is no gold patch column: it is rebuilt from `parsed_commit_content`,
  its non-test Python files, as upstream does.
- **swe-next** (`TIGER-Lab/SWE-Next`): SWE-bench-style columns beside R2E's; /testbed is
  a link to /workspace (the image's entry point makes it: here the setup does), the venv is
  /workspace/.venv, `r2e_tests/` and `run_tests.sh` sit in the workspace, and the image has no
  git history (the setup makes one). Every test expected PASSED must pass
  (`expected_passed`); keys keep `::` (`TestX::test_a`).
"""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path, PurePosixPath
from typing import Any

from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT

from envs.base import Task
from taskdata.rows import DatasetError, as_list, require

R2E_REQUIRED = ("repo_name", "docker_image", "commit_hash", "problem_statement", "expected_output_json",
                "parsed_commit_content")
NEXT_REQUIRED = ("instance_id", "repo", "base_commit", "problem_statement", "docker_image", "expected_output_json")
LAYOUTS = {
    "r2e-gym": {"datasets": ("r2e-gym/r2e-gym",), "required": R2E_REQUIRED},
    "swe-next": {"datasets": ("tiger-lab/swe-next",), "required": NEXT_REQUIRED},
}
# what the images hold beside the repository that the agent must not see or commit
HIDDEN = ("r2e_tests", "run_tests.sh", "parsed_commit.json", "modified_files.json", "modified_entities.json",
          "syn_issue.json", "expected_test_output.json", "execution_result.json")
SWE_NEXT_TEST_CMD = ("PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' "
                     ".venv/bin/python -W ignore -m pytest -rA r2e_tests")
_ISSUE = re.compile(r"\[ISSUE\](.*?)\[/ISSUE\]", re.S)


def detect(layout: str, row: dict[str, Any]) -> bool:
    if layout == "r2e-gym":
        return all(row.get(f) for f in ("repo_name", "docker_image", "expected_output_json", "parsed_commit_content"))
    return all(row.get(f) for f in NEXT_REQUIRED)


def _json(row: dict[str, Any], field: str, where: str) -> Any:
    value = row.get(field)
    if isinstance(value, (dict, list)):
        return value
    try:
        return json.loads(value)
    except (TypeError, json.JSONDecodeError) as e:
        raise DatasetError(f"{where}: field {field!r} is not JSON: {str(value)[:80]!r}") from e


def _expected(row: dict[str, Any], where: str) -> dict[str, str]:
    expected = _json(row, "expected_output_json", where)
    if not isinstance(expected, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in expected.items()):
        raise DatasetError(f"{where}: field 'expected_output_json' must map test names to statuses")
    return expected


def is_test_path(path: str) -> bool:
    """R2E-Gym's rule: `test_*` or `*_test.py` files, or files under a test(s) directory."""
    p = PurePosixPath(path)
    return p.name.startswith("test_") or p.name.endswith("_test.py") or \
        any(part in ("test", "tests", "Test", "Tests") for part in p.parts[:-1])


def gold_patch(commit: dict[str, Any]) -> str:
    """The fix's non-test Python files as a git patch, from `parsed_commit_content`'s old and
    new file contents."""
    out = []
    for fd in commit.get("file_diffs", []):
        path = ((fd.get("header") or {}).get("file") or {}).get("path") \
            or (fd.get("plus_file") or {}).get("path") or (fd.get("minus_file") or {}).get("path")
        if not path or fd.get("is_binary_file") or not path.endswith(".py") or is_test_path(path):
            continue
        old, new = fd.get("old_file_content") or "", fd.get("new_file_content") or ""
        created, deleted = not fd.get("minus_file") and not old, not fd.get("plus_file") and not new
        body = list(difflib.unified_diff(_lines(old), _lines(new), "/dev/null" if created else f"a/{path}",
                                         "/dev/null" if deleted else f"b/{path}"))
        if body:
            mode = "new file mode 100644\n" if created else "deleted file mode 100644\n" if deleted else ""
            out.append(f"diff --git a/{path} b/{path}\n{mode}" + "".join(body))
    return "".join(out)


def _lines(text: str) -> list[str]:
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n\\ No newline at end of file\n"
    return lines


def _hide(workdir: str) -> str:
    """Move what the agent must not see to /root (R2E-Gym's runtime does the same)."""
    moves = [f"if [ -e {workdir}/{name} ]; then rm -rf /root/{name}; mv {workdir}/{name} /root/{name}; fi"
             for name in HIDDEN]
    return "\n".join(moves)


def _eval_script(workdir: str, test_cmd: str) -> str:
    """The hidden tests linked in only while they run, between swebench's markers."""
    return "\n".join([
        f"cd {workdir}",
        f"rm -rf {workdir}/r2e_tests && ln -s /root/r2e_tests {workdir}/r2e_tests",
        f": '{START_TEST_OUTPUT}'",
        test_cmd,
        f": '{END_TEST_OUTPUT}'",
        f"rm -f {workdir}/r2e_tests",
    ]) + "\n"


def to_task(layout: str, row: dict[str, Any], where: str, base_dir: Path | None) -> Task:
    wd = "/testbed"
    exclude = "printf '%s\\n' .venv/ " + " ".join(HIDDEN) + " >> .git/info/exclude"
    if layout == "r2e-gym":
        require(row, R2E_REQUIRED, where)
        commit = _json(row, "parsed_commit_content", where)
        if not isinstance(commit, dict):
            raise DatasetError(f"{where}: field 'parsed_commit_content' must be a JSON object")
        statement = _ISSUE.search(row["problem_statement"])
        setup = "\n".join([
            "set -e", f"cd {wd}",
            "if [ -d .venv ]; then ln -sfn $PWD/.venv /root/.venv; fi",
            "if [ -d /r2e_tests ]; then rm -rf /root/r2e_tests; mv /r2e_tests /root/r2e_tests; fi",
            _hide(wd),
            "find . /root/r2e_tests -name '*.pyc' -delete 2>/dev/null || true",
            "mkdir -p .git/info", exclude,
        ])
        return Task(
            instance_id=row.get("instance_id") or f"{row['repo_name']}__{row['commit_hash']}",
            repo=row["repo_name"], base_commit=commit.get("old_commit_hash") or "",
            problem_statement=(statement.group(1) if statement else row["problem_statement"]).strip(),
            patch=gold_patch(commit), image=row["docker_image"], layout=layout, setup_script=setup,
            eval_script=_eval_script(wd, "bash /root/run_tests.sh"), log_parser="parse_log_r2e_gym",
            eval_type="expected_exact", expected_output=_expected(row, where),
            extra={k: row[k] for k in ("commit_hash", "modified_files", "relevant_files") if k in row},
        )
    require(row, NEXT_REQUIRED, where)
    setup = "\n".join([
        "set -e",
        # the image's entry point links /testbed to /workspace; a sandbox's own command skips it
        f"if [ -d /workspace ] && [ ! -L {wd} ]; then cd /; rm -rf {wd}; ln -s /workspace {wd}; fi",
        f"cd {wd}",
        _hide(wd),
        "if [ ! -d .git ]; then git init -q; fi",  # the images have no history: the start is made here
        "mkdir -p .git/info", exclude,
    ])
    return Task(
        instance_id=row["instance_id"], repo=row["repo"], base_commit=row["base_commit"],
        problem_statement=row["problem_statement"], patch=row.get("patch") or "", test_patch=row.get("test_patch") or "",
        FAIL_TO_PASS=as_list(row.get("FAIL_TO_PASS"), where, "FAIL_TO_PASS"),
        PASS_TO_PASS=as_list(row.get("PASS_TO_PASS"), where, "PASS_TO_PASS"),
        image=row["docker_image"], layout=layout, setup_script=setup,
        eval_script=_eval_script(wd, SWE_NEXT_TEST_CMD),
        log_parser="parse_log_swe_next", eval_type="expected_passed", expected_output=_expected(row, where),
        extra={k: row[k] for k in ("commit_hash",) if k in row},
    )
