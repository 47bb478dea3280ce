"""Checks on the composed training config, before anything is built.

A wrong value a user typed (`trainer.mode=asnyc`, a missing `model.path`, a source naming an
env that does not exist) should stop the run at once with the field and the value, not after
minutes of SFT, engine start-up and held-apart scoring, and not as a stack trace from deep
inside the orchestrator.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from pathlib import Path
from typing import NoReturn

from omegaconf import DictConfig, OmegaConf

from agent.engines import is_hub_name
from sandbox.base import valid_user

CONF = Path(__file__).resolve().parents[1] / "conf"


class ConfigError(ValueError):
    """A config value the user can fix; the message names the field and the value."""


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _fail(field: str, value, why: str) -> NoReturn:
    raise ConfigError(f"config field {field} = {value!r}: {why}")


def _at_least(cfg: DictConfig, prefix: str, names: tuple[str, ...], low: float) -> None:
    for name in names:
        value = cfg.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < low):
            _fail(f"{prefix}.{name}", value, f"must be a number >= {low:g}")


def _check_agent(fields, prefix: str) -> None:
    from agent.loop import AgentConfig

    fields = fields or OmegaConf.create({})
    known = {f.name for f in dataclasses.fields(AgentConfig)}
    for name in fields:
        if name not in known and name not in ("_target_", "options"):
            _fail(f"{prefix}.{name}", fields[name], f"not an agent setting (known: {', '.join(sorted(known))})")
    if "_target_" in fields:
        from agent.agents import agent_class

        try:
            agent_class(fields._target_)
        except ValueError as e:
            _fail(f"{prefix}._target_", fields._target_, str(e))
    _at_least(fields, prefix, ("max_turns", "max_tokens", "max_new_tokens"), 1)
    _at_least(fields, prefix, ("command_timeout_s", "wall_time_s", "temperature", "top_p", "latency_scale_s",
                               "latency_max_s"), 0)
    _at_least(fields, prefix, ("latency_alpha",), 0.01)  # (null: off)


def _env_class(env: str) -> tuple[str, type]:
    """The class an env's conf/env/<env>.yaml names (`_target_`), and that name."""
    from hydra.utils import get_class

    target = OmegaConf.load(CONF / "env" / f"{env}.yaml")._target_
    return target, get_class(target)


def _check_agent_fits_envs(cfg: DictConfig) -> None:
    """An agent that acts through bash alone (`bash_only`: mini-swe-agent) cannot answer an env
    that is answered with tools of its own (prefer, arith: `answer`)."""
    from agent.agents import agent_class

    target = cfg.agent.get("_target_")
    if not target or not getattr(agent_class(target), "bash_only", False):
        return
    specs = [(f"sources[{i}].env", s) for i, s in enumerate(cfg.sources)]
    specs += [("held_out.env", cfg.held_out)] if cfg.get("held_out") else []
    for where, spec in specs:
        tools = getattr(_env_class(spec.env)[1], "tools", None)
        if tools:
            _fail(where, spec.env, f"the agent ({target}) acts through bash alone, and this env is answered with "
                  f"its own tools ({', '.join(tools)}): train it with agent=default, or choose sources it can act "
                  "on (SWE: +experiment=swe_builtin)")


def _check_env_options(env: str, options, prefix: str) -> None:
    """Each option must be a parameter of the env's constructor (its conf/env/<env>.yaml _target_)."""
    target, cls = _env_class(env)
    known = set(inspect.signature(cls).parameters) - {"self"}
    for name in options:
        if name not in known:
            _fail(f"{prefix}.{name}", options[name], f"not an option of {target} (known: {', '.join(sorted(known))})")


def _check_source(spec, prefix: str) -> None:
    env = spec.get("env")
    if not env or not (CONF / "env" / f"{env}.yaml").is_file():
        known = sorted(p.stem for p in (CONF / "env").glob("*.yaml"))
        _fail(f"{prefix}.env", env, f"no conf/env/{env}.yaml (known envs: {', '.join(known)})")
    if spec.get("env_options"):
        _check_env_options(env, spec.env_options, f"{prefix}.env_options")
    if "tasks" not in spec or "_target_" not in spec.tasks:
        _fail(f"{prefix}.tasks", spec.get("tasks"), "needs a _target_ that makes the tasks")
    _at_least(spec, prefix, ("weight",), 1)
    _check_agent(spec.get("agent"), f"{prefix}.agent")


