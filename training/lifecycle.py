"""A training run's life, whatever runtime holds its parts (training/runtime/): resume from the
newest checkpoint, score the held-apart prompts, stream rollouts into the learner until
`trainer.max_steps` (a progress bar, or one line a step in a log; a checkpoint every
`trainer.checkpoint_every`), score the held-apart prompts again, draw the reward curve.

Everything it opens is closed through one ExitStack however the run ends, and the run's end
is an exit code: 0 done, 1 stopped by failing rollouts, 2 a checkpoint this learner cannot
load, 128 + the signal when stopped by SIGTERM / Ctrl-C (each with a checkpoint to resume from).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from pathlib import Path

from omegaconf import DictConfig
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from transformers import AutoTokenizer

from training.checkpoint import LAG_FILE, Checkpoints, MetricsLog
from training.console import console, say_error
from training.factories import build_engine, make_pool, make_source
from training.learners.base import LayoutError
from training.orchestrator import Orchestrator, RolloutsFailing, RunConfig, TaskSampler, evaluate
from training.plan import planned_share
from training.plots import plot_rewards
from training.runtime.base import Runtime

STEP_LINE = (("reward", "reward/mean", ".3f"), ("masked low", "sao/mask_frac_low", ".3f"),
             ("masked high", "sao/mask_frac_high", ".3f"), ("clipfrac", "ppo/clipfrac", ".3f"),
             ("explained_var", "value/explained_var", ".2f"), ("staleness", "staleness/mean", ".2f"),
             ("learner idle", "time/learner_idle_frac", ".2f"), ("step s", "time/step/wall_s", ".1f"),
             ("learner s", "time/step/learner_s", ".1f"), ("sync s", "time/step/weight_sync_s", ".2f"),
             ("rollout p95 s", "time/rollout/rollout_p95_s", ".1f"), ("tok/s", "time/rollout/tokens_per_s", ".0f"))


def step_line(step: int, max_steps: int, metrics: dict) -> str:
    """One step's health in one line, for logs; only what this algo reports (the metrics file
    has everything)."""
    parts = [f"{label} {metrics[key]:{fmt}}" for label, key, fmt in STEP_LINE if metrics.get(key) is not None]
    return f"step {step}/{max_steps}  " + "  ".join(parts)


def resumed_engine_weights(orch: Orchestrator, learner, checkpoint: Path) -> tuple[list, int]:
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


def train(cfg: DictConfig, runtime: Runtime) -> int:
    """The run's story (module docstring); returns the exit code."""
    out = Path(cfg.output_dir)
    learner = runtime.learner
    with contextlib.ExitStack() as stack:
        tokenizer = AutoTokenizer.from_pretrained(runtime.model_path)
        engine = runtime.engine or build_engine(cfg.engine, runtime.model_path, share=planned_share(cfg))
        stack.callback(engine.close)
        sampler = TaskSampler([make_source(s, engine, tokenizer, cfg) for s in cfg.sources], cfg.seed)
        # two sandboxes a rollout: its own and the clean one made ready for its grading
        pool = stack.enter_context(contextlib.closing(make_pool(cfg, cfg.run_id, max_live=2 * cfg.trainer.num_workers + 1)))
        run_cfg = RunConfig(**cfg.trainer)
        checkpoints = Checkpoints(out, run_cfg.keep_checkpoints, run_cfg.keep_every)
        orch = Orchestrator(run_cfg, sampler, pool, engine, learner, on_step=lambda *a: None, rollout=runtime.rollout)
        latest = checkpoints.latest() if cfg.resume else None
        if latest is not None:
            try:
                learner.load(latest)
            except LayoutError as e:  # a checkpoint of another parallel layout
                say_error(e)
                return 2
            state = json.loads((latest / "run_state.json").read_text())
            orch.step = state["step"]
            sampler.load_state_dict(state["sampler"])
            orch.stream.load_state_dict(state["stream"])
            engine.update_weights(*resumed_engine_weights(orch, learner, latest))
            console.print(f"resumed from {latest} (step {orch.step}, policy version {learner.version})")
            if orch.step >= run_cfg.max_steps:
                console.print(f"{out} already holds all {run_cfg.max_steps} steps: trainer.max_steps=N (N > {orch.step}) "
                              "trains on from here, resume=false or another output_dir starts over")
        metrics_log = stack.enter_context(contextlib.closing(MetricsLog(out, orch.step, run_cfg.log_tokens)))
        held_out = make_source(cfg.held_out, engine, tokenizer, cfg) if cfg.held_out else None
        held_file = out / "held_out.json"
        summary = json.loads(held_file.read_text()) if latest is not None and held_file.exists() else {}
        if held_out and "held_out/reward_initial" not in summary:
            summary["held_out/reward_initial"] = evaluate(held_out, pool)
            held_file.write_text(json.dumps(summary, indent=2))  # kept across a crash and resume
            console.print(f"held-apart reward before training: {summary['held_out/reward_initial']:.3f}")

        try:
            _stream(orch, run_cfg, metrics_log, checkpoints, learner)
        except RolloutsFailing as e:  # say why; the checkpoints stay for a resume
            kept = checkpoints.latest()
            say_error(f"the run stopped at step {orch.step}: {e}\n"
                      + (f"{kept} is kept: the same command resumes from it" if kept else "no checkpoint yet"))
            return 1
        if orch.stop_reason is not None and orch.step < run_cfg.max_steps:
            kept = checkpoints.latest()
            if orch.step and (kept is None or kept.name != f"step_{orch.step}"):
                kept = checkpoints.save(orch.step, learner, orch.state_dict(), orch.lag_state())
            console.print(f"stopped at step {orch.step} on {orch.stop_reason}: "
                          + (f"{kept} is kept, the same command resumes from it" if kept else "no step was taken"))
            return 128 + getattr(signal, orch.stop_reason, signal.SIGTERM)
        if held_out:
            summary["held_out/reward_final"] = evaluate(held_out, pool)
            console.print(f"held-apart reward after training: {summary['held_out/reward_final']:.3f}")
            held_file.write_text(json.dumps(summary, indent=2))
        plot_rewards(metrics_log.read(), out / "reward_curve.png", title=f"{cfg.algo._target_.split('.')[-1]} on {cfg.run_id}")
    console.print(f"metrics: {metrics_log.path}\ncheckpoints: {checkpoints.root}\nreward curve: {out / 'reward_curve.png'}")
    return 0


