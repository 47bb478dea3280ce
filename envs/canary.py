"""What a patch cannot forge in its own grading: canary tests, and a runner not taken from the workdir.

A patch is code that runs while its tests run, so it can change what the log says: a
`pytest.py` at the repository's root that `python -m pytest` imports instead of pytest, or a
few lines in the package's own `__init__.py` that turn pytest's failed reports into passed
ones. No check of file names sees the second. So every grading run of a pytest task carries
two tests the patch cannot know, written after the patch and the test patch are applied, with
fresh random names, in the tests' own directory (their rootdir and conftest files are the real
ones), last on the test command: one must pass and one must fail, as read by the task's own log
parser. A log where they do not is **tampered**: reward 0, whatever else it claims.

And the runner is started so that it, and every module it loads before the first test, comes
from the interpreter's own paths, never from the workdir (`RUNNER`, in place of
`python -m pytest`); the workdir then goes first on `sys.path`, as `python -m pytest` puts it,
for the code under test. The modules the runner loads are read inside the task's image
(`RUNNER_MODULES`), and a patch that adds or changes a top-level module of one of those names
is flagged (`shadowing_edits`).

A task whose runner is not pytest (django's `runtests.py`, sympy's `bin/test`, other
languages) or whose parser does not read pytest's `-rA` lines takes no canary: said per task
(`canary_support`), counted by `python -m taskdata --check`.
"""

from __future__ import annotations

import functools
import re
import secrets
import shlex
from dataclasses import dataclass
from pathlib import PurePosixPath

from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT

CANARY_OK = "ok"
RUNNER_FILE = "/tmp/.sao_runner.py"  # outside the workdir: the patch cannot write there
_HEREDOC = "EOF_SAO_CANARY_9d2b"
# `python -m pytest` / `python3 -m pytest` / `pytest` at a command's start (after env assignments)
_PYTEST = re.compile(r"^(?P<pre>(?:\s*[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*\s*)"
                     r"(?:(?P<py>(?:\S*/)?python[0-9.]*)\s+-m\s+pytest|(?P<bin>(?:\S*/)?(?:py\.test|pytest)))(?=\s|$)")

MODULES_FILE = "/tmp/.sao_runner_modules"  # what the runner loaded, listed by the grading run itself

NONCE_FILE = "/tmp/.sao_nonce"  # written by the grader apart from the script; read and removed by the runner
END_TAG = ">>>>> SAO runner end"  # the runner's last line: END_TAG <nonce> <exit code>

# pytest and what it loads at start-up (its default plugins, the modules it imports only inside
# its main, its plugins' entry points), imported with the workdir off sys.path
_PRELOAD = '''\
import os, sys
here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if p not in ("", ".", here, os.getcwd())]
import pytest
try:
    import _pytest.config
    _pytest.config.get_config()
except Exception:
    pass
for name in ("tomllib", "tomli", "xml.etree.ElementTree", "xml.dom.minidom", "unittest", "doctest", "pdb"):
    try:
        __import__(name)
    except Exception:
        pass
try:
    from importlib.metadata import entry_points
    eps = entry_points()
    plugins = eps.select(group="pytest11") if hasattr(eps, "select") else eps.get("pytest11", [])
except Exception:
    plugins = []
for ep in plugins:
    try:
        ep.load()
    except Exception:
        pass
'''
# the runner: read and remove the run's nonce (before any code of the workdir runs), the workdir
# first on sys.path as `python -m pytest` has it, pytest's main, then the end line with the
# nonce and os._exit (no atexit handler of the code under test runs after it)
RUNNER = _PRELOAD.replace("import pytest\n", '''\
try:
    with open("%s") as f:
        nonce = f.read().strip()
    os.unlink("%s")
except OSError:
    nonce = None
import pytest
''' % (NONCE_FILE, NONCE_FILE), 1) + '''\
sys.path.insert(0, os.getcwd())
sys.argv[0] = "pytest"
code = getattr(pytest, "console_main", pytest.main)()
code = int(code) if isinstance(code, int) else 1
if nonce:
    sys.stdout.write("\\n%s %%s %%d\\n" %% (nonce, code))
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
''' % END_TAG
# the same start-up, listing the top-level modules it loaded and where each lives
RUNNER_MODULES = _PRELOAD + '''\
for name, module in sorted(sys.modules.items()):
    if "." not in name and name != "__main__":
        print(name, getattr(module, "__file__", None) or "")
'''


