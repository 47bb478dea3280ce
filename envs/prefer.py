"""A verifiable env with a hidden rule: the agent names a digit through the `answer` tool and
is rewarded when it is the env's preferred one. Nothing in the prompt gives the rule away,
so only reward can teach it: the plainest test that the whole RL loop learns.

The rule may drift: with `switch_every > 0`, the preferred digit moves to the next one in
`preferred` after that many graded rollouts (an env whose preferred answer switches mid-run,
where a critic should recover faster than a running-mean baseline: docs/design.md, online learning).
"""

from __future__ import annotations

import random
import threading

from envs.arith import grade_answer
from envs.base import EnvBase, GradeResult, Task, call_message, register_env
from sandbox.base import Sandbox
from sandbox.docker import DEFAULT_IMAGE

QUESTIONS = ["Pick a digit.", "Name one digit from 0 to 9.", "Choose a number between 0 and 9.",
             "Say a single digit.", "Give me a digit.", "Which digit do you pick?"]


def make_prefer_tasks(n: int, seed: int = 0) -> list[Task]:
    """`n` prompts asking for a digit, in a few wordings."""
    rng = random.Random(seed)
    return [Task(instance_id=f"prefer-{seed}-{i}", repo="prefer", base_commit="-",
                 problem_statement=rng.choice(QUESTIONS)) for i in range(n)]


@register_env("prefer")
class PreferEnv(EnvBase):
    tools = ("answer",)

    def __init__(self, preferred: str = "7", switch_every: int = 0, image: str = DEFAULT_IMAGE):
        self.preferred = [p.strip() for p in str(preferred).split(",")]
        self.switch_every = switch_every
        self.image = image
        self.system_prompt = "Answer with one call of the `answer` tool."
        self._graded = 0
        self._lock = threading.Lock()

    def image_for(self, task: Task) -> str:
        return self.image

    def reset(self, task: Task, sandbox: Sandbox) -> str:
        return task.problem_statement

    def current(self) -> str:
        """The digit rewarded now."""
        phase = self._graded // self.switch_every if self.switch_every > 0 else 0
        return self.preferred[phase % len(self.preferred)]

    def grade(self, task: Task, sandbox: Sandbox, patch: str | None = None) -> GradeResult:
        return grade_answer(task, sandbox, self._next_expected)

    def _next_expected(self) -> str:
        """The digit this grading rewards; each grading counts towards the next switch."""
        with self._lock:
            expected = self.current()
            self._graded += 1
        return expected

    def demonstrations(self, n: int, rng: random.Random, seed: int, **_) -> list[list[dict]]:
        """`n` prompts answered with a uniformly random digit: the format is taught, the hidden
        rule is not (only reward teaches it)."""
        return [[{"role": "user", "content": t.problem_statement}, call_message("answer", value=str(rng.randint(0, 9)))]
                for t in make_prefer_tasks(n, seed=seed)]
