"""The SWE env: a repository at a base commit; a patch is graded by running its tests.

Grading follows SWE-bench 5: the workspace goes back to the base commit, the patch is applied
by the first of swebench's commands that succeeds (`APPLY_CMDS`; the workspace is reset before
each retry), the test files are reset, the test patch is applied, the tests run under a
timeout, and swebench's own `get_eval_report` reads the log. Resolved = every FAIL_TO_PASS and
every PASS_TO_PASS test passes.
"""

from __future__ import annotations

import re
import shlex
import tempfile
import time
from pathlib import Path, PurePosixPath

from swebench.harness.constants import (
    APPLY_PATCH_FAIL,
    END_TEST_OUTPUT,
    START_TEST_OUTPUT,
    TESTS_TIMEOUT,
)
from swebench.harness.grading import get_eval_report, get_logs_eval
from swebench.harness.log_parsers import PARSER_REGISTRY
from swebench.harness.utils import make_test_spec

from envs import smith_parsers  # noqa: F401 (registers swesmith's parsers, which swebench lacks)
from envs.base import EnvBase, GradeResult, Task, register_env
from envs.canary import (
    CANARY_OK,
    MODULES_FILE,
    NONCE_FILE,
    Canary,
    canary_support,
    conflicting_statuses,
    guarded,
    read_runner_modules,
    shadowing_edits,
    tampered,
)
from envs.log_parsers import EXPECTED_TYPES, expected_verdict  # (registers R2E's, SWE-Next's and SWE-Gym's)
from sandbox.base import WORKDIR, Sandbox, SandboxError
from sandbox.docker import DEFAULT_IMAGE

PROMPT_FILE = Path(__file__).parent / "prompts" / "swe.txt"
# Written into .git/info/exclude so byte-code and caches never show up in a diff.
EXCLUDES = "__pycache__/\n*.pyc\n.pytest_cache/\n*.egg-info/\n"
# swebench 5's GIT_APPLY_CMDS, in its order
APPLY_CMDS = [
    "git apply --verbose {p}",
    "git apply --verbose --3way {p}",
    "git apply --verbose --reject {p}",
    "patch --batch --forward --fuzz=5 -p1 -i {p}",
]
# Between attempts: a failed `--reject` leaves the hunks it could apply (and .rej files), which
# `patch` would then take as reversed or already applied. swebench resets with `git checkout
# -- . ; git clean -fd`; a failed `--3way` also writes the index (it implies --index), which
# `checkout -- .` restores from, so the index is reset too. HEAD is the base commit here.
RESET_CMD = "git reset -q --hard && git clean -fdq"
# as swebench: every command failed, yet the tree may hold the whole patch (checked in reverse)
APPLIED_CHECK = "git apply --check --reverse {p}"
PATCH_FILE = "/tmp/sao_model.patch"
# A task with a setup script starts from the tree the script leaves, committed here (fixed
# author and dates: the same image and script give the same commit).
START_REF = "refs/sao/start"
_SNAPSHOT = (
    "git add -A && GIT_AUTHOR_DATE='2000-01-01T00:00:00Z' GIT_COMMITTER_DATE='2000-01-01T00:00:00Z' "
    "git -c user.name=sao -c user.email=sao@localhost -c commit.gpgsign=false commit -q --no-verify --allow-empty "
    f"-m 'sao: task start' && git update-ref {START_REF} HEAD"
)
_HEREDOC = "EOF_SAO_5f3c1e"


def default_test_cmd(task: Task) -> str:
    files = " ".join(shlex.quote(f) for f in task.test_files)
    return f"python3 -m pytest -rA --tb=short -p no:cacheprovider {files}".rstrip()


def modified_files(patch: str) -> list[str]:
    """Paths a patch changes that exist before it (`--- a/PATH` lines)."""
    return [line[6:].split("\t")[0] for line in patch.splitlines() if line.startswith("--- a/")]


# Files that steer how tests run, wherever they sit: an edit the task does not name can make
# failing tests read as passing (a conftest hook, a plugin loaded by addopts, a .pth file)
TEST_INFRA_NAMES = {"conftest.py", "pytest.ini", "tox.ini", "noxfile.py", "sitecustomize.py", "usercustomize.py"}
# shared settings files: flagged when the lines a patch changes are test settings
TEST_SETTINGS_FILES = {"setup.cfg", "pyproject.toml"}
_TEST_SETTINGS = re.compile(r"pytest|tox|addopts|testpaths|python_files|python_functions|\[tool:", re.I)


