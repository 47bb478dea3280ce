"""The learner protocol every backend implements (torch.py, megatron.py), and `LayoutError`.

A learner owns the policy (and the critic, for algos that use one) and its optimizers. The
orchestrator calls `step` with a batch of trajectories, then hands `state_dict_for_engine()`
to the engine; `save` / `load` are the checkpoint's learner part. Where the engine shares the
learner's GPUs and sleeps while it steps, the orchestrator calls `release_memory` after the
step and before the engine wakes. A learner whose ranks hold shards (`collective`: Megatron)
runs step, weight export, save and load on every rank together; one whose ranks hold replicas
(torch) runs them on rank 0 alone, but for the step (and the release).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, Protocol

import torch

from agent.trajectory import Trajectory


class LayoutError(ValueError):
    """A parallel layout that does not fit the model, the world, or a checkpoint (said with the
    field and the value)."""


class Learner(Protocol):
    version: int  # policy updates made: the version the engine samples with after a sync
    collective: bool  # every rank takes part in step, weights, save and load (shards, not replicas)
    layout_summary: str | None  # the parallel layout in words, for the run's first lines

    def step(self, trajectories: list[Trajectory], group_ids: list[int] | None = None) -> dict[str, float]:
        """One optimizer step (critic updates included) on this batch; namespaced metrics."""

    def state_dict_for_engine(self) -> list[tuple[str, torch.Tensor]]:
        """The policy's weights under the engine's (HF) names."""

    def release_memory(self) -> None:
        """Give the GPU back what the step held only for itself (gradients where they are
        tensors of their own, the CUDA caching allocator's free blocks), so that what stays is
        the weights and the optimizer's states; every rank. Called between a step and a
        colocated engine's wake-up."""

    def weights_for_engine(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The same weights one tensor at a time on every rank, in the same order on each, each
        name once (a collective where the learner shards: every rank walks it to the end);
        runtime=ray's ranks send their shares of it to the engines."""

    def save(self, path: str | Path) -> None: ...

    def load(self, path: str | Path) -> None: ...
