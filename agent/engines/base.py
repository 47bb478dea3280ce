"""The engine protocol: token ids in, sampled token ids and their logprobs out, new weights in."""

from __future__ import annotations

import contextlib
import contextvars
import uuid
from dataclasses import dataclass, field
from typing import Iterable, Protocol

import torch


DTYPES = ("float32", "bfloat16", "float16")


def is_hub_name(name: str) -> bool:
    """`owner/model`, as a hub names a model: one slash, not a path (., / or ~ first)."""
    return not name.startswith((".", "/", "~")) and name.count("/") == 1


def resolve_dtype(dtype: str = "auto") -> str:
    """`auto` is bfloat16 where CUDA is available (real-size models are trained and served in
    it), else float32 (CPU kernels for half precision are slow or missing); others pass as given."""
    if dtype == "auto":
        return "bfloat16" if torch.cuda.is_available() else "float32"
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: choose auto or one of {', '.join(DTYPES)}")
    return dtype


def resolve_device(device: str = "auto") -> str:
    """`auto` is cuda where it is available, else cpu; a CUDA device asked for on a machine
    without CUDA is refused here, not at the first generation."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(device).type
    except RuntimeError as e:
        raise ValueError(f"device {device!r}: not a torch device (cpu, cuda, cuda:1, ...)") from e
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: CUDA is not available on this machine")
    return device


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
