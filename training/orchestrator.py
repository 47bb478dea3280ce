"""The orchestrator: rollout workers, the learner, and weight sync, on one asyncio loop.

Async mode (SAO's): N workers each loop task -> sandbox -> agent -> grade -> push; the learner
takes a batch as soon as enough rollouts have arrived, steps, and every `sync_every` steps
pushes its weights to the engine under a new version. Workers never wait for a batch.
Sync mode (the GRPO way): each step starts a whole batch, waits for all of it, trains, syncs.
The two share every part but the loop. Blocking work (engine, Docker, the learner step) runs
in threads; the stream and the bookkeeping stay on the event loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import functools
import logging
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from agent.loop import Agent
from agent.rollout import rollout_and_grade
from agent.trajectory import EXIT_REASONS, Trajectory
from envs.base import Env, Task
from sandbox.pool import SandboxPool
from training import timings
from training.buffer import RolloutStream

log = logging.getLogger(__name__)


@dataclass
class Source:
    """One stream of training tasks: an env, its tasks, the agent that runs them, a weight."""

    name: str
    env: Env
    tasks: list[Task]
    agent: Agent
    weight: int = 1


class TaskSampler:
    """An endless, seeded, shuffled sequence of (key, source, task). Each rollout's key is
    unique, so a resumed run counts none twice; keys drawn but not finished at a checkpoint
    are drawn again first after a resume, so none is lost."""

    def __init__(self, sources: list[Source], seed: int = 0):
        self.items = [(s, t) for s in sources for t in s.tasks for _ in range(s.weight)]
        assert self.items, "no training tasks"
        self.seed = seed
        self.drawn = 0
        self.redo: list[int] = []
        self.in_flight: set[int] = set()
        self._perms: dict[int, list[int]] = {}

    def next(self) -> tuple[int, Source, Task]:
        key = self.redo.pop(0) if self.redo else self._draw()
        self.in_flight.add(key)
        epoch, i = divmod(key, len(self.items))
        if epoch not in self._perms:
            perm = list(range(len(self.items)))
            random.Random(self.seed * 100_003 + epoch).shuffle(perm)
            self._perms = {epoch: perm}
        source, task = self.items[self._perms[epoch][i]]
        return key, source, task

    def _draw(self) -> int:
        self.drawn += 1
        return self.drawn - 1

    def done(self, key: int) -> None:
        self.in_flight.discard(key)

    def again(self, key: int) -> None:
        """A rollout that was lost, not failed (its worker died): its key is drawn again next."""
        self.in_flight.discard(key)
        self.redo.append(key)

    def state_dict(self) -> dict[str, Any]:
        return {"drawn": self.drawn, "redo": sorted(self.redo + list(self.in_flight))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.drawn, self.redo, self.in_flight = state["drawn"], list(state["redo"]), set()


class RolloutLost(RuntimeError):
    """The worker running a rollout died (runtime=ray: its actor); the task is drawn again."""


class RolloutsFailing(RuntimeError):
    """Rollouts failed back to back (`RunConfig.max_failed_in_a_row`): the run cannot go on."""


@dataclass
class RunConfig:
    mode: str = "async"  # or "sync"
    batch_size: int = 16  # rollouts per learner step (prompts x group_size)
    batch_tokens: int | None = None  # async: take batches by this token budget instead of batch_size rollouts
    group_size: int = 1  # rollouts per prompt (SAO: 1; GRPO: G)
    sync_every: int = 1
    num_workers: int = 2
    max_steps: int = 30
    checkpoint_every: int = 10
    keep_checkpoints: int = 3  # the newest this many checkpoints are kept
    keep_every: int = 0  # and every checkpoint whose step is a multiple of this (0: none more)
    max_staleness: int = 4
    stale_policy: str = "drop"
    engine_lag: int = 0  # the engine samples with the policy of this many versions ago
    max_in_flight: int | None = None  # default: batch_size + num_workers * group_size
    max_failed_in_a_row: int = 32  # rollouts failing back to back (Docker gone, say): the run stops
    log_tokens: bool = False  # rollouts.jsonl also keeps each trained rollout's tokens (offline critic studies)
    seed: int = 0


class Orchestrator:
    def __init__(self, cfg: RunConfig, sampler: TaskSampler, pool: SandboxPool, engine, learner,
                 on_step: Callable[[int, dict, list[Trajectory]], None], start_step: int = 0,
                 stream: RolloutStream | None = None,
                 rollout: Callable[[Source, Task, int], Awaitable[Trajectory]] | None = None):
        """`rollout(source, task, seed)`: where a rollout runs; by default a thread of this
        process, on its Docker engine (runtime=ray passes rollout actors on the cluster's nodes)."""
        if cfg.batch_size % cfg.group_size:
            raise ValueError(f"batch_size {cfg.batch_size} must be a multiple of group_size {cfg.group_size}")
        in_flight = cfg.max_in_flight or cfg.batch_size + cfg.num_workers * cfg.group_size
        if in_flight < cfg.batch_size:
            raise ValueError(f"max_in_flight {in_flight} is below batch_size {cfg.batch_size}: the learner would wait forever")
        self.cfg, self.sampler, self.pool, self.engine, self.learner = cfg, sampler, pool, engine, learner
        self.stream = stream or RolloutStream(cfg.max_staleness, cfg.stale_policy, in_flight)
        self.on_step = on_step
        self.step = start_step
        self.rollout = rollout or self._rollout_here
        self.rollout_errors = 0
        self.rollouts_lost = 0
        self._failed_in_a_row = 0
        self._wait_s = 0.0
        self._batch_wait_s = 0.0
        self._step_mark = 0.0
        self._after_step: dict[str, float] = {"checkpoint": 0.0, "log": 0.0}  # the last step's, for the next
        self._start = 0.0
        self._past: collections.deque = collections.deque()  # engine_lag: the weights not yet given to the engine
        self._given = None  # engine_lag: the (weights, version) the engine samples with now
        self.stop_reason: str | None = None  # set by `request_stop`: the run ends after the step under way
        self._stop = asyncio.Event()

    def request_stop(self, reason: str) -> None:
        """End the run cleanly (a signal, say): the step under way finishes, no new one starts,
        a batch being waited for is not (its rollouts are drawn again on resume)."""
        if self.stop_reason is None:
            self.stop_reason = reason
            log.warning("stopping after the step under way (%s)", reason)
        self._stop.set()

    def _going(self) -> bool:
        return self.step < self.cfg.max_steps and self.stop_reason is None

    async def run(self) -> None:
        # Threads of their own: asyncio.to_thread's default pool has min(32, CPUs + 4) threads (6
        # on 2 cores), so more workers than that ran 6 rollouts at a time, and a learner step or a
        # weight sync queued behind rollouts holding every thread. The rollouts' pool has a
        # thread per worker (made as they are needed); the learner, the sync and the engine's
        # sleep and wake-up one thread, in order.
        self._rollout_threads = ThreadPoolExecutor(self.cfg.num_workers, thread_name_prefix="rollout")
        self._learner_thread = ThreadPoolExecutor(1, thread_name_prefix="learner")
        try:
            await self._run()
        finally:  # rollouts still running finish (as asyncio.run waits for its default pool's threads)
            for pool in (self._learner_thread, self._rollout_threads):
                await asyncio.get_running_loop().run_in_executor(
                    None, functools.partial(pool.shutdown, wait=True, cancel_futures=True))

    async def _on(self, pool: ThreadPoolExecutor, fn, *args):
        """`fn(*args)` on a thread of `pool` (this context's variables with it, as to_thread does)."""
        ctx = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(pool, functools.partial(ctx.run, fn, *args))

    async def _run(self) -> None:
        self._start = self._step_mark = time.monotonic()
        if self.cfg.engine_lag and self._given is None:  # what the engine starts with, for a checkpoint
            self._given = (self._snapshot(self.learner.state_dict_for_engine()), self.learner.version)
        self._engine_busy0 = self.engine.busy_s
        if self.cfg.mode == "async":
            # num_workers rollouts at once, whatever the group size (a group's run side by side)
            self._slots = asyncio.Semaphore(self.cfg.num_workers)
            workers = [asyncio.create_task(self._worker(i)) for i in range(self.cfg.num_workers)]
            try:
                while self._going():
                    t0 = time.monotonic()
                    batch = await self._take_unless_a_worker_fails(workers, hold=self._one_version_later_is_too_old())
                    self._batch_wait_s = time.monotonic() - t0
                    self._wait_s += self._batch_wait_s
                    if batch is None:  # asked to stop while waiting
                        break
                    try:
                        await self._learn(batch)
                    finally:  # only the next batch, if a rollout that misses its take is dropped
                        only_the_batch = self._one_version_later_is_too_old() and not self.cfg.batch_tokens
                        await self.stream.open_starts(self.cfg.batch_size if only_the_batch else None)
            finally:
                for w in workers:
                    w.cancel()
                await asyncio.gather(*workers, return_exceptions=True)
        elif self.cfg.mode == "sync":
            while self._going():
                t0 = time.monotonic()
                slots = asyncio.Semaphore(self.cfg.num_workers)
                n_groups = self.cfg.batch_size // self.cfg.group_size
                gathering = asyncio.gather(*[self._group(slots) for _ in range(n_groups)])
                stop = asyncio.create_task(self._stop.wait())
                await asyncio.wait([gathering, stop], return_when=asyncio.FIRST_COMPLETED)
                stop.cancel()
                if not gathering.done():  # asked to stop: the batch's rollouts are drawn again on resume
                    gathering.cancel()
                    await asyncio.gather(gathering, return_exceptions=True)
                    break
                groups = gathering.result()
                batch = [t for g in groups if g for t in g]
                self._batch_wait_s = time.monotonic() - t0  # the learner waits for the whole batch
                self._wait_s += self._batch_wait_s
                if batch:  # empty only when every rollout of it failed (counted in rollout/errors)
                    await self._learn(batch)
        else:
            raise ValueError(f"mode must be 'async' or 'sync', got {self.cfg.mode!r}")

    def _one_version_later_is_too_old(self) -> bool:
        """Whether a rollout started now and taken at one learner version more than now would be
        past the staleness bound, and dropped: it samples with the engine's weights of now. So
        at every step once `engine_lag` = `max_staleness` has its k versions (BENCHMARKS.md's
        lagged runs); never with `stale_policy=keep`. Then a rollout started while the learner
        steps misses the take before the step and is dropped at the next, and one still running
        at a take is dropped at the one after it: so no rollout starts during a step (the take
        holds starts), and after it only the next batch's (by count) start. The engine would
        otherwise sample, on the machine the learner steps on, rollouts only to throw them away."""
        return (self.cfg.stale_policy == "drop"
                and self.learner.version + 1 - self.engine.version > self.cfg.max_staleness)

    async def _take_unless_a_worker_fails(self, workers: list[asyncio.Task], hold: bool = False) -> list[Trajectory] | None:
        """The next batch (with `hold`, rollout starts held from then on: the caller opens
        them); a worker only ends by raising (too many failures), and then so does this. None
        if the run is asked to stop meanwhile."""
        by = {"token_budget": self.cfg.batch_tokens} if self.cfg.batch_tokens else {"count": self.cfg.batch_size}
        take = asyncio.create_task(self.stream.take(self.learner.version, hold=hold, **by))
        stop = asyncio.create_task(self._stop.wait())
        await asyncio.wait([take, stop, *workers], return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if take.done():
            return take.result()
        take.cancel()
        await asyncio.gather(take, return_exceptions=True)  # its rollouts go back to the queue
        if self._stop.is_set():
            return None
        for w in workers:
            if w.done():
                w.result()  # raises the worker's error
        raise AssertionError("a rollout worker ended without an error")

    async def _worker(self, index: int) -> None:
        while True:
            await self.stream.reserve(self.cfg.group_size)
            group = await self._group(self._slots)
            if group is None:
                await self.stream.release(self.cfg.group_size)
                continue
            await self.stream.push_group(group)

    async def _group(self, slots: asyncio.Semaphore | None) -> list[Trajectory] | None:
        """G rollouts of one task (G = group_size), at the same time, each holding one of
        `slots` (the run's concurrent rollouts) while it runs; None if the sandbox machinery
        failed for any of them (the group is incomplete, so none is trained on)."""
        key, source, task = self.sampler.next()
        try:
            results = await asyncio.gather(*[self._member(source, task, key, g, slots)
                                              for g in range(self.cfg.group_size)], return_exceptions=True)
            for r in results:  # a cancelled member is not a failed rollout
                if isinstance(r, BaseException) and not isinstance(r, Exception):
                    raise r
            failed = [r for r in results if isinstance(r, Exception)]
            if failed:  # a lost one first: then the task is drawn again
                raise next((e for e in failed if isinstance(e, RolloutLost)), failed[0])
            group = list(results)
        except Exception as e:
            lost = isinstance(e, RolloutLost)  # its worker died: nothing was learnt of the task, so it is drawn again
            if lost:
                self.rollouts_lost += 1
                self.sampler.again(key)
            else:  # an infrastructure fault: counted, logged, the run goes on
                self.rollout_errors += 1
                self.sampler.done(key)
            self._failed_in_a_row += 1  # (workers that never come back stop the run as failures do)
            log.warning("rollout of %s %s: %s", task.instance_id, "lost; it will be drawn again" if lost else "failed", e)
            if self._failed_in_a_row >= self.cfg.max_failed_in_a_row:
                raise RolloutsFailing(f"{self._failed_in_a_row} rollouts in a row failed or were lost "
                                      f"(trainer.max_failed_in_a_row); the last, {task.instance_id}: {e}") from e
            return None
        self._failed_in_a_row = 0
        self.sampler.done(key)
        return group

    async def _member(self, source: Source, task: Task, key: int, g: int,
                      slots: asyncio.Semaphore | None) -> Trajectory:
        seed = (self.cfg.seed * 1_000_003 + key) * 97 + g
        async with slots or contextlib.nullcontext():
            traj = await self.rollout(source, task, seed)
        if traj.exit_reason == "sandbox_error":  # the container failed, not the policy: no reward to learn
            raise RuntimeError(f"sandbox error: {traj.info.get('error', 'the sandbox failed')}")
        traj.info.update(rollout_key=f"{key}/{g}", source=source.name)
        return traj

    async def _rollout_here(self, source: Source, task: Task, seed: int) -> Trajectory:
        return await self._on(self._rollout_threads, rollout_and_grade, source.agent, task, source.env, self.pool, seed)

    async def _learn(self, batch: list[Trajectory]) -> None:
        version_before = self.learner.version
        group_ids = [i // self.cfg.group_size for i in range(len(batch))]
        t0 = time.monotonic()
        sleeps = getattr(self.engine, "sleep_during_step", False)  # colocated on GPUs: the engine frees them
        if sleeps:
            await self._on(self._learner_thread, self.engine.sleep)
        try:
            metrics = await self._on(self._learner_thread, self.learner.step, batch, group_ids)
        finally:
            if sleeps:
                await self._on(self._learner_thread, self._release_then_wake)
        learn_s = time.monotonic() - t0
        self.step += 1
        sync_s = 0.0
        if self.learner.version != version_before and self.step % self.cfg.sync_every == 0:
            t1 = time.monotonic()
            synced = self._lagged(self.learner.state_dict_for_engine(), self.learner.version)
            if synced is not None:
                await self._on(self._learner_thread, self.engine.update_weights, *synced)
            sync_s = time.monotonic() - t1  # (a lagged engine's snapshot counts, sent or not)
        now = time.monotonic()
        elapsed = max(now - self._start, 1e-9)
        # this step's phases, and the previous step's checkpoint and log, which ran in between
        metrics.update(timings.step_metrics({"batch_wait": self._batch_wait_s, "learner": learn_s,
                                             "weight_sync": sync_s, **self._after_step},
                                            now - self._step_mark))
        metrics.update(timings.rollout_metrics(batch))
        metrics.update(self.stream.metrics(batch, version_before))
        metrics.update({
            "time/learner_idle_frac": self._wait_s / elapsed,
            "time/engine_idle_frac": max(0.0, 1 - (self.engine.busy_s - self._engine_busy0) / elapsed),
            "time/elapsed_s": elapsed,
            "rollout/errors": float(self.rollout_errors),
            "rollout/lost": float(self.rollouts_lost),
            "rollout/turns_mean": sum(t.turns for t in batch) / len(batch),
            # patches that edit test infrastructure the task does not name (rejected with env.reject_test_edits)
            "rollout/test_edits_frac": sum(bool(t.info.get("grade", {}).get("test_edits")) for t in batch) / len(batch),
            # graded logs whose canary tests did not read pass and fail (envs/canary.py): reward 0
            "reward/tampered": sum(bool(t.info.get("grade", {}).get("tampered")) for t in batch) / len(batch),
            # a scaffold behind the rollout endpoint (agent.recorder): turns whose rendering departed from the
            # sampled ids (trained as observation), and turns re-rendered differently but kept as sampled
            "rollout/retokenized_turns": float(sum(t.info.get("retokenized_turns", 0) for t in batch)),
            "rollout/repaired_turns": float(sum(t.info.get("repaired_turns", 0) for t in batch)),
            "engine/version": float(self.engine.version),
            "engine/batch_size_mean": getattr(self.engine, "batch_size_mean", 0.0),  # requests decoded together
        })
        metrics.update(self.engine.metrics() if hasattr(self.engine, "metrics") else {})
        metrics.update(self.pool.metrics() if hasattr(self.pool, "metrics") else {})  # sandbox/disk_quota: the bound in force
        for reason in EXIT_REASONS:
            metrics[f"exit/{reason}"] = sum(t.exit_reason == reason for t in batch) / len(batch)
        self._step_mark = now  # the next step's wall time starts here, its log and checkpoint included
        t2 = time.monotonic()
        spent = self.on_step(self.step, metrics, batch) or {}  # {"checkpoint": seconds} when it saved one
        self._after_step = {"checkpoint": spent.get("checkpoint", 0.0)}
        self._after_step["log"] = max(0.0, time.monotonic() - t2 - self._after_step["checkpoint"])

    def _release_then_wake(self) -> None:
        """Colocated: the learner hands back what its step held for itself (without it the CUDA
        cache keeps the step's peak reserved), then the engine takes its share again; the
        weight sync comes after. So: sleep, step, release, wake, sync."""
        try:
            self.learner.release_memory()
        finally:
            self.engine.wake_up()

    @staticmethod
    def _snapshot(weights):
        """The weights as they are now: a list of tensors is cloned to the CPU, a handle to an
        object store (runtime=ray) is already a snapshot."""
        if isinstance(weights, list):
            return [(name, t.detach().to("cpu", copy=True)) for name, t in weights]
        return weights

    def _lagged(self, weights, version: int):
        """(weights, version) for the engine: the latest, or with `engine_lag` = k those of k
        versions ago (None until there are k + 1: the engine keeps what it has)."""
        if not self.cfg.engine_lag:
            return weights, version
        self._past.append((self._snapshot(weights), version))
        if len(self._past) > self.cfg.engine_lag:
            self._given = self._past.popleft()
            return self._given
        return None

    def lag_state(self) -> list[tuple[list, int]]:
        """engine_lag: the engine's weights and those queued for it, oldest first, as lists of
        (name, CPU tensor) with their versions (empty without a lag). A checkpoint keeps them, so
        a resumed run samples k versions behind from its first step, as the stopped one did."""
        entries = ([self._given] if self._given is not None else []) + list(self._past)
        out = []
        for weights, version in entries:
            out.append((weights if isinstance(weights, list) else weights.fetch(), version))  # fetch: RayWeights
        return out

    def load_lag_state(self, entries: list[tuple[list, int]]) -> tuple[list, int]:
        """Take `lag_state()`'s entries back (the newest k + 1 where the lag changed); returns
        the (weights, version) the engine is to sample with."""
        entries = entries[-(self.cfg.engine_lag + 1):]
        self._given, self._past = entries[0], collections.deque(entries[1:])
        return self._given

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "sampler": self.sampler.state_dict(), "stream": self.stream.state_dict()}


def evaluate(source: Source, pool: SandboxPool, workers: int = 2, seed: int = 10_007) -> float:
    """Mean reward of one rollout per task of `source` with the engine's current weights."""
    from concurrent.futures import ThreadPoolExecutor

    def one(i_task):
        i, task = i_task
        return rollout_and_grade(source.agent, task, source.env, pool, seed=seed + i).reward

    with ThreadPoolExecutor(workers) as ex:
        rewards = list(ex.map(one, enumerate(source.tasks)))
    return sum(rewards) / len(rewards)
