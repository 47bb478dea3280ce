"""A multi-turn verifiable env that the tiny model can learn: seek a hidden number with a pointer.

The numbers are 1 to 2^levels - 1 and the pointer starts in the middle. Each turn the agent
moves it `up` or `down` with the `move` tool; the steps halve (4, 2, 1 for 15 numbers), so
`levels - 1` moves can reach every number, and only the right direction at every move does.
Each reply says where the pointer is and whether the number is `up` or `down` from there (the
same word the tool takes), or that it is found (which ends the episode). Reward 1 when the
pointer lands on the number. A wrong move cannot be undone (the steps left are too short to
come back), so the first moves decide the outcome, and the reward comes only at the end.

Why this env next to `guess`: guessing the middle of a range means reading two bounds out of
the latest reply and picking the number between them, which the 2-layer tiny model did not
learn (BENCHMARKS.md, the learning section). Here the rule is to repeat the latest reply's
direction word. The SFT warm start (`demonstrations`) moves the way the reply says with
probability `demo_follow` (0.7) and the other way otherwise: it teaches the format, the game
and a noisy rule, found (2 f + 4 f^2 + 8 f^3) / 14 = 44% of the time with 15 numbers and f =
0.7; following every reply finds every number. With f = 0.5 (random moves, 3/14 found) the
tiny model did not pick the rule up from reward in 22 to 30 steps at policy lr 1e-4 to 4e-4
(BENCHMARKS.md): the rule has to be there, noisily, for reinforcement learning to sharpen it.

The moves are recorded in the rollout's sandbox (`MOVES_FILE`); grading replays them.
"""

from __future__ import annotations

import random
import time

from envs.base import EnvBase, GradeResult, Task, call_message, register_env
from sandbox.base import Sandbox
from sandbox.docker import DEFAULT_IMAGE

MOVES_FILE = "/testbed/.moves"
DIRECTIONS = ("up", "down")


def _check_levels(levels: int) -> int:
    if int(levels) < 2:
        raise ValueError(f"seek: levels must be at least 2 (numbers 1 to 3, one move), got {levels}")
    return int(levels)


def make_seek_tasks(n: int, seed: int = 0, levels: int = 4) -> list[Task]:
    """`n` tasks, each a secret drawn uniformly from 1 .. 2^levels - 1 other than the start (in `extra`)."""
    levels = _check_levels(levels)
    start, top = 1 << (levels - 1), (1 << levels) - 1
    rng = random.Random(seed)
    choices = [v for v in range(1, top + 1) if v != start]
    return [Task(instance_id=f"seek-{seed}-{i}", repo="seek", base_commit="-", problem_statement="",
                 extra={"secret": rng.choice(choices), "levels": levels}) for i in range(n)]


def replay(secret: int, levels: int, directions: list[str]) -> tuple[int, bool]:
    """Where the pointer ends and whether it landed on `secret`, after `directions` (at most
    levels - 1 of them are played; the game stops at the number)."""
    pointer, step = 1 << (levels - 1), 1 << (levels - 2)
    for d in directions[: levels - 1]:
        pointer += step if d == "up" else -step
        step //= 2
        if pointer == secret:
            return pointer, True
    return pointer, pointer == secret


class _Game:
    """One rollout's game: the moves so far; the pointer is where `replay` puts it."""

    def __init__(self, task: Task, sandbox: Sandbox | None = None):
        self.secret, self.levels = int(task.extra["secret"]), int(task.extra["levels"])
        self.sandbox = sandbox
        self.moves: list[str] = []

    @property
    def pointer(self) -> int:
        return replay(self.secret, self.levels, self.moves)[0]

    @property
    def left(self) -> int:
        return self.levels - 1 - len(self.moves)

    def side(self) -> str:
        return "up" if self.secret > self.pointer else "down"

    def reply(self, direction: str) -> tuple[str, bool]:
        """The tool's observation and whether the game is over; a ValueError for a bad direction."""
        d = str(direction).strip().lower()
        if d not in DIRECTIONS:
            raise ValueError(f"`direction` must be up or down, got {direction!r}")
        self.moves.append(d)
        if self.sandbox is not None:
            self.sandbox.write_file(MOVES_FILE, "\n".join(self.moves) + "\n")
        pointer, found = replay(self.secret, self.levels, self.moves)
        if found:
            return f"Found: the number is {pointer}.", True
        if self.left <= 0:
            return f"The pointer is at {pointer}. No moves left: the number was {self.secret}.", True
        return f"The pointer is at {pointer}; the number is {self.side()}. {self.left} move(s) left.", False


@register_env("seek")
class SeekEnv(EnvBase):
    tools = ("move",)

    def __init__(self, image: str = DEFAULT_IMAGE, demo_follow: float = 0.7):
        if not 0.0 <= float(demo_follow) <= 1.0:
            raise ValueError(f"env.demo_follow must be a probability (0 to 1), got {demo_follow}")
        self.image = image
        self.demo_follow = float(demo_follow)
        self.system_prompt = "Find the hidden number by moving the pointer with the `move` tool, one move per turn."

    def image_for(self, task: Task) -> str:
        return self.image

    def prompt(self, task: Task) -> str:
        game = _Game(task)
        steps = ", ".join(str(1 << i) for i in reversed(range(game.levels - 1)))
        return (f"A number from 1 to {(1 << game.levels) - 1} is hidden. The pointer is at {game.pointer}; "
                f"the number is {game.side()}. Each move goes up or down by {steps} in turn: "
                f"land on the number in at most {game.left} moves.")

    def reset(self, task: Task, sandbox: Sandbox) -> str:
        sandbox.write_file(MOVES_FILE, "")
        return self.prompt(task)

    def tool_handlers(self, task: Task, sandbox: Sandbox) -> dict:
        return {"move": _Game(task, sandbox).reply}

    def grade(self, task: Task, sandbox: Sandbox, patch: str | None = None) -> GradeResult:
        start = time.monotonic()
        try:
            moves = [m for m in sandbox.read_file(MOVES_FILE).split() if m in DIRECTIONS]
        except FileNotFoundError:
            moves = []
        levels = int(task.extra["levels"])
        pointer, found = replay(int(task.extra["secret"]), levels, moves)
        return GradeResult(task.instance_id, resolved=found, patch_applied=True,
                           tests_status={"found": "PASSED" if found else "FAILED"},
                           report={"secret": task.extra["secret"], "moves": moves[: levels - 1], "pointer": pointer},
                           empty_patch=not moves, duration_s=time.monotonic() - start)

    def demonstrations(self, n: int, rng: random.Random, seed: int, **_) -> list[list[dict]]:
        """`n` games that move the way the latest reply says with probability `demo_follow` and
        the other way otherwise (the format, the game and a noisy rule), as user / assistant /
        tool messages."""
        out = []
        for task in make_seek_tasks(n, seed=rng.randrange(1 << 30)):  # not `seed`: rng may be seeded with it
            game, messages = _Game(task), [{"role": "user", "content": self.prompt(task)}]
            while True:
                follow = rng.random() < self.demo_follow
                direction = game.side() if follow else ("down" if game.side() == "up" else "up")
                messages.append(call_message("move", direction=direction))
                text, over = game.reply(direction)
                messages.append({"role": "tool", "name": "move", "content": text})
                if over:
                    break
            out.append(messages)
        return out
