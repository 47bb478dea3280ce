"""A multi-turn verifiable env where early choices decide success: find a hidden number.

The agent guesses through the `guess` tool; each reply says `higher` or `lower` and the range
still possible, or that it found the number (which ends the episode). Reward 1 when the number
is found within `turns` guesses. Guessing the middle of the range finds any of 7 numbers in 3
guesses; guessing anywhere inside the range finds it 68% of the time (uniform secret), and a
guess outside it wastes a turn. So the first guesses decide the outcome, the reward comes only
at the end, and a per-token value has something to learn: what is left of the range after each
reply. The SFT warm start (`demonstrations`) teaches the format and guesses inside the range at
random; reinforcement learning has to find the middle.

The guesses are recorded in the rollout's sandbox (`GUESS_FILE`), which grading reads back, as
the answer envs do.
"""

from __future__ import annotations

import random
import time

from envs.base import EnvBase, GradeResult, Task, call_message, register_env
from sandbox.base import Sandbox
from sandbox.docker import DEFAULT_IMAGE

GUESS_FILE = "/testbed/.guesses"


def make_guess_tasks(n: int, seed: int = 0, low: int = 1, high: int = 7) -> list[Task]:
    """`n` tasks, each a secret drawn uniformly from [low, high] (in `extra`)."""
    if not low < high:
        raise ValueError(f"guess tasks: low ({low}) must be below high ({high})")
    rng = random.Random(seed)
    return [Task(instance_id=f"guess-{seed}-{i}", repo="guess", base_commit="-", problem_statement="",
                 extra={"secret": rng.randint(low, high), "low": low, "high": high}) for i in range(n)]


class _Game:
    """One rollout's game: the range still possible and the guesses left."""

    def __init__(self, task: Task, turns: int, sandbox: Sandbox | None = None):
        self.secret, self.low, self.high = int(task.extra["secret"]), int(task.extra["low"]), int(task.extra["high"])
        self.left = turns
        self.sandbox = sandbox
        self.guesses: list[int] = []

    def reply(self, value: str) -> tuple[str, bool]:
        """The tool's observation and whether the game is over; a ValueError for a non-number."""
        try:
            n = int(str(value).strip())
        except ValueError:
            raise ValueError(f"`value` must be a whole number, got {value!r}") from None
        self.guesses.append(n)
        self.left -= 1
        if self.sandbox is not None:
            self.sandbox.write_file(GUESS_FILE, "\n".join(map(str, self.guesses)) + "\n")
        if n == self.secret:
            return f"Correct: the number is {n}.", True
        if n < self.secret:
            self.low = max(self.low, n + 1)
            word = "Higher"
        else:
            self.high = min(self.high, n - 1)
            word = "Lower"
        if self.left <= 0:
            return f"{word}. No guesses left: the number was {self.secret}.", True
        return f"{word}: it is between {self.low} and {self.high}. {self.left} guess(es) left.", False


@register_env("guess")
class GuessEnv(EnvBase):
    tools = ("guess",)

    def __init__(self, turns: int = 3, image: str = DEFAULT_IMAGE):
        if int(turns) < 1:
            raise ValueError(f"env.turns must be at least 1, got {turns}")
        self.turns = int(turns)
        self.image = image
        self.system_prompt = "Find the hidden number with the `guess` tool, one guess per turn."

    def image_for(self, task: Task) -> str:
        return self.image

    def prompt(self, task: Task) -> str:
        return (f"I am thinking of a number from {task.extra['low']} to {task.extra['high']}. "
                f"Find it in at most {self.turns} guesses.")

    def reset(self, task: Task, sandbox: Sandbox) -> str:
        sandbox.write_file(GUESS_FILE, "")
        return self.prompt(task)

    def tool_handlers(self, task: Task, sandbox: Sandbox) -> dict:
        return {"guess": _Game(task, self.turns, sandbox).reply}

    def grade(self, task: Task, sandbox: Sandbox, patch: str | None = None) -> GradeResult:
        start = time.monotonic()
        try:
            lines = sandbox.read_file(GUESS_FILE).split()
        except FileNotFoundError:
            lines = []
        guesses = [int(x) for x in lines if x.lstrip("-").isdigit()][: self.turns]
        resolved = int(task.extra["secret"]) in guesses
        return GradeResult(task.instance_id, resolved=resolved, patch_applied=True,
                           tests_status={"found": "PASSED" if resolved else "FAILED"},
                           report={"secret": task.extra["secret"], "guesses": guesses}, empty_patch=not guesses,
                           duration_s=time.monotonic() - start)

    def demonstrations(self, n: int, rng: random.Random, seed: int, **_) -> list[list[dict]]:
        """`n` games played by guessing uniformly inside the range still possible (the format
        and the use of each reply, not the best guess), as user / assistant / tool messages."""
        out = []
        for task in make_guess_tasks(n, seed=rng.randrange(1 << 30)):  # not `seed`: rng may be seeded with it
            game, messages = _Game(task, self.turns), [{"role": "user", "content": self.prompt(task)}]
            while True:
                value = str(rng.randint(game.low, game.high))
                messages.append(call_message("guess", value=value))
                text, over = game.reply(value)
                messages.append({"role": "tool", "name": "guess", "content": text})
                if over:
                    break
            out.append(messages)
        return out
