"""The runtime interface, and the learner commands every runtime's ranks carry out.

A runtime starts the learner (on one or more ranks) and, where it places them itself, the
engine and the rollout workers; `training/lifecycle.py` then runs the same loop over whatever
it was given. Both runtimes drive their learner ranks with the same commands (`run_command`):
torchrun's followers receive them by broadcast, Ray's learner actors by remote call.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from agent.engines.base import Engine
from training.collectives import replica_spread
from training.learners.base import Learner

COMMANDS = ("step", "release", "weights", "save", "load")


class ClusterError(ValueError):
    """A setting the cluster cannot run (said with the field and the value)."""


class Runtime(Protocol):
    model_path: str  # the checkpoint the run starts from (the tiny model + SFT, or model.path)
    learner: Learner  # rank 0's handle: a call runs on every rank that must take part
    engine: Engine | None  # None: the run builds its engine in this process (training/factories.py)
    rollout: Callable[..., Any] | None  # None: rollouts run in this process's threads
    is_main: bool  # False on a torchrun rank > 0, which only `follow`s

    def follow(self) -> int:
        """A rank > 0's whole job: carry out rank 0's learner commands until it says stop."""

    def close(self) -> None: ...


def run_command(learner: Learner, world: int, command: str, *args) -> Any:
    """One learner command on this rank, as every rank carries it out. A step on data-parallel
    replicas also measures how far apart they are (0 when they agree, as they must)."""
    if command == "step":
        metrics = learner.step(*args)
        if world > 1 and not learner.collective:
            metrics["learner/replica_spread"] = replica_spread(learner)
        return metrics
    if command == "release":  # between a step and a colocated engine's wake-up: every rank, its own GPU
        return learner.release_memory()
    if command == "weights":
        return learner.state_dict_for_engine()
    if command == "save":
        return learner.save(*args)
    if command == "load":
        return learner.load(*args)
    raise AssertionError(f"unknown learner command {command!r} (known: {', '.join(COMMANDS)})")
