"""The engine protocol: token ids in, sampled token ids and their logprobs out, new weights in."""

from __future__ import annotations

import contextlib
import contextvars
import uuid
from dataclasses import dataclass, field
from typing import Iterable, Protocol

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion. temperature 0 is greedy (logprobs of the raw distribution)."""

    max_new_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    seed: int | None = None


@dataclass
class Completion:
    token_ids: list[int]  # [T] as sampled, the stop token included when one ended it
    logprobs: list[float]  # [T] the sampler's logprob of each token, from the distribution it sampled
    finish_reason: str  # "stop" | "length"
    # [T] the policy version that sampled each token, where the engine knows it (vLLM's async
    # engine: a sync in mid-request splits it); None: the version the engine had when asked
    versions: list[int] | None = None


class Engine(Protocol):
    version: int

    def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion: ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None: ...


# The rollout a request belongs to, for engines that route (agent.engines.router): the agent
# opens one session per rollout, and every turn of it is sent within that session.
_SESSION: contextvars.ContextVar[str | None] = contextvars.ContextVar("engine_session", default=None)


def current_session() -> str | None:
    return _SESSION.get()


@contextlib.contextmanager
def session(key: str | None = None):
    """Within this block, this thread's requests belong to one rollout (a fresh key if none)."""
    token = _SESSION.set(key or uuid.uuid4().hex)
    try:
        yield _SESSION.get()
    finally:
        _SESSION.reset(token)
