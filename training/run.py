"""The training entry point (Hydra): `python -m training.run [overrides]`.

The story of a run: prepare the model (the embedded tiny one is built and warm-started by
SFT), start the engine, the learner and the sandbox pool, resume from the newest checkpoint
if there is one, score the held-apart prompts, stream rollouts into the learner until
`trainer.max_steps`, score the held-apart prompts again, and draw the reward curve.
Under `torchrun --nproc-per-node N` rank 0 does all of that and the other ranks follow its
learner commands (training/distributed.py): data-parallel replicas of the torch learner, or
the Megatron learner's model-parallel shards.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import signal
import sys
from pathlib import Path

import hydra
import transformers
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from transformers import AutoTokenizer

from agent.engines import make_engine
from agent.engines.router import EngineRouter
from agent.engines.shared import shareable
from agent.loop import Agent, AgentConfig
from envs.base import make_env
from sandbox.base import Limits, SandboxError
from sandbox.docker import client as docker_client
from sandbox.pool import SandboxPool
from training import distributed
from training.checkpoint import LAG_FILE, Checkpoints, MetricsLog
from training.config import CONF, ConfigError, check
from training.mcore.model import LayoutError
from training.orchestrator import Orchestrator, RolloutsFailing, RunConfig, Source, TaskSampler, evaluate
from training.plots import plot_rewards

console = Console(stderr=True, soft_wrap=True)  # long paths stay whole in a log
log = logging.getLogger("training.run")


def prepare_model(model_cfg: DictConfig) -> str:
    """The checkpoint to start from: a given path, or the tiny model (+ SFT), cached."""
    from agent.tiny_model import DEFAULT_DIR, build_tiny_model

    path = model_cfg.path or str(build_tiny_model(DEFAULT_DIR))
    if not model_cfg.sft.enabled:
        return path
    from training.sft import DEFAULT_OUT, sft

    import training.sft as sft_module

    envs = list(model_cfg.sft.get("envs") or ["arith", "prefer"])
    # a new recipe (sft.py, or an env's demonstrations), a new model
    recipe = hashlib.sha1(b"".join(Path(f).read_bytes() for f in [sft_module.__file__, *env_files(envs)])).hexdigest()
    weights = sorted(Path(path).glob("*.safetensors")) if Path(path).is_dir() else []
    base = hashlib.sha1(b"".join(p.read_bytes() for p in weights)).hexdigest() if weights else path
    stamp = json.dumps({"base": base, "recipe": recipe, **OmegaConf.to_container(model_cfg.sft)}, sort_keys=True)
    # one cached SFT model per (base, settings): a run with other settings never reuses it
    out = DEFAULT_OUT.with_name(f"{DEFAULT_OUT.name}-{hashlib.sha1(stamp.encode()).hexdigest()[:10]}")
    if not (out / "stage.json").exists():
        console.print(f"SFT warm start: {model_cfg.sft.steps} steps on generated demonstrations -> {out}")
        sft(path, out, model_cfg.sft.steps, model_cfg.sft.examples, lr=model_cfg.sft.lr,
            max_operand=model_cfg.sft.max_operand, envs=envs)
        (out / "stage.json").write_text(stamp)
    return str(out)


def env_files(names: list[str]) -> list[str]:
    """The source files of the named envs' classes (what their demonstrations are written in)."""
    import inspect

    from envs.base import make_env

    return [inspect.getfile(type(make_env(name))) for name in names]


def make_algo(cfg: DictConfig):
    """The algo config, with the model's overrides of the fields it has (chosen once, here)."""
    algo = OmegaConf.to_container(cfg.algo)
    overrides = OmegaConf.to_container(cfg.model.get("algo_overrides") or {})
    algo.update({k: v for k, v in overrides.items() if k in algo})
    return instantiate(algo)


