"""Math with a Python tool (tool-integrated reasoning), graded with math-verify.

The prompt is the problem. The agent reasons, runs code with the `python` tool and gives its
final answer with the `answer` tool (LaTeX or plain text; a `\\boxed{...}` in it is found).
A reply without a tool call is a format error in the agent loop, so the answer tool, not a
`\\boxed{}` in the last turn's text, is what ends the episode and is graded. Grading parses the
expected and the given answer with math-verify and asks it whether they are equal (numbers,
fractions, LaTeX, sets, intervals, expressions): reward 1 or 0. Nothing here compares answers
itself; a bare answer is only put between `$` so that math-verify reads it as LaTeX.

The `python` tool runs each call (a cell) with python3 in the rollout's sandbox. State carries
over as in a notebook, by replay: the sandbox runs no process between commands (every one is
killed when its command ends), so each call runs a fresh interpreter that first re-runs the
earlier cells with their output hidden, then the new one. Variables, functions and imports are
there as before; side effects of earlier cells (files written, time spent) happen again;
`random` is seeded the same in every run, so its draws repeat. A cell that ran past its time
limit or was killed is not kept (it would stop every later call too); one that raised is kept,
as a notebook keeps what ran before the error. The new cell has `timeout_s` seconds of wall
time and of CPU time (an alarm in the interpreter, then the kernel's CPU limit for code stuck
in C); the command as a whole is killed past the replay's bound.

math-verify times itself out with SIGALRM, which only works in a main thread; rollouts grade
in worker threads, so it runs in a process of its own (`Verifier`), one request at a time,
killed and restarted when an answer takes longer than `verify_timeout_s`.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import select
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from envs.base import ANSWER_FILE, EnvBase, GradeResult, Task, call_message, register_env
from envs.math_problems import make_math_tasks
from sandbox.base import ExecResult, Sandbox
from sandbox.docker import DEFAULT_IMAGE

ROOT = Path(__file__).resolve().parents[1]
CELL_SCRIPT = "/tmp/.sao_python/cell.py"
STOPPED_EXIT = 70  # the runner stopped the new cell at its time limit
KEPT_EXITS = (0, 1)  # the cell ran to its end or raised: replayed from now on
SYSTEM_PROMPT = (
    "Solve the math problem. You can run Python 3 with the `python` tool: what a call defines "
    "(variables, functions, imports) is still there in the next call, and what it prints is shown "
    "to you. When you are sure, give the final answer with one call of the `answer` tool, in LaTeX "
    "or plain text, e.g. 42, \\frac{3}{4}, 2\\sqrt{3}, \\{1, 2\\} or (0, \\infty). Only that answer is graded."
)

# The interpreter's side of the python tool (the stdlib of the sandbox's python3 only).
RUNNER = r'''
import ast, contextlib, io, linecache, random, resource, signal, sys, traceback


class CellTimeout(BaseException):
    pass


def _alarm(signum, frame):
    raise CellTimeout()


def _compile(code, name):
    """The cell's statements, and its last bare expression apart (shown, as a notebook does)."""
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)  # source lines in tracebacks
    tree = ast.parse(code, name)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = compile(ast.Expression(tree.body.pop().value), name, "eval")
    return compile(tree, name, "exec"), last


def main(cells, limit):
    ns = {"__name__": "__main__"}
    random.seed(0)
    hidden = io.StringIO()
    for i, code in enumerate(cells[:-1]):
        with contextlib.redirect_stdout(hidden), contextlib.redirect_stderr(hidden):
            try:
                body, last = _compile(code, f"<cell {i + 1}>")
                exec(body, ns)
                if last is not None:
                    eval(last, ns)
            except BaseException:
                pass
        hidden.seek(0)
        hidden.truncate()
    used = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
    try:  # CPU seconds: SIGXCPU stops code that the alarm cannot interrupt (a long C call)
        resource.setrlimit(resource.RLIMIT_CPU, (int(used + limit) + 1, int(used + limit) + 3))
    except (ValueError, OSError):
        pass
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        body, last = _compile(cells[-1], f"<cell {len(cells)}>")
        exec(body, ns)
        if last is not None:
            value = eval(last, ns)
            if value is not None:
                print(repr(value))
    except CellTimeout:
        sys.stdout.flush()
        print(f"TimeoutError: the cell ran past its {limit:g}s limit and was stopped", file=sys.stderr)
        sys.exit(STOPPED_EXIT)
    except SyntaxError as e:
        traceback.print_exception(type(e), e, None)
        sys.exit(1)
    except BaseException as e:
        signal.setitimer(signal.ITIMER_REAL, 0)
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)  # from the cell down
        sys.exit(1)
    signal.setitimer(signal.ITIMER_REAL, 0)