def _check_learner(learner) -> None:
    """What can be told before a model is read (the layout against the model's heads, layers,
    experts and the ranks is checked when the learner is built: training/learners/mcore/model.py)."""
    _at_least(learner, "learner", ("tensor_parallel", "pipeline_parallel", "expert_parallel", "micro_batch_tokens"), 1)
    dtypes = ("auto", "float32", "bfloat16") if "megatron" in str(learner.get("_target_")) else ("float32", "bfloat16", "float16")
    if learner.get("dtype") is not None and learner.dtype not in dtypes:
        _fail("learner.dtype", learner.dtype, f"must be one of {', '.join(dtypes)}")


def _check_sandbox(sandbox) -> None:
    _at_least(sandbox, "sandbox", ("memory_mb", "pids", "nofile", "nproc", "disk_mb", "output_bytes"), 1)
    _at_least(sandbox, "sandbox", ("cpus",), 0.01)
    _at_least(sandbox, "sandbox", ("default_timeout_s",), 0.001)
    if not valid_user(sandbox.get("user")):
        _fail("sandbox.user", sandbox.get("user"), "must be a numeric uid or uid:gid other than 0 (e.g. '1000:1000'), or null for root")
    warm = sandbox.get("warm_pool", 0)
    if isinstance(warm, bool) or not isinstance(warm, int) or warm < 0:
        _fail("sandbox.warm_pool", warm, "must be a whole number >= 0 (started containers kept ready per image; 0: none)")


def advice(cfg: DictConfig) -> list[str]:
    """Settings that run but work against themselves: said at start, not refused."""
    t, notes = cfg.trainer, []
    if t.mode == "async" and t.stale_policy == "drop" and not t.get("batch_tokens") \
            and t.num_workers > t.max_staleness * t.batch_size:
        # a rollout is taken about num_workers / batch_size steps after it starts (Little's law):
        # past the bound, the long ones are the ones dropped (benchmarks.simulate: 33% of the finished
        # rollouts dropped at 1,024 in flight, 128 a step, bound 4; 6% with bound 8)
        notes.append(f"trainer.num_workers={t.num_workers} rollouts in flight at trainer.batch_size={t.batch_size} a step "
                     f"take about {t.num_workers / t.batch_size:.0f} steps to come back, beyond trainer.max_staleness="
                     f"{t.max_staleness}: the long rollouts will be dropped as too stale. Raise trainer.max_staleness "
                     f"to {-(-t.num_workers // t.batch_size)} or lower trainer.num_workers to "
                     f"{t.max_staleness * t.batch_size} (BENCHMARKS.md, the orchestrator in simulated time)")
    return notes