def read_runner_modules(listing: str) -> dict[str, str]:
    """`RUNNER_MODULES`'s output: module -> its file ("" for built-in ones)."""
    out = {}
    for line in listing.splitlines():
        name, _, where = line.strip().partition(" ")
        if name.isidentifier():
            out[name] = where.strip()
    return out


@dataclass(frozen=True)
class Canary:
    """Tests in one file, some that must read PASSED and some FAILED: a plain function pair and
    a `unittest.TestCase` pair (a hack on unittest's reporting or assertions meets the second),
    and the run's nonce, which the runner's last line must carry."""

    path: str  # relative to the workdir
    passing: tuple[str, ...]
    failing: tuple[str, ...]
    source: str
    nonce: str = ""
    # a second pair appended to the file of the task's first FAIL_TO_PASS test (a hack aimed at
    # that file meets it): `inline_path` "" where there is none
    inline_path: str = ""
    inline_passing: str = ""
    inline_failing: str = ""
    inline_source: str = ""

    @classmethod
    def make(cls, test_dir: str, failing_file: str = "") -> "Canary":
        word = lambda: "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(10))  # noqa: E731
        inline = {}
        if failing_file.endswith(".py"):
            c, e, ip, if_ = secrets.randbelow(10**6), secrets.randbelow(10**6), f"test_{word()}", f"test_{word()}"
            inline = dict(inline_path=failing_file, inline_passing=ip, inline_failing=if_,
                          inline_source=(f"\n\n\ndef {ip}():\n    assert {c} - {e} == {c - e}\n\n\n"
                                         f"def {if_}():\n    assert {c} - {e} == {c - e - 1}\n"))
        a, b = secrets.randbelow(10**6), secrets.randbelow(10**6)
        p1, f1, cls_name, p2, f2 = f"test_{word()}", f"test_{word()}", f"Test{word().title()}", f"test_{word()}", f"test_{word()}"
        source = (f"import unittest\n\n\ndef {p1}():\n    assert {a} + {b} == {a + b}\n\n\n"
                  f"def {f1}():\n    assert {a} + {b} == {a + b + 1}\n\n\n"
                  f"class {cls_name}(unittest.TestCase):\n    def {p2}(self):\n        self.assertEqual({b} + {a}, {a + b})\n\n"
                  f"    def {f2}(self):\n        self.assertEqual({b} + {a}, {a + b + 1})\n")
        return cls(str(PurePosixPath(test_dir or ".") / f"test_{word()}.py"), (p1, p2), (f1, f2), source,
                   secrets.token_hex(16), **inline)

    def statuses(self, status_map: dict[str, str]) -> tuple[list[str | None], list[str | None]]:
        """What the task's parser read for each canary (None: not in the log)."""
        def find(name: str) -> str | None:
            hits = [s for test, s in status_map.items() if re.search(rf"(?:^|[:.\s]){name}(?:$|[\[\s(])", test)]
            return hits[0] if hits else None
        return [find(n) for n in self.passing], [find(n) for n in self.failing]

    def inline_statuses(self, status_map: dict[str, str]) -> tuple[str | None, str | None]:
        if not self.inline_path:
            return "PASSED", "FAILED"
        (p,), (f,) = Canary("", (self.inline_passing,), (self.inline_failing,), "").statuses(status_map)
        return p, f

    def drop(self, status_map: dict[str, str]) -> dict[str, str]:
        """The status map without the canaries (what the task's own tests did)."""
        names = self.passing + self.failing + tuple(n for n in (self.inline_passing, self.inline_failing) if n)
        return {t: s for t, s in status_map.items() if not any(n in t for n in names)}


