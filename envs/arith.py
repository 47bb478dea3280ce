"""A small verifiable env: arithmetic questions answered through a tool call.

The prompt asks for `a OP b`; the agent calls `answer(value)`, which writes the value into
the sandbox; grading reads it back and compares it with the exact result. Small enough for
the embedded tiny model to learn on 2 CPU cores, and graded by the same path as SWE tasks
(a real sandbox, a tool, a file).
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Callable

from envs.base import ANSWER_FILE, EnvBase, GradeResult, Task, call_message, register_env
from sandbox.base import Sandbox
from sandbox.docker import DEFAULT_IMAGE

PROMPTS = Path(__file__).parent / "prompts"
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def make_arith_tasks(n: int, seed: int = 0, max_operand: int = 9, ops: str = "+") -> list[Task]:
    """`n` questions `a OP b` with operands in [0, max_operand]; the answer is in `extra`."""
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        a, b, op = rng.randint(0, max_operand), rng.randint(0, max_operand), rng.choice(ops)
        tasks.append(Task(
            instance_id=f"arith-{seed}-{i}", repo="arith", base_commit="-",
            problem_statement=f"What is {a} {op} {b}?", extra={"answer": str(OPS[op](a, b))},
        ))
    return tasks


def grade_answer(task: Task, sandbox: Sandbox, expected: Callable[[], str]) -> GradeResult:
    """Resolved when the value the `answer` tool wrote equals `expected()` (called once, after
    the answer is read; no answer file: unresolved, an empty patch). Shared by the answer envs."""
    start = time.monotonic()
    try:
        given = sandbox.read_file(ANSWER_FILE).strip()
    except FileNotFoundError:
        given = None
    want = expected()
    resolved = given == want
    return GradeResult(task.instance_id, resolved=resolved, patch_applied=True,
                       tests_status={"answer": "PASSED" if resolved else "FAILED"},
                       report={"expected": want, "given": given}, empty_patch=given is None,
                       duration_s=time.monotonic() - start)


@register_env("arith")
class ArithEnv(EnvBase):
    tools = ("answer",)

    def __init__(self, image: str = DEFAULT_IMAGE):
        self.image = image
        self.system_prompt = (PROMPTS / "arith_system.txt").read_text()

    def image_for(self, task: Task) -> str:
        return self.image

    def reset(self, task: Task, sandbox: Sandbox) -> str:
        return task.problem_statement

    def grade(self, task: Task, sandbox: Sandbox, patch: str | None = None) -> GradeResult:
        return grade_answer(task, sandbox, lambda: task.extra["answer"])

    def demonstrations(self, n: int, rng: random.Random, seed: int, max_operand: int = 9, **_) -> list[list[dict]]:
        """`n` questions answered right through the `answer` tool (for the SFT warm start)."""
        return [[{"role": "user", "content": t.problem_statement}, call_message("answer", value=t.extra["answer"])]
                for t in make_arith_tasks(n, seed=seed, max_operand=max_operand)]