def check(cfg: DictConfig) -> None:
    """Raise ConfigError for the first value that cannot work."""
    t = cfg.trainer
    if t.mode not in ("async", "sync"):
        _fail("trainer.mode", t.mode, "must be 'async' (SAO's stream) or 'sync' (wait for whole batches)")
    if t.stale_policy not in ("drop", "keep"):
        _fail("trainer.stale_policy", t.stale_policy, "must be 'drop' or 'keep'")
    _at_least(t, "trainer", ("batch_size", "group_size", "sync_every", "num_workers", "max_steps",
                             "checkpoint_every", "keep_checkpoints", "max_failed_in_a_row"), 1)
    _at_least(t, "trainer", ("max_staleness", "engine_lag", "keep_every"), 0)
    if t.get("keep_every") and t.keep_every % t.checkpoint_every:
        _fail("trainer.keep_every", t.keep_every, f"must be a multiple of trainer.checkpoint_every ({t.checkpoint_every}): "
              "checkpoints are written only at those steps")
    if t.get("engine_lag", 0) > t.max_staleness and t.stale_policy == "drop":
        _fail("trainer.engine_lag", t.engine_lag, f"is above trainer.max_staleness ({t.max_staleness}): every rollout "
              "would be dropped as stale (raise max_staleness, or stale_policy=keep)")
    _at_least(t, "trainer", ("batch_tokens",), 1)  # (null: by count)
    if t.batch_size % t.group_size:
        _fail("trainer.batch_size", t.batch_size, f"must be a multiple of trainer.group_size ({t.group_size})")
    algo = cfg.algo
    _at_least(algo, "algo", ("eps_low", "eps_high", "lr_policy", "lr_critic", "critic_steps", "critic_warmup_steps"), 0)
    _at_least(algo, "algo", ("policy_minibatches", "group_size"), 1)
    if algo.get("group_size") is not None and t.group_size != algo.group_size:
        _fail("trainer.group_size", t.group_size, f"differs from algo.group_size ({algo.group_size}), by which the "
              "advantages are grouped: set algo.group_size (trainer.group_size follows it)")
    if algo.get("eps_low") is not None and algo.eps_low > 1:
        _fail("algo.eps_low", algo.eps_low, "must be at most 1 (the band's low edge is 1 - eps_low)")
    _check_learner(cfg.learner)
    runtime = cfg.get("runtime", "local")
    if runtime not in ("local", "ray"):
        _fail("runtime", runtime, "must be 'local' (this process) or 'ray' (actors on a Ray cluster)")
    if cfg.get("local") is not None:
        _at_least(cfg.local, "local", ("rank_timeout_s",), 1)
        engine_cpus = cfg.local.get("engine_cpus")
        if engine_cpus is not None:
            cpus = len(os.sched_getaffinity(0))
            if isinstance(engine_cpus, bool) or not isinstance(engine_cpus, int) or not 1 <= engine_cpus < cpus:
                _fail("local.engine_cpus", engine_cpus, f"must be a whole number from 1 to {cpus - 1} (this process may "
                      f"use {cpus} CPUs: the engine takes that many, the learner and the rollouts the rest), or null")
    if runtime == "ray":
        _at_least(cfg.ray, "ray", ("learner_ranks", "rollout_actors"), 1)
        _at_least(cfg.ray, "ray", ("rollout_actor_cpus",), 0)
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            _fail("runtime", runtime, "places the learner ranks itself (ray.learner_ranks): run it with python, not torchrun")
        weight_sync = cfg.ray.get("weight_sync", "collective")
        if weight_sync not in ("collective", "object_store"):
            _fail("ray.weight_sync", weight_sync, "must be collective (each learner rank sends its share to the engines) "
                  "or object_store (rank 0 puts the whole model in Ray's object store)")
        _at_least(cfg.ray, "ray", ("weight_sync_timeout_s",), 1)
        if not isinstance(cfg.ray.get("colocate", False), bool):
            _fail("ray.colocate", cfg.ray.colocate, "must be true or false")
        if weight_sync == "collective" and cfg.trainer.get("engine_lag", 0):
            _fail("trainer.engine_lag", cfg.trainer.engine_lag, "keeps snapshots of past weights for the engine, which "
                  "weights by collective do not make (the ranks send what they hold): set ray.weight_sync=object_store")
    _check_sandbox(cfg.get("sandbox") or {})
    if cfg.engine.kind not in ("auto", "hf", "vllm", "vllm_batch"):
        _fail("engine.kind", cfg.engine.kind, "must be auto, hf, vllm or vllm_batch")
    _at_least(cfg.engine, "engine", ("replicas",), 1)
    if runtime == "local" and cfg.engine.get("replicas", 1) > 1 and _cuda():
        # replicas made in this process would all start on its GPU (cuda:0 under torchrun's rank 0)
        _fail("engine.replicas", cfg.engine.replicas, "engines in the learner's process all sit on its GPU: "
              "runtime=local on GPUs runs one engine (raise engine.options.tensor_parallel_size for a larger one); "
              "runtime=ray places each replica on GPUs of its own (docs/cluster.md)")
    sync_mode = (cfg.engine.get("options") or {}).get("sync_mode")
    if sync_mode is not None and sync_mode not in ("continue", "finish"):
        _fail("engine.options.sync_mode", sync_mode, "must be 'continue' (in-flight requests go on under the new "
              "weights) or 'finish' (they end under the old ones)")
    path = cfg.model.path
    if path is not None and not Path(str(path)).exists() and not is_hub_name(str(path)):
        _fail("model.path", path, "no such directory (and not a hub name like owner/model)")
    _check_agent(cfg.agent, "agent")
    # the learner scores tokens under the full distribution at one temperature: the sampler must
    # draw from exactly that one, or every ratio carries a bias
    if cfg.agent.temperature <= 0:
        _fail("agent.temperature", cfg.agent.temperature, "must be > 0 for training (logprobs of greedy decoding are not a policy's)")
    if cfg.agent.top_p != 1:
        _fail("agent.top_p", cfg.agent.top_p, "must be 1 for training: the learner's logprobs are of the untruncated distribution")
    if not cfg.sources:
        _fail("sources", cfg.sources, "needs at least one source of training tasks")
    for i, spec in enumerate(cfg.sources):
        _check_source(spec, f"sources[{i}] ({spec.get('name', spec.get('env'))})")
        for name in ("temperature", "top_p"):  # (held-apart scoring trains nothing: it may sample otherwise)
            value = (spec.get("agent") or {}).get(name)
            if value is not None and value != cfg.agent[name]:
                _fail(f"sources[{i}].agent.{name}", value, f"must equal agent.{name} ({cfg.agent[name]}): the learner "
                      "scores every rollout at that one")
    if cfg.get("held_out"):
        _check_source(cfg.held_out, "held_out")
    _check_agent_fits_envs(cfg)