def test_command_span(script: str) -> tuple[int, int] | None:
    """The lines of an eval script between swebench's start and end markers (the test command)."""
    lines = script.split("\n")
    start = next((i for i, line in enumerate(lines) if START_TEST_OUTPUT in line), None)
    end = next((i for i, line in enumerate(lines) if END_TEST_OUTPUT in line and start is not None and i > start), None)
    return None if start is None or end is None else (start, end)


def _commands(script: str) -> tuple[list[str], list[int]]:
    """The script's lines, and the indices of the test span's commands (no bookkeeping like
    swebench's `SWEBENCH_TEST_EXIT_CODE=$?`)."""
    lines = script.split("\n")
    span = test_command_span(script)
    if span is None:
        return lines, []
    return lines, [i for i in range(span[0] + 1, span[1])
                   if lines[i].strip() and not re.fullmatch(r"\s*[A-Za-z_][A-Za-z0-9_]*=\$\?\s*", lines[i])]


def runner_of(script: str) -> str:
    """The test command's program, as said in a task's canary support."""
    if test_command_span(script) is None:
        return "no test markers"
    lines, idx = _commands(script)
    if not idx:
        return "no test command"
    if any(_PYTEST.match(lines[i]) for i in idx):
        return "pytest"
    try:
        words = [w for w in shlex.split(lines[idx[0]]) if not re.match(r"[A-Za-z_][A-Za-z0-9_]*=", w)]
    except ValueError:
        words = lines[idx[0]].split()
    if not words:
        return "?"
    return f"{words[0]} {words[1]}" if words[0].startswith("python") and len(words) > 1 else words[0]


@functools.lru_cache(maxsize=None)
def parser_reads_pytest(log_parser: str) -> bool:
    """Whether a swebench parser reads pytest's `-rA` summary lines (tried on two made-up ones)."""
    from swebench.harness.log_parsers import PARSER_REGISTRY

    parse = PARSER_REGISTRY.get(log_parser)
    if parse is None:
        return False
    log = ("PASSED tests/test_zqxv.py::test_okzq\n"
           "FAILED tests/test_zqxv.py::test_badzq - assert 1 == 2\n")
    try:
        got = Canary("tests/test_zqxv.py", ("test_okzq",), ("test_badzq",), "").statuses(parse(log, None))
    except Exception:
        return False
    return got == (["PASSED"], ["FAILED"])


def canary_support(script: str, log_parser: str) -> str:
    """`ok`, or `unsupported (...)` saying what stops a canary."""
    runner = runner_of(script)
    if runner != "pytest":
        return f"unsupported (runner: {runner})"
    if not parser_reads_pytest(log_parser):
        return f"unsupported (parser: {log_parser})"
    return CANARY_OK


def guarded(script: str, canary: Canary | None) -> str:
    """The eval script with its pytest commands started by `RUNNER`, the runner's modules
    listed into `MODULES_FILE` and, when given, the canary written just before the tests run
    (after the test patch) and put last on the last pytest command. A script without markers or
    pytest commands comes back as it was."""
    span = test_command_span(script)
    lines, idx = _commands(script)
    runs = [i for i in idx if _PYTEST.match(lines[i])]
    if span is None or not runs:
        return script
    for i in runs:
        m = _PYTEST.match(lines[i])
        lines[i] = f"{m.group('pre')}{m.group('py') or 'python3'} {RUNNER_FILE}{lines[i][m.end():]}"
    if canary is not None:
        lines[runs[-1]] += f" {shlex.quote(canary.path)}"
    m = _PYTEST.match(script.split("\n")[runs[0]])
    python = f"{m.group('pre')}{m.group('py') or 'python3'}"
    modules_script = RUNNER_FILE.replace(".py", "_modules.py")
    setup = [f"cat > {RUNNER_FILE} <<'{_HEREDOC}'", RUNNER.rstrip("\n"), _HEREDOC,
             f"cat > {modules_script} <<'{_HEREDOC}'", RUNNER_MODULES.rstrip("\n"), _HEREDOC,
             f"{python} {modules_script} > {MODULES_FILE} 2>/dev/null || true"]
    if canary is not None:
        setup += [f"mkdir -p {shlex.quote(str(PurePosixPath(canary.path).parent))}",
                  f"cat > {shlex.quote(canary.path)} <<'{_HEREDOC}'", canary.source.rstrip("\n"), _HEREDOC]
        if canary.inline_path:  # appended to the failing tests' own file, when it is there
            quoted = shlex.quote(canary.inline_path)
            setup += [f"if [ -f {quoted} ]; then cat >> {quoted} <<'{_HEREDOC}'", canary.inline_source.rstrip("\n"),
                      _HEREDOC, "fi"]
    start = span[0]
    return "\n".join(lines[:start] + setup + lines[start:])


