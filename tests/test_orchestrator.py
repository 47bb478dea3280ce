"""The orchestrator's edges: a rollout whose sandbox failed is an infrastructure fault (counted,
never trained on), and rollouts that keep failing stop the run with the reason instead of
leaving the learner waiting forever. The rollout function is replaced here (a unit test): the
real path, with containers, runs in tests/test_training_run.py."""

import asyncio

import pytest

import training.orchestrator as orchestrator
from agent.trajectory import Trajectory
from envs.base import Task
from training.orchestrator import Orchestrator, RolloutsFailing, RunConfig, Source, TaskSampler


class Engine:
    busy_s = 0.0
    requests = batches = 0
    version = 0

    def update_weights(self, named_tensors, version):
        self.version = version


class Learner:
    version = 0

    def __init__(self):
        self.batches = []

    def step(self, batch, group_ids):
        self.batches.append(batch)
        self.version += 1
        return {"reward/mean": sum(t.reward for t in batch) / len(batch)}

    def state_dict_for_engine(self):
        return []


def rollout(sandbox_fails):
    """A stand-in for agent.rollout.rollout_and_grade: `sandbox_fails(task)` decides."""
    def run(agent, task, env, pool, seed):
        if sandbox_fails(task):
            return Trajectory(task.instance_id, prompt_ids=[], exit_reason="sandbox_error", info={"error": "gone"})
        t = Trajectory(task.instance_id, prompt_ids=[1, 2], reward=1.0, exit_reason="submitted")
        t.append_sampled([3], [-0.5], 0)
        return t
    return run


def orchestrate(monkeypatch, sandbox_fails, mode="async", max_steps=3, **run):
    monkeypatch.setattr(orchestrator, "rollout_and_grade", rollout(sandbox_fails))
    tasks = [Task(instance_id=f"t{i}", repo="r", base_commit="-", problem_statement="p") for i in range(8)]
    sampler = TaskSampler([Source("s", env=None, tasks=tasks, agent=None)], seed=0)
    cfg = RunConfig(**{"mode": mode, "batch_size": 2, "num_workers": 2, "max_steps": max_steps,
                       "max_failed_in_a_row": 4, **run})
    learner = Learner()
    orch = Orchestrator(cfg, sampler, pool=None, engine=Engine(), learner=learner, on_step=lambda *a: None)
    return orch, learner


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_sandbox_errors_are_counted_and_never_trained_on(monkeypatch, mode):
    orch, learner = orchestrate(monkeypatch, lambda task: task.instance_id in ("t1", "t4"), mode)
    asyncio.run(orch.run())
    trained = [t.instance_id for batch in learner.batches for t in batch]
    assert len(learner.batches) == 3 and trained and not {"t1", "t4"} & set(trained)
    assert orch.rollout_errors >= 1


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_rollouts_that_keep_failing_stop_the_run_with_the_reason(monkeypatch, mode):
    orch, learner = orchestrate(monkeypatch, lambda task: True, mode)

    async def bounded():
        await asyncio.wait_for(orch.run(), timeout=30)  # before the fix the learner waited forever

    # two workers: the other may fail once more before the run stops
    with pytest.raises(RolloutsFailing, match=r"[45] rollouts in a row failed .*sandbox error: gone"):
        asyncio.run(bounded())
    assert learner.batches == [] and orch.rollout_errors in (4, 5)


def test_async_batches_by_token_budget(monkeypatch):
    # each rollout is 3 tokens (2 prompt + 1 sampled): a budget of 18 takes 6 of them, more than
    # batch_size 2 (taken rollouts free their in-flight room, so a budget can exceed it)
    orch, learner = orchestrate(monkeypatch, lambda task: False, batch_tokens=18, batch_size=2)
    asyncio.run(orch.run())
    assert [len(b) for b in learner.batches] == [6, 6, 6]  # max_in_flight is 2 + 2 workers = 4


def test_a_lost_rollout_is_drawn_again_not_counted_as_failed(monkeypatch):
    """runtime=ray: a rollout whose worker died (RolloutLost) gives its key back; the same key
    is the next drawn, and it is trained on once."""
    orch, learner = orchestrate(monkeypatch, lambda task: False, max_steps=4)
    lost_once = []

    async def flaky(source, task, seed):
        if not lost_once:
            lost_once.append(task.instance_id)
            raise orchestrator.RolloutLost("rollout actor 0 died (ActorDiedError)")
        return await orch._rollout_here(source, task, seed)

    orch.rollout = flaky
    asyncio.run(orch.run())
    trained = [t.info["rollout_key"] for batch in learner.batches for t in batch]
    assert orch.rollouts_lost == 1 and orch.rollout_errors == 0
    assert len(trained) == len(set(trained)) == 8
    assert "0/0" in trained  # the lost key (the first drawn) came back