def make_agent(engine, tokenizer, cfg: DictConfig, override) -> Agent:
    fields = {**OmegaConf.to_container(cfg.agent), **(OmegaConf.to_container(override) if override else {})}
    return Agent(engine, tokenizer, AgentConfig(**fields))


def make_source_env(spec: DictConfig):
    """A source's env: conf/env/<env>.yaml, with the source's env_options over it."""
    env_cfg = OmegaConf.merge(OmegaConf.load(CONF / "env" / f"{spec.env}.yaml"), spec.get("env_options") or {})
    env_cfg.pop("_target_", None)
    return make_env(spec.env, **env_cfg)


def make_source(spec: DictConfig, engine, tokenizer, cfg: DictConfig) -> Source:
    return Source(spec.get("name", spec.env), make_source_env(spec), list(instantiate(spec.tasks)),
                  make_agent(engine, tokenizer, cfg, spec.get("agent")), spec.get("weight", 1))


def engine_choice(engine_cfg: DictConfig) -> tuple[str, dict]:
    """The engine kind and its options; `auto` is vllm where it is installed, else hf, with
    that kind's own `conf/engine/<kind>.yaml` options under the given ones."""
    kind, options = engine_cfg.kind, engine_cfg.options or {}
    if kind == "auto":
        from agent.engines.vllm import vllm_available

        kind = "vllm" if vllm_available() else "hf"
        options = OmegaConf.merge(OmegaConf.load(CONF / "engine" / f"{kind}.yaml").options, options)
    return kind, OmegaConf.to_container(options)


def build_engine(engine_cfg: DictConfig, model_path: str):
    """The engine the rollouts call: one, or `engine.replicas` behind a router (each rebuilt
    from the same options if it dies)."""
    kind, options = engine_choice(engine_cfg)
    replicas = engine_cfg.get("replicas", 1)
    console.print(f"engine: {kind}" + (" (auto)" if engine_cfg.kind == "auto" else "")
                  + (f", {replicas} replicas" if replicas > 1 else ""))

    def one(_index: int = 0):
        return shareable(make_engine(kind, model_path, **options))

    return one() if replicas == 1 else EngineRouter([one(i) for i in range(replicas)], restart=one)


STEP_LINE = (("reward", "reward/mean", ".3f"), ("masked low", "sao/mask_frac_low", ".3f"),
             ("masked high", "sao/mask_frac_high", ".3f"), ("clipfrac", "ppo/clipfrac", ".3f"),
             ("explained_var", "value/explained_var", ".2f"), ("staleness", "staleness/mean", ".2f"),
             ("learner idle", "time/learner_idle_frac", ".2f"), ("step s", "time/learner_step_s", ".1f"))


def step_line(step: int, max_steps: int, metrics: dict) -> str:
    """One step's health in one line, for logs; only what this algo reports (the metrics file
    has everything)."""
    parts = [f"{label} {metrics[key]:{fmt}}" for label, key, fmt in STEP_LINE if metrics.get(key) is not None]
    return f"step {step}/{max_steps}  " + "  ".join(parts)


