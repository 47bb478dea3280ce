"""runtime=local: the whole run in this process, or rank 0 of a torchrun group.

    torchrun --nproc-per-node N -m training.run [overrides]

Rank 0 runs everything a one-process run does (engine, sandboxes, the stream, checkpoints)
and drives the learner; every other rank builds its part of the learner (a replica of the
torch learner's policy and critic, or its Megatron shard) and only follows (`follow`): rank 0
broadcasts each command (a step's trajectories, the step's memory to release, weights for the
engine, a checkpoint to save or load, stop), and each rank carries it out
(`runtime.base.run_command`). The torch learner's replicas take part in the step and the
release alone; the Megatron learner's shards in every command.
"""

from __future__ import annotations

import os
import signal

import torch
import torch.distributed as dist
from omegaconf import DictConfig

from training import collectives
from training.console import console
from training.factories import make_learner, prepare_model
from training.learners.base import Learner
from training.runtime.base import run_command


class LearnerGroup:
    """Rank 0's handle on the learner: each command the other ranks take part in is sent to
    them first, then run here; the rest (version, the replica's weights) is rank 0's own."""

    def __init__(self, learner: Learner, world: int):
        self.learner, self.world = learner, world

    def __getattr__(self, name):
        return getattr(self.learner, name)

    def _run(self, command: str, *args, everywhere: bool = True):
        if everywhere:
            dist.broadcast_object_list([(command, *args)], src=0)
        return run_command(self.learner, self.world, command, *args)

    def step(self, trajectories, group_ids=None):
        return self._run("step", trajectories, group_ids)

    def release_memory(self) -> None:
        self._run("release")  # every rank: the engine's tensor-parallel workers may sit beside any of them

    def state_dict_for_engine(self):
        return self._run("weights", everywhere=self.learner.collective)

    def save(self, path) -> None:
        self._run("save", str(path), everywhere=self.learner.collective)

    def load(self, path) -> None:
        self._run("load", str(path))

    def close(self) -> None:
        dist.broadcast_object_list([("stop",)], src=0)
        dist.destroy_process_group()


def follow(learner: Learner, world: int) -> None:
    """Carry out rank 0's commands on this rank's learner until it says stop. A SIGTERM or
    Ctrl-C (torchrun passes them to every rank) is rank 0's to act on: it saves, with this
    rank's part, and then says stop."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=0)
        command, *args = box[0]
        if command == "stop":
            dist.destroy_process_group()
            return
        try:
            run_command(learner, world, command, *args)
        except ValueError:  # a checkpoint this learner refuses (load): rank 0 says why, then sends stop
            if command != "load":
                raise


def split_cpus(n: int) -> tuple[list[int], list[int]]:
    """The engine's `n` CPUs (the last this process may use) and the rest. vLLM's CPU worker binds
    its OpenMP threads to VLLM_CPU_OMP_THREADS_BIND (read when its engine starts); this thread,
    and the threads and processes it starts from now on, keep to the rest, and torch's intra-op
    threads match their number. Call before the engine and the learner are made."""
    cpus = sorted(os.sched_getaffinity(0))
    if not 1 <= n < len(cpus):
        raise ValueError(f"engine_cpus {n}: this process may use {len(cpus)} CPUs; give the engine 1 to {len(cpus) - 1}")
    engine, rest = cpus[-n:], cpus[:-n]
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, engine))
    os.sched_setaffinity(0, rest)
    torch.set_num_threads(len(rest))
    return engine, rest


class LocalRuntime:
    """This process (rank 0 of `WORLD_SIZE` under torchrun): the learner is built here, the
    engine and rollouts by the run itself."""

    engine = None
    rollout = None

    def __init__(self, cfg: DictConfig):
        self.rank = collectives.init_from_env(cfg.get("local", {}).get("rank_timeout_s"))
        self.is_main = self.rank.is_main
        path = prepare_model(cfg.model) if self.is_main else None  # (an SFT warm start on every CPU)
        engine_cpus = cfg.get("local", {}).get("engine_cpus")
        if engine_cpus and self.is_main:
            engine, rest = split_cpus(int(engine_cpus))
            console.print(f"CPUs: the engine's threads on {engine}, the learner and the rollouts on {rest} (local.engine_cpus)")
        self.model_path = collectives.broadcast_object(path) if self.rank.world > 1 else path
        learner = make_learner(cfg, self.model_path)  # a LayoutError is raised on every rank alike
        if self.rank.world > 1 and self.is_main:
            console.print(f"learner: {self.rank.world} ranks, {learner.layout_summary}" if learner.layout_summary
                          else f"learner: {self.rank.world} data-parallel ranks")
            learner = LearnerGroup(learner, self.rank.world)
        self.learner = learner

    def follow(self) -> int:
        follow(self.learner, self.rank.world)
        return 0

    def close(self) -> None:
        if self.rank.world > 1 and self.is_main:
            self.learner.close()

    def __enter__(self) -> "LocalRuntime":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