def test_engine_lag_gives_the_engine_the_weights_of_k_versions_ago(monkeypatch):
    """trainer.engine_lag=2: after step s the engine holds version s - 2 (nothing until step 3),
    the weights as they were then, not the learner's live tensors."""
    import torch

    class Live(Learner):
        def __init__(self):
            super().__init__()
            self.w = torch.zeros(1)

        def step(self, batch, group_ids):
            self.w += 1  # in place, as an optimizer updates
            return super().step(batch, group_ids)

        def state_dict_for_engine(self):
            return [("w", self.w)]

    class Recording(Engine):
        def __init__(self):
            self.given = []

        def update_weights(self, named_tensors, version):
            self.version = version
            self.given.append((version, float(named_tensors[0][1])))

    monkeypatch.setattr(orchestrator, "rollout_and_grade", rollout(lambda task: False))
    tasks = [Task(instance_id=f"t{i}", repo="r", base_commit="-", problem_statement="p") for i in range(8)]
    cfg = RunConfig(batch_size=2, num_workers=2, max_steps=5, engine_lag=2, max_staleness=8)
    engine, learner = Recording(), Live()
    orch = Orchestrator(cfg, TaskSampler([Source("s", None, tasks, None)]), None, engine, learner, lambda *a: None)
    asyncio.run(orch.run())
    assert learner.version == 5 and engine.given == [(1, 1.0), (2, 2.0), (3, 3.0)]
    # stopped after step 3 and resumed from what a checkpoint keeps (orch.lag_state()): the
    # engine goes on from version 1 with 2 and 3 queued, as in the run that was not stopped
    cfg3 = RunConfig(batch_size=2, num_workers=2, max_steps=3, engine_lag=2, max_staleness=8)
    engine, learner = Recording(), Live()
    orch = Orchestrator(cfg3, TaskSampler([Source("s", None, tasks, None)]), None, engine, learner, lambda *a: None)
    asyncio.run(orch.run())
    kept = orch.lag_state()
    assert [(v, float(w[0][1])) for w, v in kept] == [(1, 1.0), (2, 2.0), (3, 3.0)]
    engine = Recording()
    orch = Orchestrator(cfg, TaskSampler([Source("s", None, tasks, None)]), None, engine, learner, lambda *a: None,
                        start_step=3)
    engine.update_weights(*orch.load_lag_state(kept))
    asyncio.run(orch.run())
    assert learner.version == 5 and engine.given == [(1, 1.0), (2, 2.0), (3, 3.0)]


