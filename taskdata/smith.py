"""SWE-smith rows (`SWE-bench/SWE-smith`, and `-py`, `-go`, `-rs`, `-js`, `-ts`, `-java`,
`-cpp`, `-php`): bugs made by rewriting a repository, graded as swesmith's harness does.

A row has no base commit and no test patch. Its `patch` *introduces* the bug (the fix is its
reverse), and `image_name` is one image per repository snapshot (`repo` =
`swesmith/<owner>__<repo>.<commit8>`), the repository at /testbed on `main`. In the mirror a
branch named after the instance holds `Bug Patch` and then `Remove F2P Tests` (the files of
the failing tests deleted), and the agent starts at its head. For grading, swesmith goes back
to the bug commit, applies the model's patch, checks the F2P and P2P test files out again
(edits to them are discarded) and runs the repository's test command (`taskdata/smith_profiles.py`,
a profile per repository: the whole suite, or only the tests' files for some) between
swebench's markers; every F2P and P2P test must pass.

Here the setup checks out the instance's branch when the image has it (swesmith rebuilt its
images with the branches); offline, without it, it does what the branch holds: the bug patch
applied on `main` and committed (the tests' state, `refs/sao/tests`), then the F2P test files
removed. The tests are restored from `refs/sao/tests`.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT

from taskdata import smith_profiles
from envs.base import Task
from taskdata.rows import as_list, require

REQUIRED = ("instance_id", "repo", "patch", "image_name", "problem_statement")
_LANGS = {"py": "python", "go": "go", "rs": "rust", "js": "javascript", "ts": "typescript", "java": "java",
          "cpp": "cpp", "c": "c", "php": "php"}
LAYOUTS = {"swe-smith": {"datasets": ("swe-bench/swe-smith", "swe-bench/swe-smith-py"), "required": REQUIRED}}
LAYOUTS.update({f"swe-smith-{suffix}": {"datasets": (f"swe-bench/swe-smith-{suffix}",), "required": REQUIRED}
                for suffix in _LANGS if suffix != "py"})
TESTS_REF = "refs/sao/tests"
TEST_FILES = "/root/.sao_test_files"  # the F2P and P2P tests' files, restored before the tests run
_HEREDOC = "EOF_SAO_SMITH_9d2e"


def detect(layout: str, row: dict[str, Any]) -> bool:
    """A row with an image and no base commit, from the swesmith mirrors (Python unless the
    dataset's name says another language)."""
    return layout == "swe-smith" and bool(row.get("image_name")) and not row.get("base_commit") \
        and str(row.get("repo", "")).startswith("swesmith/")


def repo_key(row: dict[str, Any]) -> str:
    """`owner__repo.commit8`, from `repo` (the mirror) or else the instance id."""
    repo = row.get("repo") or ""
    return repo.split("/", 1)[1] if repo.startswith("swesmith/") else row["instance_id"].rsplit(".", 1)[0]


def upstream(key: str) -> tuple[str, str]:
    """`owner__repo.commit8` -> ("owner/repo", "commit8"); repository names may hold dots."""
    name, commit = key.rsplit(".", 1)
    return name.replace("__", "/", 1), commit


def reverse_patch(patch: str) -> str:
    """The patch that undoes `patch` (swesmith's gold: its bug patch applied in reverse)."""
    out = []
    for line in patch.splitlines(keepends=True):
        if line.startswith("diff --git "):
            m = re.match(r"diff --git a/(\S+) b/(\S+)", line)
            line = f"diff --git a/{m.group(2)} b/{m.group(1)}\n" if m else line
        elif line.startswith("--- "):
            line = "+++ " + (line[4:] if line[4:].startswith("/dev/null") else "b/" + line[6:])
        elif line.startswith("+++ "):
            line = "--- " + (line[4:] if line[4:].startswith("/dev/null") else "a/" + line[6:])
        elif line.startswith("new file mode"):
            line = line.replace("new file mode", "deleted file mode", 1)
        elif line.startswith("deleted file mode"):
            line = line.replace("deleted file mode", "new file mode", 1)
        elif line.startswith("index "):
            m = re.match(r"index (\w+)\.\.(\w+)(.*)", line, re.S)
            line = f"index {m.group(2)}..{m.group(1)}{m.group(3)}" if m else line
        elif line.startswith("@@"):
            m = re.match(r"@@ -(\S+) \+(\S+) @@(.*)", line, re.S)
            line = f"@@ -{m.group(2)} +{m.group(1)} @@{m.group(3)}" if m else line
        elif line.startswith("+"):
            line = "-" + line[1:]
        elif line.startswith("-"):
            line = "+" + line[1:]
        out.append(line)
    # headers come as ---/+++ pairs: swapped in place they now read +++ then ---; in each run of
    # changed lines the removed ones go first again, as diff writes them
    text = re.sub(r"(?m)^(\+\+\+ .*\n)(--- .*\n)", r"\2\1", "".join(out))
    return re.sub(r"(?m)(?:^[+-](?![+-]{2} ).*\n)+", _removed_first, text)


def _removed_first(run: re.Match) -> str:
    lines = run.group(0).splitlines(keepends=True)
    return "".join([line for line in lines if line[0] == "-"] + [line for line in lines if line[0] == "+"])


def language(layout: str) -> str:
    return _LANGS[layout.rsplit("-", 1)[1]] if layout != "swe-smith" else "python"


def to_task(layout: str, row: dict[str, Any], where: str, base_dir: Path | None) -> Task:
    require(row, REQUIRED, where)
    iid, lang = row["instance_id"], language(layout)
    key = repo_key(row)
    owner_repo, commit8 = upstream(key)
    f2p = as_list(row.get("FAIL_TO_PASS"), where, "FAIL_TO_PASS")
    p2p = as_list(row.get("PASS_TO_PASS"), where, "PASS_TO_PASS")
    _, parser, timeout_s = smith_profiles.profile_for(owner_repo, lang)
    test_cmd = smith_profiles.eval_test_cmd(owner_repo, lang, f2p, p2p)
    branch = shlex.quote(iid)
    setup = "\n".join([
        "set -e", "cd /testbed",
        f"if git rev-parse -q --verify {branch} >/dev/null || git rev-parse -q --verify origin/{branch} >/dev/null; then",
        f"  git checkout -q -f {branch} 2>/dev/null || git checkout -q -f -b {branch} origin/{branch}",
        "  git clean -fdq",
        f"  if [ \"$(git log -1 --format=%s)\" = 'Remove F2P Tests' ]; then git update-ref {TESTS_REF} HEAD~1;"
        f" else git update-ref {TESTS_REF} HEAD; fi",
        "else",  # the image without the branch: what the branch holds, made here
        "  git checkout -q -f HEAD && git clean -fdq",
        f"  git apply - <<'{_HEREDOC}'", row["patch"].rstrip("\n"), _HEREDOC,
        "  git add -A && GIT_AUTHOR_DATE='2000-01-01T00:00:00Z' GIT_COMMITTER_DATE='2000-01-01T00:00:00Z' "
        "git -c user.name=swesmith -c user.email=swesmith@swesmith.ai commit -q --no-verify -m 'Bug Patch'",
        f"  git update-ref {TESTS_REF} HEAD",
        f"  ( {smith_profiles.test_files_script(lang, f2p, owner_repo)} ) | while read -r f; do rm -f -- \"$f\"; done",
        "fi",
        f"( {smith_profiles.test_files_script(lang, f2p + p2p, owner_repo)} ) > {TEST_FILES}",
    ])
    eval_script = "\n".join([
        "cd /testbed",
        # swesmith's guard: the tests' files as the task made them, whatever the patch did to them
        f"while read -r f; do git checkout {TESTS_REF} -- \"$f\" 2>/dev/null || true; done < {TEST_FILES}",
        f": '{START_TEST_OUTPUT}'", test_cmd, f": '{END_TEST_OUTPUT}'",
    ]) + "\n"
    return Task(
        instance_id=iid, repo=row["repo"], base_commit=iid, problem_statement=row["problem_statement"],
        patch=reverse_patch(row["patch"]), FAIL_TO_PASS=f2p, PASS_TO_PASS=p2p, image=row["image_name"],
        created_at=str(row.get("created_at") or ""), layout=layout, setup_script=setup, eval_script=eval_script,
        log_parser=parser, extra={"bug_patch": row["patch"], "upstream": owner_repo, "commit": commit8,
                                  "language": lang, "test_timeout_s": timeout_s},
    )
