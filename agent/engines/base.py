"""The engine protocol: token ids in, sampled token ids and their logprobs out, new weights in."""

from __future__ import annotations

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