def _stream(orch: Orchestrator, run_cfg: RunConfig, metrics_log: MetricsLog, checkpoints: Checkpoints, learner) -> None:
    """The orchestrator's loop under a progress bar (one line a step where stderr is a log),
    a checkpoint every `checkpoint_every` steps; SIGTERM and Ctrl-C stop it cleanly."""
    columns = [TextColumn("training"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("reward {task.fields[reward]:.2f}  staleness {task.fields[stale]:.2f}")]
    with Progress(*columns, console=console) as progress:
        bar = progress.add_task("train", total=run_cfg.max_steps, completed=orch.step, reward=0.0, stale=0.0)

        def on_step(step: int, metrics: dict, batch) -> dict[str, float]:
            metrics_log.log(step, metrics)
            metrics_log.log_rollouts(step, batch)
            progress.update(bar, completed=step, reward=metrics["reward/mean"], stale=metrics["staleness/mean"])
            if not console.is_terminal:  # a log file gets no live bar: one line a step instead
                console.print(step_line(step, run_cfg.max_steps, metrics))
            if step % run_cfg.checkpoint_every == 0 or step == run_cfg.max_steps:
                t0 = time.monotonic()
                console.print(f"step {step}: checkpoint {checkpoints.save(step, learner, orch.state_dict(), orch.lag_state())}")
                return {"checkpoint": time.monotonic() - t0}  # (in the next step's time/step/checkpoint_s)
            return {}

        orch.on_step = on_step

        async def until_done_or_stopped() -> None:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):  # a scheduler's preemption, Ctrl-C: stop cleanly
                loop.add_signal_handler(sig, orch.request_stop, signal.Signals(sig).name)
            await orch.run()

        asyncio.run(until_done_or_stopped())