def resumed_engine_weights(orch, learner, checkpoint: Path) -> tuple[list, int]:
    """(weights, version) the engine resumes with: the learner's, or with trainer.engine_lag
    those the stopped run's engine had (its queue too), from the checkpoint's `engine_lag.pt`.
    A checkpoint without them (engine_lag was 0 then) starts the lag over: said."""
    lag_file = checkpoint / LAG_FILE
    if orch.cfg.engine_lag and lag_file.exists():
        import torch

        return orch.load_lag_state(torch.load(lag_file, weights_only=True))
    if orch.cfg.engine_lag:
        console.print(f"[yellow]note:[/yellow] {checkpoint} holds no engine_lag weights: the engine starts from the "
                      f"learner's and lags {orch.cfg.engine_lag} versions again after as many steps")
    return learner.state_dict_for_engine(), learner.version


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        check(cfg)
    except ConfigError as e:
        console.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True)
        sys.exit(2)
    transformers.utils.logging.disable_progress_bar()  # shard-writing bars would break up the run's own
    if cfg.runtime != "ray" and int(os.environ.get("RANK", "0")) == 0:  # (on Ray each node's workers ask theirs)
        try:
            docker_client()  # before the model: a run with no Docker engine is said at once, with the fix
        except SandboxError as e:
            console.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True)
            sys.exit(2)
    if cfg.runtime == "ray":
        return run_on_ray(cfg)
    rank = distributed.init_from_env()  # one process, or a rank under torchrun
    out = Path(cfg.output_dir)
    model_path = prepare_model(cfg.model) if rank.is_main else None
    if rank.world > 1:
        model_path = distributed.broadcast_object(model_path)
    try:
        learner = instantiate(cfg.learner)(model_path=model_path, algo=make_algo(cfg),
                                           sampling_temperature=cfg.agent.temperature, seed=cfg.seed)
    except LayoutError as e:  # a layout the model or the ranks cannot take: said once, exit 2
        if rank.is_main:
            console.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True)
        sys.exit(2)
    if not rank.is_main:
        return distributed.follow(learner)  # a data-parallel replica: rank 0 runs the rest
    if rank.world > 1:
        layout = getattr(learner, "layout_summary", None)
        learner = distributed.LearnerGroup(learner)
        console.print(f"learner: {rank.world} ranks, {layout}" if layout else f"learner: {rank.world} data-parallel ranks")
    try:
        run(cfg, out, model_path, learner)
    finally:
        if rank.world > 1:
            learner.close()


def run_on_ray(cfg: DictConfig) -> None:
    """runtime=ray: engines, learner ranks and rollout workers as actors on the cluster
    (training/ray_runtime.py); this process runs the same loop over them."""
    from training.ray_runtime import Cluster, ClusterError

    model_path = prepare_model(cfg.model)
    try:
        cluster = Cluster(cfg, model_path, console)
    except (LayoutError, ClusterError) as e:
        console.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True)
        sys.exit(2)
    try:
        learner = cluster.learner
        console.print(f"learner: {cfg.ray.learner_ranks} rank(s)" + (f", {learner.layout_summary}" if learner.layout_summary else ""))
        run(cfg, Path(cfg.output_dir), model_path, learner, engine=cluster.engine, rollout=cluster.rollout)
    finally:
        cluster.shutdown()


