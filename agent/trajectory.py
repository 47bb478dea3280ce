"""`Trajectory`: one rollout as the learner sees it (tokens, mask, behaviour logprobs, policy
versions, reward) and as a person reads it (messages), saved as `<instance_id>.traj.json`."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# sandbox_killed: a command stopped its own sandbox (the policy's doing: reward 0, trained on);
# sandbox_error: the infrastructure failed (no reward to learn from: not trained on)
EXIT_REASONS = ("submitted", "max_turns", "context_full", "timeout", "format_errors", "sandbox_killed", "sandbox_error")


@dataclass
class Trajectory:
    instance_id: str
    prompt_ids: list[int]  # [P] the rendered system + user turn, generation prompt included
    completion_ids: list[int] = field(default_factory=list)  # [T] everything after the prompt
    loss_mask: list[int] = field(default_factory=list)  # [T] 1 on sampled tokens, 0 on tool output
    logprobs: list[float] = field(default_factory=list)  # [T] sampler logprob; 0.0 where mask is 0
    policy_version: list[int] = field(default_factory=list)  # [T] version that sampled it; -1 if mask 0
    messages: list[dict[str, Any]] = field(default_factory=list)  # for humans (and the viewer)
    exit_reason: str = ""
    reward: float = 0.0
    turns: int = 0
    timings: dict[str, float] = field(default_factory=dict)  # seconds: generate, tools, grade, total
    info: dict[str, Any] = field(default_factory=dict)  # grading report, model, engine, limits

    def append_sampled(self, token_ids: list[int], logprobs: list[float], version: int | list[int]) -> None:
        """`version`: the one that sampled them all, or each token's own (a sync mid-turn)."""
        assert len(token_ids) == len(logprobs)
        versions = [version] * len(token_ids) if isinstance(version, int) else list(version)
        assert len(versions) == len(token_ids)
        self.completion_ids += token_ids
        self.loss_mask += [1] * len(token_ids)
        self.logprobs += logprobs
        self.policy_version += versions

    def append_observation(self, token_ids: list[int]) -> None:
        self.completion_ids += token_ids
        self.loss_mask += [0] * len(token_ids)
        self.logprobs += [0.0] * len(token_ids)
        self.policy_version += [-1] * len(token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)

    @property
    def num_sampled(self) -> int:
        return sum(self.loss_mask)

    def check(self) -> None:
        """Invariants every consumer relies on."""
        n = len(self.completion_ids)
        assert len(self.loss_mask) == len(self.logprobs) == len(self.policy_version) == n
        assert not self.exit_reason or self.exit_reason in EXIT_REASONS, self.exit_reason

    def save(self, out_dir: str | Path) -> Path:
        self.check()
        path = Path(out_dir) / f"{self.instance_id}.traj.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self)))
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Trajectory":
        return cls(**json.loads(Path(path).read_text()))