# what steers the run without being a test file: git's own folder (hooks run at the test
# files' reset; `patch` writes there where `git apply` refuses), packaging metadata (an
# entry_points.txt registers pytest plugins), paths out of the workspace
_RUN_MACHINERY = re.compile(r"(^|/)\.git(/|$)|(^|/)[^/]+\.(dist|egg)-info(/|$)|(^|/)entry_points\.txt$|(^|/)\.\.(/|$)|^/")


def patched_files(patch: str) -> dict[str, str]:
    """Each file a patch touches -> the lines it adds and removes."""
    out: dict[str, str] = {}
    current, previous = None, ""
    for line in patch.splitlines():
        m = re.match(r"diff --git a/(\S+) b/(\S+)", line)
        # a plain unified diff has no git header (`patch` takes it): its `+++` line after a `---` one
        plain = previous.startswith("--- ") and re.match(r"\+\+\+ (?:b/)?(\S+)", line)
        previous = line
        if m:
            current = m.group(2)
            out.setdefault(current, "")
        elif plain and plain.group(1) != "/dev/null":
            current = plain.group(1)
            out.setdefault(current, "")
        elif current and line[:1] in "+-" and not line.startswith(("+++", "---")):
            out[current] += line[1:] + "\n"
    return out


def test_infra_edits(task: Task, patch: str) -> list[str]:
    """The files of `patch` that change how the task's tests run and that its test patch does
    not name: conftest.py and the like, test settings in setup.cfg / pyproject.toml, .pth
    files, and any file under the tests' directories (those named for tests)."""
    named = set(modified_files(task.test_patch)) | {m[1] for m in re.findall(r"diff --git a/(\S+) b/(\S+)", task.test_patch)}
    # the tests' own directories (`tests/`, `pkg/tests/`), not a package whose tests sit beside its code
    test_dirs = {str(PurePosixPath(f).parent) for f in list(named) + task.test_files
                 if "test" in PurePosixPath(f).parent.name.lower()}
    flagged = []
    for path, changed in patched_files(patch).items():
        if path in named:
            continue
        p = PurePosixPath(path)
        if (p.name in TEST_INFRA_NAMES or p.suffix == ".pth" or _RUN_MACHINERY.search(path)
                or (p.name in TEST_SETTINGS_FILES and _TEST_SETTINGS.search(changed))
                or any(d == str(p.parent) or str(p.parent).startswith(d + "/") for d in test_dirs)):
            flagged.append(path)
    return flagged


test_infra_edits.__test__ = False  # not a test, for pytest, where a test module imports it by name


def canary_dir(task: Task) -> str:
    """Where a grading run's canary tests go: beside the task's first test file (its rootdir and
    conftest files are the real tests' own)."""
    named = task.test_files or modified_files(task.test_patch) or re.findall(r"diff --git a/(\S+) b/", task.test_patch)
    return str(PurePosixPath(named[0]).parent) if named else "."


def start_of(task: Task) -> str:
    """The revision the agent's work is diffed against and grading resets to."""
    return START_REF if task.setup_script else task.base_commit


def build_eval_script(task: Task, workdir: str = WORKDIR, prelude: str = "") -> str:
    """An eval.sh in swebench's shape for a task that brings none: `prelude` (an environment
    to activate), reset the test files, apply the test patch, run the tests between
    swebench's start / end markers."""
    reset = list(dict.fromkeys(modified_files(task.test_patch) + task.test_files))
    base = shlex.quote(task.base_commit)
    lines = [prelude] if prelude else []
    lines.append(f"cd {workdir}")
    if reset:
        quoted = " ".join(shlex.quote(f) for f in reset)
        # a test file the base lacks is removed: the test patch (or nothing) provides it
        lines.append(f'for f in {quoted}; do git checkout {base} -- "$f" 2>/dev/null || rm -f "$f"; done')
    if task.test_patch.strip():
        lines += [f"git apply --verbose - <<'{_HEREDOC}'", task.test_patch.rstrip("\n"), _HEREDOC]
    lines += [f": '{START_TEST_OUTPUT}'", task.test_cmd or default_test_cmd(task), f": '{END_TEST_OUTPUT}'"]
    if reset:
        lines.append(f'for f in {quoted}; do git checkout {base} -- "$f" 2>/dev/null || true; done')
    return "\n".join(lines) + "\n"


