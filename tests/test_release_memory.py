"""Issue 44, finding 2: with an engine that sleeps while the learner steps (colocated on GPUs),
the learner hands back its step's memory before the engine wakes, so a step goes sleep, step,
release, wake, sync. The orchestrator's order with a recording engine and learner; the torch
learner's release on the real tiny model (no gradient left); the command that carries it to
every rank (torchrun's followers, Ray's learner actors)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

import training.orchestrator as orchestrator
from agent.tiny_model import build_tiny_model
from agent.trajectory import Trajectory
from envs.base import Task
from training.algos import SAO
from training.learners.torch import TorchLearner
from training.orchestrator import Orchestrator, RunConfig, Source, TaskSampler
from training.runtime.base import COMMANDS, run_command


class SleepingEngine:
    """An engine colocated with the learner: sleeps and wakes around each step (recorded)."""

    busy_s = 0.0
    version = 0
    sleep_during_step = True

    def __init__(self, calls: list[str]):
        self.calls = calls

    def sleep(self):
        self.calls.append("sleep")

    def wake_up(self):
        self.calls.append("wake")

    def update_weights(self, named_tensors, version):
        self.calls.append("sync")
        self.version = version


class RecordingLearner:
    version = 0

    def __init__(self, calls: list[str], fail_at: int | None = None):
        self.calls, self.fail_at = calls, fail_at

    def step(self, batch, group_ids):
        self.calls.append("step")
        if self.version == self.fail_at:
            raise RuntimeError("CUDA out of memory (a stand-in)")
        self.version += 1
        return {}

    def release_memory(self):
        self.calls.append("release")

    def state_dict_for_engine(self):
        return []


def one_token_rollout(agent, task, env, pool, seed):
    t = Trajectory(task.instance_id, prompt_ids=[1, 2], reward=1.0, exit_reason="submitted")
    t.append_sampled([3], [-0.5], 0)
    return t


def run_orchestrator(monkeypatch, learner, engine, mode: str, steps: int = 2) -> Orchestrator:
    monkeypatch.setattr(orchestrator, "rollout_and_grade", one_token_rollout)
    tasks = [Task(instance_id=f"t{i}", repo="r", base_commit="-", problem_statement="p") for i in range(8)]
    sampler = TaskSampler([Source("s", env=None, tasks=tasks, agent=None)], seed=0)
    cfg = RunConfig(mode=mode, batch_size=2, num_workers=2, max_steps=steps)
    orch = Orchestrator(cfg, sampler, pool=None, engine=engine, learner=learner, on_step=lambda *a: None)
    asyncio.run(orch.run())
    return orch


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_sleeping_engine_wakes_after_the_learner_releases_and_the_sync_comes_last(monkeypatch, mode):
    calls: list[str] = []
    run_orchestrator(monkeypatch, RecordingLearner(calls), SleepingEngine(calls), mode)
    assert calls == ["sleep", "step", "release", "wake", "sync"] * 2


def test_a_failed_step_still_releases_and_wakes_the_engine(monkeypatch):
    calls: list[str] = []
    with pytest.raises(RuntimeError, match="out of memory"):
        run_orchestrator(monkeypatch, RecordingLearner(calls, fail_at=1), SleepingEngine(calls), "async")
    assert calls == ["sleep", "step", "release", "wake", "sync", "sleep", "step", "release", "wake"]


def test_an_engine_that_stays_awake_is_not_released_around(monkeypatch):
    calls: list[str] = []
    engine = SleepingEngine(calls)
    engine.sleep_during_step = False
    run_orchestrator(monkeypatch, RecordingLearner(calls), engine, "async")
    assert calls == ["step", "sync"] * 2


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "m"))


def traj(reward, n=12):
    t = Trajectory("x", prompt_ids=list(range(5, 15)), reward=reward)
    t.append_sampled(list(range(30, 30 + n)), [-8.3] * n, 0)
    return t


def test_the_torch_learners_release_leaves_no_gradient_and_the_next_step_goes_on(tiny):
    learner = TorchLearner(tiny, SAO(critic_warmup_steps=0, lr_policy=1e-3, lr_critic=1e-3))
    batch = [traj(1.0), traj(0.0, 20)]
    learner.step(batch)
    models = (learner.policy, learner.critic)
    assert all(any(p.grad is not None for p in m.parameters()) for m in models)  # an optimizer step leaves them
    states = {id(s["exp_avg"]) for opt in (learner.policy_opt, learner.critic_opt) for s in opt.state.values()}
    learner.release_memory()
    assert all(p.grad is None for m in models for p in m.parameters())
    # what stays: the weights and AdamW's moments, the same tensors
    assert states == {id(s["exp_avg"]) for opt in (learner.policy_opt, learner.critic_opt) for s in opt.state.values()}
    metrics = learner.step(batch)
    assert learner.version == 2 and metrics["policy/grad_norm"] > 0


def test_release_is_a_command_every_rank_carries_out():
    """torchrun's followers get it by broadcast and Ray's actors by remote call, both through
    `run_command`; Ray's driver sends it to every rank."""
    calls: list[str] = []
    learner = SimpleNamespace(release_memory=lambda: calls.append("release"), collective=False)
    assert "release" in COMMANDS
    run_command(learner, 2, "release")
    assert calls == ["release"]


def test_rays_learner_group_releases_on_every_rank(monkeypatch):
    ray_runtime = pytest.importorskip("training.runtime.ray")

    class Remote:
        def __init__(self, fn):
            self.remote = fn

    released: list[int] = []

    def actor(k):
        return SimpleNamespace(version=Remote(lambda: 0), release_memory=Remote(lambda: released.append(k)))

    monkeypatch.setattr(ray_runtime.ray, "get", lambda refs, **kwargs: refs)
    group = ray_runtime.RayLearnerGroup([actor(k) for k in range(3)], collective=True, layout=None)
    group.release_memory()
    assert released == [0, 1, 2]


def test_the_megatron_learner_drops_its_optimizers_gradients():
    """Its release asks each optimizer for `zero_grad(set_to_none=True)` (megatron's: the
    main parameters' gradients go; the DDP gradient buffers stay, as the plan counts them)."""
    from training.learners.megatron import MegatronLearner

    asked = []
    optimizer = SimpleNamespace(zero_grad=lambda set_to_none: asked.append(set_to_none))
    models = [("policy", SimpleNamespace(optimizer=optimizer)), ("critic", SimpleNamespace(optimizer=optimizer))]
    MegatronLearner.release_memory(SimpleNamespace(_models=lambda: models))
    assert asked == [True, True]
