"""Every part a run is made of, built from its config in one place: the starting model, the
engine, the learner, the algo, the agents and envs of the task sources, the sandbox pool.
Both runtimes (training/runtime/) and the other entry points (value pretraining, experiments)
build their parts here, so a part is chosen once, when the config is read."""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

import training.sft as sft_module
from agent.agents import agent_class
from agent.engines import make_engine
from agent.engines.base import check_context
from agent.engines.router import EngineRouter
from agent.engines.shared import shareable
from agent.engines.vllm import vllm_available
from agent.loop import Agent, AgentConfig
from agent.tiny_model import DEFAULT_DIR, build_tiny_model
from envs.base import make_env
from sandbox.base import Limits
from sandbox.pool import SandboxPool
from training.config import CONF
from training.console import console
from training.learners.base import Learner
from training.orchestrator import Source
from training.sft import DEFAULT_OUT, sft


def sft_model_dir(model_cfg: DictConfig) -> tuple[str, Path, str]:
    """(the base model, the folder the SFT model of these settings is cached in, its stamp):
    one folder per (base weights, recipe, settings), so a run with other settings never reuses
    it. Builds the tiny base model where it is not there yet (seconds)."""
    path = model_cfg.path or str(build_tiny_model(DEFAULT_DIR))
    envs = list(model_cfg.sft.get("envs") or ["arith", "prefer"])
    # a new recipe (sft.py, or an env's demonstrations), a new model
    recipe = hashlib.sha1(b"".join(Path(f).read_bytes() for f in [sft_module.__file__, *env_files(envs)])).hexdigest()
    weights = sorted(Path(path).glob("*.safetensors")) if Path(path).is_dir() else []
    base = hashlib.sha1(b"".join(p.read_bytes() for p in weights)).hexdigest() if weights else path
    stamp = json.dumps({"base": base, "recipe": recipe, **OmegaConf.to_container(model_cfg.sft)}, sort_keys=True)
    return path, DEFAULT_OUT.with_name(f"{DEFAULT_OUT.name}-{hashlib.sha1(stamp.encode()).hexdigest()[:10]}"), stamp


def prepare_model(model_cfg: DictConfig) -> str:
    """The checkpoint to start from: a given path, or the tiny model (+ SFT), cached."""
    if not model_cfg.sft.enabled:
        return model_cfg.path or str(build_tiny_model(DEFAULT_DIR))
    path, out, stamp = sft_model_dir(model_cfg)
    envs = list(model_cfg.sft.get("envs") or ["arith", "prefer"])
    if not (out / "stage.json").exists():
        console.print(f"SFT warm start: {model_cfg.sft.steps} steps on generated demonstrations -> {out}")
        # made beside and renamed into place: a run killed mid-way leaves no half-written model,
        # and of two runs making the same one at once (side by side) the first rename wins
        staging = out.with_name(f".{out.name}.{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        sft(path, staging, model_cfg.sft.steps, model_cfg.sft.examples, lr=model_cfg.sft.lr,
            max_operand=model_cfg.sft.max_operand, envs=envs)
        (staging / "stage.json").write_text(stamp)
        shutil.rmtree(out, ignore_errors=True)  # a folder without stage.json: an older crash's
        try:
            staging.rename(out)
        except OSError:  # another run put the same model there first
            shutil.rmtree(staging, ignore_errors=True)
    return str(out)


def env_files(names: list[str]) -> list[str]:
    """The source files of the named envs' classes (what their demonstrations are written in)."""
    return [inspect.getfile(type(make_env(name))) for name in names]


def make_algo(cfg: DictConfig):
    """The algo config, with the model's overrides of the fields it has (chosen once, here)."""
    algo = OmegaConf.to_container(cfg.algo)
    given = cfg.model.get("algo_overrides")  # (an empty DictConfig is falsy: `or {}` gave to_container a dict)
    overrides = OmegaConf.to_container(given) if given is not None else {}
    algo.update({k: v for k, v in overrides.items() if k in algo})
    return instantiate(algo)