def test_spec_for(task: Task):
    """swebench's TestSpec for `task`, built by swebench's own make_test_spec."""
    if task.log_parser not in PARSER_REGISTRY:
        raise ValueError(f"task {task.instance_id}: log_parser {task.log_parser!r} is not one of swebench's parsers")
    return make_test_spec(
        {
            "instance_id": task.instance_id,
            "image": task.image or DEFAULT_IMAGE,
            "eval_script": task.eval_script or build_eval_script(task),
            "repo": task.repo,
            "version": task.version,
            "FAIL_TO_PASS": task.FAIL_TO_PASS,
            "PASS_TO_PASS": task.PASS_TO_PASS,
            "log_parser": task.log_parser,
            "eval_type": task.eval_type,
        }
    )


@register_env("swe")
class SWEEnv(EnvBase):
    """SWE-bench-style tasks. `test_timeout_s` bounds one run of a task's tests;
    `reject_test_edits`: a patch that edits test infrastructure the task does not name
    (`test_infra_edits`), or shadows a module the test runner loads, is graded unresolved, said
    why (it is flagged either way). `canaries`: pytest tasks are graded with canary tests and a
    runner not taken from the workdir (envs/canary.py); a log whose canaries do not read pass and
    fail is `tampered`, unresolved."""

    grades_patch = True  # the workspace's diff, graded in a fresh sandbox from the task's image

    def __init__(self, image: str = DEFAULT_IMAGE, test_timeout_s: float = 300.0, prompt_file: str | None = None,
                 reject_test_edits: bool = False, canaries: bool = True):
        self.default_image = image
        self.test_timeout_s = test_timeout_s
        self.reject_test_edits = reject_test_edits
        self.canaries = canaries  # off: the runner and the test command exactly as the task gives them
        self.prompt_template = Path(prompt_file or PROMPT_FILE).read_text()

    def image_for(self, task: Task) -> str:
        """The row's own image (swebench 5 datasets carry one); the sandbox base image for a task
        whose repository is a local path (copied in); else swebench's instance image name
        (`swebench/sweb.eval.x86_64.<id, "__" -> "_1776_">:latest`), which has the repo inside."""
        if task.image:
            return task.image
        if task.repo_path:
            return self.default_image
        from swebench.task.checks import expected_image

        return expected_image(task.instance_id)

    def reset(self, task: Task, sandbox: Sandbox) -> str:
        """Put the task in the sandbox's workdir (the repository at `task.base_commit`, or what
        the task's setup script lays out); return the prompt."""
        wd = sandbox.workdir
        if task.setup_script:  # from a file: its test lists can pass the 128 KiB one argument may hold
            sandbox.write_file("/tmp/sao_setup.sh", task.setup_script)
            r = sandbox.exec("bash /tmp/sao_setup.sh", timeout=600)
            if r.ok:
                r = sandbox.exec(f"mkdir -p .git/info && printf %s {shlex.quote(EXCLUDES)} >> .git/info/exclude && "
                                 + _SNAPSHOT, timeout=300)
            if not r.ok:
                raise SandboxError(f"task {task.instance_id}: its {task.layout} setup failed "
                                   f"(image {self.image_for(task)!r}): {r.output[-1500:]}")
            return self.prompt_template.format(workdir=wd, repo=task.repo, problem_statement=task.problem_statement.strip())
        if task.repo_path:
            sandbox.copy_in(task.repo_path, wd)
        elif not sandbox.exec(f"test -d {wd}/.git", timeout=30).ok:
            raise SandboxError(
                f"task {task.instance_id}: repo {task.repo!r} is not a local path and image "
                f"{self.image_for(task)!r} has no git repository at {wd}"
            )
        base = shlex.quote(task.base_commit)
        r = sandbox.exec(
            f"git checkout -q -f {base} && git clean -fdq && mkdir -p .git/info && "
            f"printf %s {shlex.quote(EXCLUDES)} >> .git/info/exclude",
            timeout=120,
        )
        if not r.ok:
            raise SandboxError(f"task {task.instance_id}: cannot check out {task.base_commit}: {r.output[-1000:]}")
        return self.prompt_template.format(
            workdir=wd, repo=task.repo, problem_statement=task.problem_statement.strip()
        )

    def patch_of(self, task: Task, sandbox: Sandbox) -> str:
        """The agent's work: the workspace's diff against the task's start (new files included)."""
        return sandbox.diff(start_of(task))

    def grade(self, task: Task, sandbox: Sandbox, patch: str | None = None) -> GradeResult:
        """Grade `patch`, or the workspace's diff against the base commit when it is None."""
        start = time.monotonic()
        if patch is None:
            patch = self.patch_of(task, sandbox)
        result = GradeResult(task.instance_id, resolved=False, patch_applied=False, empty_patch=not patch.strip())
        result.test_edits = test_infra_edits(task, patch)
        if result.test_edits and self.reject_test_edits:
            result.error = "the patch edits test infrastructure the task does not name: " + ", ".join(result.test_edits)
            result.duration_s = time.monotonic() - start
            return result
        base = shlex.quote(start_of(task))
        r = sandbox.exec(f"git reset -q --hard {base} && git clean -fdq", timeout=120)
        if not r.ok:
            raise SandboxError(f"task {task.instance_id}: cannot reset the workspace: {r.output[-1000:]}")
        if not result.empty_patch:
            failed = self._apply(sandbox, patch)
            if failed is not None:
                log, last = failed
                result.error = "patch does not apply: " + last.strip()[-500:]
                result.log = log + APPLY_PATCH_FAIL + "\n"
                return self._finish(result, task, patch, start)
        result.patch_applied = True
        spec = test_spec_for(task)
        result.canary = canary_support(spec.eval_script, task.log_parser) if self.canaries else "off"
        f2p_file = task.FAIL_TO_PASS[0].split("::")[0] if task.FAIL_TO_PASS and "::" in task.FAIL_TO_PASS[0] else ""
        canary = Canary.make(canary_dir(task), f2p_file) if result.canary == CANARY_OK else None
        if canary is not None:  # apart from the script (which the code under test can read): the runner reads and removes it
            sandbox.write_file(NONCE_FILE, canary.nonce)
        sandbox.write_file("/tmp/sao_eval.sh", guarded(spec.eval_script, canary) if self.canaries else spec.eval_script)
        # no git hook runs during grading (a patch applied by `patch` can write .git/hooks)
        sandbox.exec("git config core.hooksPath /dev/null", timeout=60)
        r = sandbox.exec("bash /tmp/sao_eval.sh", timeout=self.test_timeout_s, output_limit=4_000_000)
        result.log = r.output
        try:  # the modules the runner loaded, as this image's runner loads them
            runner_modules = read_runner_modules(sandbox.read_file(MODULES_FILE))
        except (FileNotFoundError, SandboxError):
            runner_modules = {}
        shadows = [f for f in shadowing_edits(list(patched_files(patch)), runner_modules, sandbox.workdir)
                   if f not in result.test_edits]
        result.test_edits += shadows
        if shadows and self.reject_test_edits and result.error is None:
            result.error = "the patch shadows a module the test runner loads: " + ", ".join(shadows)
        if r.timed_out:
            result.timed_out = True
            result.error = f"tests timed out after {self.test_timeout_s:g}s"
            # swebench's own line too: its run report reads it as an ambiguous failure (tests_timed_out)
            result.log += f"\n{TESTS_TIMEOUT}\n\nTimeout error: {self.test_timeout_s:g} seconds exceeded.\n"
        elif r.oom_killed:
            result.error = "tests were killed: out of memory"
        return self._finish(result, task, patch, start, spec, canary)

    def _apply(self, sandbox: Sandbox, patch: str) -> tuple[str, str] | None:
        """Apply `patch` to the workspace as swebench does: None when it applied, else the log
        of the failed commands and the last one's output."""
        sandbox.write_file(PATCH_FILE, patch if patch.endswith("\n") else patch + "\n")
        log = ""
        for attempt, cmd in enumerate(APPLY_CMDS):
            if attempt:
                r = sandbox.exec(RESET_CMD, timeout=120)
                if not r.ok:
                    raise SandboxError(f"cannot reset the workspace between patch attempts: {r.output[-1000:]}")
            r = sandbox.exec(cmd.format(p=PATCH_FILE), timeout=120)
            if r.ok:
                return None
            log += f"$ {cmd.format(p='model.patch')}\n{r.output}\n"
        if sandbox.exec(APPLIED_CHECK.format(p=PATCH_FILE), timeout=120).ok:
            return None
        return log, r.output

    def read_log(self, task: Task, log: str, patch: str) -> GradeResult:
        """The grade of a test log already made (the patch applied, the tests run): swebench's
        report and status map, as `grade` returns them."""
        result = GradeResult(task.instance_id, resolved=False, patch_applied=True, empty_patch=not patch.strip())
        result.log = log
        return self._finish(result, task, patch, time.monotonic())

    def _finish(self, result: GradeResult, task: Task, patch: str, start: float, spec=None,
                canary: Canary | None = None) -> GradeResult:
        spec = spec or test_spec_for(task)
        if task.eval_type in EXPECTED_TYPES:
            return self._finish_expected(result, task, start, spec, canary)
        with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
            f.write(result.log)
            log_path = f.name
        try:
            prediction = {"instance_id": task.instance_id, "model_patch": patch, "model_name_or_path": "sao"}
            report = get_eval_report(spec, prediction, log_path, include_tests_status=True)[task.instance_id]
            status_map, _ = get_logs_eval(spec, log_path)
        finally:
            Path(log_path).unlink(missing_ok=True)
        result.report = report
        result.tests_status = canary.drop(status_map) if canary else status_map
        result.resolved = bool(report["resolved"]) and result.error is None
        if self.reject_test_edits and result.resolved:  # training: a FAIL_TO_PASS test must pass, not xfail
            soft = [t for t in task.FAIL_TO_PASS if status_map.get(t) in ("XFAIL", "SKIPPED")]
            if soft:
                result.resolved = False
                result.error = f"FAIL_TO_PASS test(s) read {status_map[soft[0]]}, not PASSED: {', '.join(soft[:3])}"
        self._check_canary(result, canary, status_map, task.log_parser)
        if result.patch_applied and not report.get("patch_successfully_applied") and result.error is None:
            result.error = "the test log could not be read (the test patch failed or the suite did not run)"
        result.duration_s = time.monotonic() - start
        return result

    @staticmethod
    def _check_canary(result: GradeResult, canary: Canary | None, status_map: dict[str, str],
                      log_parser: str = "parse_log_pytest") -> None:
        if canary is None or not result.patch_applied:
            return
        result.tampered = tampered(canary, status_map, result.resolved, result.log,
                                   conflicting_statuses(result.log, log_parser))
        if result.tampered:
            result.resolved = False
            result.error = result.error or f"tampered: {result.tampered}"

    def _finish_expected(self, result: GradeResult, task: Task, start: float, spec,
                         canary: Canary | None = None) -> GradeResult:
        """R2E-style: the parsed log against the row's expected statuses (envs/log_parsers.py)."""
        with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
            f.write(result.log)
            log_path = f.name
        try:
            full_map, found = get_logs_eval(spec, log_path)
        finally:
            Path(log_path).unlink(missing_ok=True)
        status_map = canary.drop(full_map) if canary else full_map
        resolved, wrong = expected_verdict(task.eval_type, task.expected_output, status_map) if found else (False, {})
        result.tests_status = status_map
        result.report = {"patch_is_None": False, "patch_exists": True, "patch_successfully_applied": found,
                         "resolved": resolved, "tests_status": {"expected": len(task.expected_output),
                                                                "mismatched": dict(list(wrong.items())[:50])}}
        result.resolved = resolved and result.error is None
        self._check_canary(result, canary, full_map, task.log_parser)
        if result.patch_applied and not found and result.error is None:
            result.error = "the test log could not be read (the suite did not run)"
        result.duration_s = time.monotonic() - start
        return result