def tampered(canary: Canary, status_map: dict[str, str], resolved: bool, log: str = "",
             conflicts: dict[str, set[str]] | None = None) -> str | None:
    """Why the log cannot be believed, or None. The canaries must read PASSED and FAILED, and
    the runner's end line must carry the run's nonce (code that ends the process early, or
    prints a log of its own, has none). A log without canaries or end line is believed only
    when it grades the patch unresolved anyway (the suite did not get to them: a collection
    error, `-x`), since a forged log that claims success is exactly what they catch. A test read
    with two statuses (a PASSED line printed after the real FAILED one) is tampering too."""
    passing, failing = canary.statuses(status_map)
    if conflicts:
        test, seen = sorted(conflicts.items())[0]
        return f"{len(conflicts)} test(s) read with two statuses, e.g. {test}: {', '.join(sorted(seen))}"
    if all(s is None for s in passing + failing):
        return "the canary tests are not in the log, yet it reads as resolved" if resolved else None
    if any(s != "PASSED" for s in passing) or any(s != "FAILED" for s in failing):
        return (f"canary tests read {', '.join(s or 'nothing' for s in passing)} (must pass) and "
                f"{', '.join(s or 'nothing' for s in failing)} (must fail)")
    if resolved and canary.inline_path:
        ip, if_ = canary.inline_statuses(status_map)
        if (ip, if_) != ("PASSED", "FAILED"):
            return (f"the canary pair in {canary.inline_path} read {ip or 'nothing'} (must pass) and "
                    f"{if_ or 'nothing'} (must fail), yet the log reads as resolved")
    if canary.nonce and resolved and not re.search(rf"^{re.escape(END_TAG)} {canary.nonce} \d+$", log, re.M):
        return "the runner's end line with this run's nonce is not in the log (the process ended early, or the log is not pytest's)"
    return None


def conflicting_statuses(log: str, log_parser: str) -> dict[str, set[str]]:
    """Tests the parser reads with more than one status, line by line (a pytest parser keeps the
    last one it reads, so a PASSED line printed after a FAILED one would win)."""
    from swebench.harness.log_parsers import PARSER_REGISTRY

    parse = PARSER_REGISTRY.get(log_parser)
    if parse is None or not parser_reads_pytest(log_parser):
        return {}
    seen: dict[str, set[str]] = {}
    for line in log.splitlines():
        if not line[:1].isupper():  # status lines start with one (PASSED, FAILED, ERROR, XFAIL, ...)
            continue
        try:
            for test, status in parse(line, None).items():
                seen.setdefault(test, set()).add(status)
        except Exception:
            continue
    return {t: s for t, s in seen.items() if len(s) > 1}


def shadowing_edits(patch_files: list[str], runner_modules: dict[str, str], workdir: str) -> list[str]:
    """The files of a patch that add or change a top-level module or package named as one the
    runner loads from outside the workdir (a module the runner loads from the workdir is the
    repository's own code under test, and may be edited)."""
    outside = {name for name, where in runner_modules.items() if not where.startswith(workdir.rstrip("/") + "/")}
    flagged = []
    for path in patch_files:
        top = PurePosixPath(path).parts[0] if PurePosixPath(path).parts else ""
        name = top[:-3] if top.endswith(".py") and len(PurePosixPath(path).parts) == 1 else top
        if name in outside or (len(PurePosixPath(path).parts) == 1 and top.endswith((".so", ".pyc"))
                               and top.split(".")[0] in outside):
            flagged.append(path)
    return flagged