def make_learner(cfg: DictConfig, model_path: str) -> Learner:
    """This rank's learner (conf/learner/*.yaml) with the run's algo; a layout the model or the
    ranks cannot take raises LayoutError."""
    return instantiate(cfg.learner)(model_path=model_path, algo=make_algo(cfg),
                                    sampling_temperature=cfg.agent.temperature, seed=cfg.seed)


def agent_settings(cfg: DictConfig, override=None) -> tuple[str, dict, AgentConfig]:
    """The run's agent (conf/agent/<name>.yaml): its class, its own options, and the shared
    settings (agent.loop.AgentConfig) with a source's `agent:` over them."""
    fields = {**OmegaConf.to_container(cfg.agent), **(OmegaConf.to_container(override) if override else {})}
    target = fields.pop("_target_", "agent.loop.Agent")
    options = fields.pop("options", None) or {}
    return target, options, AgentConfig(**fields)


def make_agent(engine, tokenizer, cfg: DictConfig, override) -> Agent:  # (or another agent: conf/agent/)
    target, options, config = agent_settings(cfg, override)
    return agent_class(target)(engine, tokenizer, config, **options)


def make_source_env(spec: DictConfig):
    """A source's env: conf/env/<env>.yaml, with the source's env_options over it."""
    env_cfg = OmegaConf.merge(OmegaConf.load(CONF / "env" / f"{spec.env}.yaml"), spec.get("env_options") or {})
    env_cfg.pop("_target_", None)
    return make_env(spec.env, **env_cfg)


def make_source(spec: DictConfig, engine, tokenizer, cfg: DictConfig) -> Source:
    return Source(spec.get("name", spec.env), make_source_env(spec), list(instantiate(spec.tasks)),
                  make_agent(engine, tokenizer, cfg, spec.get("agent")), spec.get("weight", 1))


def make_pool(cfg: DictConfig, run_id: str, max_live: int) -> SandboxPool:
    """A sandbox pool with the run's limits (conf/sandbox/*.yaml) and its warm pool."""
    limits = instantiate(cfg.sandbox) if "_target_" in cfg.sandbox else Limits()
    return SandboxPool(run_id, limits, max_live=max_live, warm=cfg.sandbox.get("warm_pool", 0))


def engine_choice(engine_cfg: DictConfig) -> tuple[str, dict]:
    """The engine kind and its options; `auto` is vllm where it is installed, else hf, with
    that kind's own `conf/engine/<kind>.yaml` options under the given ones."""
    kind = engine_cfg.kind
    options = engine_cfg.options if engine_cfg.get("options") is not None else OmegaConf.create({})
    if kind == "auto":
        kind = "vllm" if vllm_available() else "hf"
        options = OmegaConf.merge(OmegaConf.load(CONF / "engine" / f"{kind}.yaml").options, options)
    return kind, OmegaConf.to_container(options)


def check_engine_context(cfg: DictConfig) -> None:
    """The engine's context against the model's positions, before anything starts (the engine
    checks again when it starts, on the model it is given)."""
    kind, options = engine_choice(cfg.engine)
    if kind in ("vllm", "vllm_batch") and cfg.model.get("path"):
        check_context(str(cfg.model.path), int(options.get("max_model_len", 16384)))


def build_engine(engine_cfg: DictConfig, model_path: str, share: float | None = None):
    """The engine the rollouts call: one, or `engine.replicas` behind a router (each rebuilt
    from the same options if it dies). `share`: vLLM's GPU share where the options give none."""
    kind, options = engine_choice(engine_cfg)
    if share is not None and kind in ("vllm", "vllm_batch") and options.get("gpu_memory_utilization") is None:
        options["gpu_memory_utilization"] = share
        console.print(f"engine: {share:.2f} of the GPU, as the memory plan computes (python -m training.plan)")
    replicas = engine_cfg.get("replicas", 1)
    console.print(f"engine: {kind}" + (" (auto)" if engine_cfg.kind == "auto" else "")
                  + (f", {replicas} replicas" if replicas > 1 else ""))

    def one(_index: int = 0):
        return shareable(make_engine(kind, model_path, **options))

    return one() if replicas == 1 else EngineRouter([one(i) for i in range(replicas)], restart=one)