@pytest.mark.parametrize("max_staleness", [2, 8])
def test_no_rollout_starts_during_a_step_when_it_would_be_too_stale_to_train_on(monkeypatch, max_staleness):
    """engine_lag=2: a rollout started while the learner steps samples with the engine's
    weights of then and is taken at one version more. With max_staleness=2 (the lag) that is
    past the bound from the third step on (learner version 2), so no rollout starts during
    those steps, and after each only the next batch's: once the rollouts of the steps before
    are through, none is dropped. With 8, rollouts go on starting during every step (the async
    overlap). Each step counts the rollouts started while it runs, waiting for one (0.3 s where
    none should come, else up to 10 s), so neither case depends on the machine's speed."""
    import time

    def run(agent, task, env, pool, seed):
        time.sleep(0.02)
        t = Trajectory(task.instance_id, prompt_ids=[1, 2], reward=1.0, exit_reason="submitted")
        t.append_sampled([3], [-0.5], engine.version)
        return t

    started_during, dropped = [], []

    class Slow(Learner):
        def step(self, batch, group_ids):
            before = orch.stream.counts["started"]
            deadline = time.monotonic() + (0.3 if max_staleness == 2 else 10)
            while orch.stream.counts["started"] == before and time.monotonic() < deadline:
                time.sleep(0.01)
            started_during.append(orch.stream.counts["started"] - before)
            dropped.append(orch.stream.counts["dropped_stale"])
            return super().step(batch, group_ids)

    monkeypatch.setattr(orchestrator, "rollout_and_grade", run)
    tasks = [Task(instance_id=f"t{i}", repo="r", base_commit="-", problem_statement="p") for i in range(8)]
    cfg = RunConfig(batch_size=2, num_workers=2, max_steps=8, engine_lag=2, max_staleness=max_staleness,
                    max_in_flight=64)  # room to start many more at any time: only the hold and the starts allowed stop them
    engine, learner = Engine(), Slow()
    orch = Orchestrator(cfg, TaskSampler([Source("s", None, tasks, None)]), None, engine, learner, lambda *a: None)
    asyncio.run(asyncio.wait_for(orch.run(), timeout=120))
    assert learner.version == 8 and engine.version == 6  # after step s, version s - 2
    if max_staleness == 2:
        assert started_during[2:] == [0] * 6, started_during
        assert dropped[-3:] == [dropped[-1]] * 3, dropped  # (those of the first steps went by step 6)
    else:
        assert all(started_during), started_during


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_groups_rollouts_run_side_by_side_within_the_worker_count(monkeypatch, mode):
    """GRPO's group of 4 with 4 workers: its rollouts run at once (one after another, a sync
    batch of 2 groups had 2 rollouts in flight whatever the workers), and never more than 4.
    A rollout waits at a barrier of 4 and records whether it got through: every trained one
    must have. Once the last step is taken the barrier is aborted, so the rollouts an async run
    started past its end (fewer than a group) return at once instead of at its timeout."""
    import threading

    running, peak, lock, four = [0], [0], threading.Lock(), threading.Barrier(4, timeout=60)

    def run(agent, task, env, pool, seed):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        try:
            four.wait()  # returns only once 4 rollouts run at the same time
            together = True
        except threading.BrokenBarrierError:
            together = False
        with lock:
            running[0] -= 1
        t = Trajectory(task.instance_id, prompt_ids=[1, 2], reward=float(seed % 2), exit_reason="submitted",
                       info={"together": together})
        t.append_sampled([3], [-0.5], 0)
        return t

    def on_step(*_):
        if len(learner.batches) == 2:
            four.abort()

    tasks = [Task(instance_id=f"t{i}", repo="r", base_commit="-", problem_statement="p") for i in range(8)]
    monkeypatch.setattr(orchestrator, "rollout_and_grade", run)
    cfg = RunConfig(mode=mode, batch_size=8, group_size=4, num_workers=4, max_steps=2, max_staleness=8)
    learner = Learner()
    orch = Orchestrator(cfg, TaskSampler([Source("s", env=None, tasks=tasks, agent=None)], seed=0), pool=None,
                        engine=Engine(), learner=learner, on_step=on_step)
    asyncio.run(asyncio.wait_for(orch.run(), timeout=120))
    assert len(learner.batches) == 2 and peak[0] == 4
    assert all(t.info["together"] for batch in learner.batches for t in batch)
    for batch in learner.batches:  # whole groups, in order: each group's 4 rollouts of one task
        ids = [t.instance_id for t in batch]
        assert ids[:4] == [ids[0]] * 4 and ids[4:] == [ids[4]] * 4


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_more_workers_than_the_default_thread_pool_all_run_and_the_learner_is_not_queued_behind_them(monkeypatch, mode):
    """asyncio.to_thread's pool has min(32, CPUs + 4) threads: with more workers than that, the
    rollouts beyond it waited for a thread, and a learner step queued behind rollouts that held
    them all. Here every worker's first rollout waits at a barrier of all the workers (it gets
    through only if they all run at once); every later one waits until the learner has stepped
    (async: while they hold every rollout thread, the learner must still get its own)."""
    import os
    import threading

    workers = min(32, (os.cpu_count() or 1) + 4) + 2
    everyone, stepped, started = threading.Barrier(workers, timeout=60), threading.Event(), [0]
    lock = threading.Lock()

    def run(agent, task, env, pool, seed):
        with lock:
            started[0] += 1
            first = started[0] <= workers
        if first:
            everyone.wait()
        else:
            stepped.wait(timeout=60)
        t = Trajectory(task.instance_id, prompt_ids=[1, 2], reward=1.0, exit_reason="submitted",
                       info={"first": first, "together": not everyone.broken})
        t.append_sampled([3], [-0.5], 0)
        return t

    class SteppingLearner(Learner):
        def step(self, batch, group_ids):
            out = super().step(batch, group_ids)
            stepped.set()
            return out

    tasks = [Task(instance_id=f"t{i}", repo="r", base_commit="-", problem_statement="p") for i in range(4 * workers)]
    monkeypatch.setattr(orchestrator, "rollout_and_grade", run)
    cfg = RunConfig(mode=mode, batch_size=workers if mode == "sync" else 2, num_workers=workers, max_steps=2,
                    max_staleness=8)
    learner = SteppingLearner()
    orch = Orchestrator(cfg, TaskSampler([Source("s", env=None, tasks=tasks, agent=None)], seed=0), pool=None,
                        engine=Engine(), learner=learner, on_step=lambda *a: None)
    asyncio.run(asyncio.wait_for(orch.run(), timeout=120))
    assert len(learner.batches) == 2 and not everyone.broken
    assert all(t.info["together"] for t in learner.batches[0])