'''


class Notebook:
    """One rollout's `python` tool: the cells kept so far, replayed before each new one."""

    def __init__(self, sandbox: Sandbox, timeout_s: float):
        self.sandbox = sandbox
        self.timeout_s = float(timeout_s)
        self.cells: list[str] = []

    def run(self, code: str) -> str:
        """The cell's output (stdout and stderr as they came), and how it ended unless it did
        so normally. A ValueError (an empty cell) becomes an error observation."""
        if not code.strip():
            raise ValueError("`code` is empty")
        cells = [*self.cells, code]
        script = f"STOPPED_EXIT = {STOPPED_EXIT}\n{RUNNER}\nmain({cells!r}, {self.timeout_s!r})\n"
        self.sandbox.write_file(CELL_SCRIPT, script)
        # every kept cell once finished within the limit: the replay's bound, with room to start
        bound = self.timeout_s * len(cells) + 30
        result = self.sandbox.exec(f"exec env PYTHONHASHSEED=0 python3 -u {CELL_SCRIPT} 2>&1", timeout=bound)
        kept = not result.timed_out and result.exit_code in KEPT_EXITS
        if kept:
            self.cells.append(code)
        return self._describe(result, kept)

    def _describe(self, result: ExecResult, kept: bool) -> str:
        body = result.output.rstrip("\n")
        if kept:
            return body or "(no output)"
        if result.timed_out or result.exit_code in (STOPPED_EXIT, 128 + 24):  # 24: SIGXCPU
            why = f"stopped: the cell ran past its {self.timeout_s:g}s limit"
        elif result.oom_killed or result.disk_full_mb:
            why = result.describe()
        else:
            why = f"the interpreter exited with code {result.exit_code}"
        note = f"({why}; the cell is not kept: later calls do not see what it did)"
        return f"{body}\n{note}" if body.strip() else note


# -- grading ----------------------------------------------------------------------------------------
@dataclass
class Verdict:
    correct: bool
    expected: str = ""  # the expected answer as math-verify read it
    given: str = ""  # the given answer as math-verify read it ("" when it found none)
    error: str | None = None  # why it could not judge (an expected answer it cannot read, a timeout)


def as_latex(text: str) -> str:
    """The text as math-verify's LaTeX extraction reads it: a bare answer (`\\frac12`, `{2, 3}`,
    `(4, \\infty)`) between `$`; text with its own delimiters or `\\boxed` as it is."""
    text = text.strip()
    return text if any(m in text for m in ("$", "\\boxed", "\\[", "\\(")) else f"${text}$"


def judge(expected: str, given: str) -> dict:
    """math-verify's verdict (run in the main thread of the verifier's process)."""
    from math_verify import parse, verify

    gold, pred = parse(as_latex(expected)), parse(as_latex(given))
    if not gold:
        return {"correct": False, "error": f"math-verify cannot read the expected answer {expected!r}"}
    return {"correct": bool(verify(gold, pred)), "expected": str(gold[0]), "given": str(pred[0]) if pred else ""}


def serve() -> None:
    """The verifier's process: one JSON request per line in, one verdict per line out."""
    import logging

    logging.disable(logging.WARNING)  # math-verify logs each unreadable answer
    out, sys.stdout = sys.stdout, sys.stderr  # nothing but verdicts on the pipe
    for line in sys.stdin:
        request = json.loads(line)
        try:
            verdict = judge(request["expected"], request["given"])
        except Exception as e:  # math-verify catches its own; this is a last resort
            verdict = {"correct": False, "error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(verdict) + "\n")
        out.flush()


class Verifier:
    """math-verify in a process of its own, safe to call from any thread (one answer at a time)."""

    def __init__(self, timeout_s: float = 30.0):
        import math_verify  # noqa: F401  (said here, not in the process, when it is not installed)

        self.timeout_s = float(timeout_s)
        self._proc: subprocess.Popen | None = None
        self._stderr = None
        self._lock = threading.Lock()

    def check(self, expected: str, given: str) -> Verdict:
        with self._lock:
            proc = self._proc if self._proc is not None and self._proc.poll() is None else self._start()
            proc.stdin.write(json.dumps({"expected": expected, "given": given}) + "\n")
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], self.timeout_s)
            line = proc.stdout.readline() if ready else ""
            if line:
                return Verdict(**json.loads(line))
            if ready:  # end of file: the process died
                why = f"the math-verify process exited ({self._stderr_tail()})"
            else:
                why = f"math-verify took over {self.timeout_s:g}s on this answer and was stopped"
            self._stop()
            return Verdict(False, error=why)

    def _start(self) -> subprocess.Popen:
        self._stop()
        self._stderr = tempfile.TemporaryFile()
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        self._proc = subprocess.Popen([sys.executable, "-c", "from envs.math import serve; serve()"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                      text=True, env={**os.environ, "PYTHONPATH": path})
        return self._proc

    def _stderr_tail(self) -> str:
        self._proc.wait(5)
        self._stderr.seek(0)
        tail = self._stderr.read().decode(errors="replace").strip()[-500:]
        return f"code {self._proc.returncode}" + (f": {tail}" if tail else "")

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def close(self) -> None:
        with self._lock:
            self._stop()


@register_env("math")
class MathEnv(EnvBase):
    tools = ("python", "answer")

    def __init__(self, timeout_s: float = 30.0, image: str = DEFAULT_IMAGE, system_prompt: str | None = None,
                 verify_timeout_s: float = 30.0):
        if not float(timeout_s) > 0:
            raise ValueError(f"env.timeout_s must be positive seconds, got {timeout_s}")
        self.timeout_s = float(timeout_s)
        self.image = image
        self.system_prompt = system_prompt or SYSTEM_PROMPT
        self.verifier = Verifier(verify_timeout_s)

    def image_for(self, task: Task) -> str:
        return self.image

    def reset(self, task: Task, sandbox: Sandbox) -> str:
        return task.problem_statement

    def tool_handlers(self, task: Task, sandbox: Sandbox) -> dict:
        return {"python": Notebook(sandbox, self.timeout_s).run}

    def grade(self, task: Task, sandbox: Sandbox, patch: str | None = None) -> GradeResult:
        """Reward 1 when math-verify finds the answer the `answer` tool wrote equal to the
        expected one; no answer: unresolved, an empty patch."""
        start = time.monotonic()
        try:
            given = sandbox.read_file(ANSWER_FILE).strip()
        except FileNotFoundError:
            given = None
        expected = str(task.extra["answer"])
        verdict = self.verifier.check(expected, given) if given else Verdict(False)
        return GradeResult(task.instance_id, resolved=verdict.correct, patch_applied=True,
                           tests_status={"answer": "PASSED" if verdict.correct else "FAILED"},
                           report={"expected": expected, "given": given, "expected_parsed": verdict.expected,
                                   "given_parsed": verdict.given},
                           error=verdict.error, empty_patch=not given, duration_s=time.monotonic() - start)

    def demonstrations(self, n: int, rng: random.Random, seed: int, **_) -> list[list[dict]]:
        """`n` built-in problems solved the tool-integrated way: the Python that computes the
        answer, its output, and that output given as the answer."""
        out = []
        for task in make_math_tasks(n, seed=rng.randrange(1 << 30)):  # not `seed`: rng may be seeded with it
            code = task.extra["code"]
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                exec(code, {})  # the generator's own code (trusted), as the sandbox would run it
            result = printed.getvalue().strip()
            out.append([{"role": "user", "content": task.problem_statement}, call_message("python", code=code),
                        {"role": "tool", "name": "python", "content": result}, call_message("answer", value=result)])
        return out
