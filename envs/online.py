"""The paper's online-learning env (§4.5), made verifiable: the rewarded writing style switches
as training goes on.

Each prompt asks for a short piece of writing on a topic and lists the candidate styles on
offer; the agent names the one it will write in through the `answer` tool. The reward is 1
when that is the style the current phase rewards. `phases` is a list of
`{start, pool, rewarded}`: from policy version `start` on, the prompt offers `pool` and
`rewarded` earns the reward. The default is the paper's three phases, cute -> chuunibyou ->
classical, the last with a changed pool (classical is new to it and cute is gone), switching at
versions 0, 12 and 24: twelve policy updates of 16 rollouts are enough for the tiny model
(+experiment=online) to go from its SFT start to most answers rewarded in the first phase, and
a run of 36 updates takes 7 to 10 minutes on 2 shared CPU cores (BENCHMARKS.md, online learning).

Phases are counted in policy versions: the `version` of the weights the engine samples with,
which the loop passes in (`versioned = True`, agent/loop.py). That is the number of policy
updates the learner has made and synced, not its step count: the critic-only warm-up steps of
SAO do not advance it (with the tiny model's 5 warm-up steps SAO reaches version 12 at step 17),
with `trainer.sync_every=s` it moves every s steps, and with `trainer.engine_lag=k` the engine
holds the weights of k versions ago, so every switch comes k learner steps later. The prompt
shows the pool of the phase at reset; grading rewards the style of the phase at grading (a
rollout that spans a switch is graded by the new rule, as a drifting preference would be).

The answer goes through the sandbox as prefer's does (`envs.arith.grade_answer`); the grade
report keeps `given` (the style answered) and `expected` (the style rewarded) and adds `phase`
and `version` (those at grading).
`record` names a JSONL file each grading appends that line to (experiments/online.py reads it
to count the share of each style answered).
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from envs.arith import grade_answer
from envs.base import EnvBase, GradeResult, Task, call_message, register_env
from sandbox.base import Sandbox
from sandbox.docker import DEFAULT_IMAGE

TOPICS = ["the sea", "a rainy morning", "an old cat", "the first snow", "a train station", "a broken clock",
          "the night market", "a lighthouse", "summer homework", "a lost umbrella", "the moon", "a bakery"]

# the paper's three phases; conf/env/online.yaml says the same (a test checks they agree)
DEFAULT_PHASES = [
    {"start": 0, "pool": ["cute", "chuunibyou", "plain", "formal"], "rewarded": "cute"},
    {"start": 12, "pool": ["cute", "chuunibyou", "plain", "formal"], "rewarded": "chuunibyou"},
    {"start": 24, "pool": ["classical", "chuunibyou", "poetic", "plain"], "rewarded": "classical"},
]


def make_online_tasks(n: int, seed: int = 0) -> list[Task]:
    """`n` writing requests, each on a topic (in `extra`; the styles on offer depend on the
    phase, so they are put in the prompt at reset)."""
    rng = random.Random(seed)
    return [Task(instance_id=f"online-{seed}-{i}", repo="online", base_commit="-", problem_statement="",
                 extra={"topic": rng.choice(TOPICS)}) for i in range(n)]


def check_phases(phases) -> list[dict]:
    """The phases as plain dicts, or a ValueError naming the field that cannot work."""
    if isinstance(phases, str) or not isinstance(phases, Sequence) or not phases:
        raise ValueError(f"env.phases must be a non-empty list of {{start, pool, rewarded}}, got {phases!r}")
    out = []
    for i, phase in enumerate(phases):
        field = f"env.phases[{i}]"
        if not isinstance(phase, Mapping) or set(phase.keys()) != {"start", "pool", "rewarded"}:
            raise ValueError(f"{field} = {phase!r}: needs exactly the keys start, pool, rewarded")
        start, pool, rewarded = phase["start"], phase["pool"], phase["rewarded"]
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ValueError(f"{field}.start = {start!r}: must be a whole number of policy versions >= 0")
        if i == 0 and start != 0:
            raise ValueError(f"{field}.start = {start!r}: the first phase must start at 0")
        if i > 0 and start <= out[-1]["start"]:
            raise ValueError(f"{field}.start = {start!r}: must be above env.phases[{i - 1}].start "
                             f"({out[-1]['start']}): phases are listed in order")
        if isinstance(pool, str) or not isinstance(pool, Sequence) or not pool:
            raise ValueError(f"{field}.pool = {pool!r}: must be a non-empty list of style names")
        pool = [str(s).strip() for s in pool]
        if any(not s for s in pool) or len(set(pool)) != len(pool):
            raise ValueError(f"{field}.pool = {pool!r}: style names must be non-empty and distinct")
        if str(rewarded).strip() not in pool:
            raise ValueError(f"{field}.rewarded = {rewarded!r}: not in its pool ({', '.join(pool)})")
        out.append({"start": start, "pool": pool, "rewarded": str(rewarded).strip()})
    return out


@register_env("online")
class OnlineEnv(EnvBase):
    tools = ("answer",)
    versioned = True  # reset and grade get the engine's policy version (agent/loop.py)

    def __init__(self, phases=None, record: str | None = None, image: str = DEFAULT_IMAGE):
        self.phases = check_phases(DEFAULT_PHASES if phases is None else phases)
        self.record = Path(record) if record else None
        self.image = image
        self.system_prompt = "Choose one of the styles on offer and name it with one call of the `answer` tool."
        self._lock = threading.Lock()

    def image_for(self, task: Task) -> str:
        return self.image

    def phase_at(self, version: int) -> int:
        """The index of the phase in force at policy `version`."""
        return max(i for i, p in enumerate(self.phases) if p["start"] <= version)

    def prompt(self, topic: str, pool: list[str]) -> str:
        return f"Write a short piece about {topic}. Styles on offer: {', '.join(pool)}. Which style will you write it in?"

    def reset(self, task: Task, sandbox: Sandbox, version: int = 0) -> str:
        return self.prompt(task.extra["topic"], self.phases[self.phase_at(version)]["pool"])

    def grade(self, task: Task, sandbox: Sandbox, patch: str | None = None, version: int = 0) -> GradeResult:
        phase = self.phase_at(version)
        result = grade_answer(task, sandbox, lambda: self.phases[phase]["rewarded"])
        result.report.update(phase=phase, version=version)
        if self.record is not None:
            line = json.dumps({"instance_id": task.instance_id, **result.report, "reward": result.reward})
            with self._lock, self.record.open("a") as f:
                f.write(line + "\n")
        return result

    def demonstrations(self, n: int, rng: random.Random, seed: int, **_) -> list[list[dict]]:
        """`n` requests, each offering the pool of a random phase and answered with a style drawn
        uniformly from it: the format and the pools are taught, not which style pays."""
        out = []
        for task in make_online_tasks(n, seed=seed):
            pool = rng.choice(self.phases)["pool"]
            out.append([{"role": "user", "content": self.prompt(task.extra["topic"], pool)},
                        call_message("answer", value=rng.choice(pool))])
        return out