def run(cfg: DictConfig, out: Path, model_path: str, learner, engine=None, rollout=None) -> None:
    """The run's story (module docstring); `engine` and `rollout` are given under runtime=ray."""
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    engine = engine or build_engine(cfg.engine, model_path)
    sampler = TaskSampler([make_source(s, engine, tokenizer, cfg) for s in cfg.sources], cfg.seed)
    pool = SandboxPool(cfg.run_id, instantiate(cfg.sandbox) if "_target_" in cfg.sandbox else Limits(),
                       max_live=2 * cfg.trainer.num_workers + 1,  # a rollout's own sandbox and its grading one
                       warm=cfg.sandbox.get("warm_pool", 0))
    run_cfg = RunConfig(**cfg.trainer)
    checkpoints = Checkpoints(out, run_cfg.keep_checkpoints, run_cfg.keep_every)
    orch = Orchestrator(run_cfg, sampler, pool, engine, learner, on_step=lambda *a: None, rollout=rollout)
    latest = checkpoints.latest() if cfg.resume else None
    if latest is not None:
        try:
            learner.load(latest)
        except LayoutError as e:  # a checkpoint of another parallel layout: said, exit 2
            console.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True)
            sys.exit(2)
        state = json.loads((latest / "run_state.json").read_text())
        orch.step = state["step"]
        sampler.load_state_dict(state["sampler"])
        orch.stream.load_state_dict(state["stream"])
        engine.update_weights(*resumed_engine_weights(orch, learner, latest))
        console.print(f"resumed from {latest} (step {orch.step}, policy version {learner.version})")
        if orch.step >= run_cfg.max_steps:
            console.print(f"{out} already holds all {run_cfg.max_steps} steps: trainer.max_steps=N (N > {orch.step}) "
                          "trains on from here, resume=false or another output_dir starts over")
    metrics_log = MetricsLog(out, orch.step)
    held_out = make_source(cfg.held_out, engine, tokenizer, cfg) if cfg.held_out else None
    held_file = out / "held_out.json"
    summary = json.loads(held_file.read_text()) if latest is not None and held_file.exists() else {}
    if held_out and "held_out/reward_initial" not in summary:
        summary["held_out/reward_initial"] = evaluate(held_out, pool)
        held_file.write_text(json.dumps(summary, indent=2))  # kept across a crash and resume
        console.print(f"held-apart reward before training: {summary['held_out/reward_initial']:.3f}")

    columns = [TextColumn("training"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("reward {task.fields[reward]:.2f}  staleness {task.fields[stale]:.2f}")]
    with Progress(*columns, console=console) as progress:
        bar = progress.add_task("train", total=run_cfg.max_steps, completed=orch.step, reward=0.0, stale=0.0)

        def on_step(step: int, metrics: dict, batch) -> None:
            metrics_log.log(step, metrics)
            metrics_log.log_rollouts(step, batch)
            progress.update(bar, completed=step, reward=metrics["reward/mean"], stale=metrics["staleness/mean"])
            if not console.is_terminal:  # a log file gets no live bar: one line a step instead
                console.print(step_line(step, run_cfg.max_steps, metrics))
            if step % run_cfg.checkpoint_every == 0 or step == run_cfg.max_steps:
                console.print(f"step {step}: checkpoint {checkpoints.save(step, learner, orch.state_dict(), orch.lag_state())}")

        orch.on_step = on_step

        async def until_done_or_stopped() -> None:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):  # a scheduler's preemption, Ctrl-C: stop cleanly
                loop.add_signal_handler(sig, orch.request_stop, signal.Signals(sig).name)
            await orch.run()

        try:
            asyncio.run(until_done_or_stopped())
        except RolloutsFailing as e:  # say why; the checkpoints stay for a resume
            progress.stop()
            kept = checkpoints.latest()
            console.print(f"[red]error:[/red] the run stopped at step {orch.step}: {escape(str(e))}\n"
                          + (f"{kept} is kept: the same command resumes from it" if kept else "no checkpoint yet"),
                          soft_wrap=True)
            pool.close()
            engine.close()
            sys.exit(1)
        finally:
            metrics_log.close()
    if orch.stop_reason is not None and orch.step < run_cfg.max_steps:
        kept = checkpoints.latest()
        if orch.step and (kept is None or kept.name != f"step_{orch.step}"):
            kept = checkpoints.save(orch.step, learner, orch.state_dict(), orch.lag_state())
        console.print(f"stopped at step {orch.step} on {orch.stop_reason}: "
                      + (f"{kept} is kept, the same command resumes from it" if kept else "no step was taken"))
        pool.close()
        engine.close()
        sys.exit(128 + getattr(signal, orch.stop_reason, signal.SIGTERM))
    if held_out:
        summary["held_out/reward_final"] = evaluate(held_out, pool)
        console.print(f"held-apart reward after training: {summary['held_out/reward_final']:.3f}")
        held_file.write_text(json.dumps(summary, indent=2))
    plot_rewards(metrics_log.read(), out / "reward_curve.png", title=f"{cfg.algo._target_.split('.')[-1]} on {cfg.run_id}")
    pool.close()
    engine.close()
    console.print(f"metrics: {metrics_log.path}\ncheckpoints: {checkpoints.root}\nreward curve: {out / 'reward_curve.png'}")


if __name__ == "__main__":
    main()
