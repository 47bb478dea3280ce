"""Value pretraining, the paper's cure for the critic's cold start: the critic is fitted on
rollouts of the starting policy (their Monte-Carlo returns, value targets with lambda = 1)
before RL begins, and saved as a value checkpoint that training starts its critic from.

    python -m training.value_pretrain [overrides]     # the same config as training.run
    python -m training.run learner.value_checkpoint=outputs/train/<run_id>/value_checkpoint

`value_pretrain.rollouts` rollouts of the training sources (the model prepared as training
prepares it: the embedded default's SFT warm start included) are sampled once; the critic then
takes `value_pretrain.epochs` passes over them in batches of `trainer.batch_size`, K updates
each as in training, the policy untouched. Per epoch it prints the value loss and the critic's
explained variance on the batches before their update (what training's first steps would see);
`value_pretrain.json` keeps them beside the checkpoint (`value_pretrain.output`).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import hydra
import transformers
from hydra.utils import instantiate
from omegaconf import DictConfig
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from transformers import AutoTokenizer

from agent.rollout import rollout_and_grade
from sandbox.base import SandboxError
from sandbox.docker import client as docker_client
from sandbox.pool import SandboxPool
from training.config import ConfigError, check
from training.console import console, say_error
from training.factories import build_engine, make_algo, make_pool, make_source, prepare_model
from training.orchestrator import TaskSampler


def collect(cfg: DictConfig, sampler: TaskSampler, pool: SandboxPool, n: int) -> list:
    """`n` graded rollouts of the sources, one per draw; those whose sandbox failed are left out."""
    def one(i: int):
        key, source, task = sampler.next()
        traj = rollout_and_grade(source.agent, task, source.env, pool, seed=cfg.seed * 1_000_003 + key)
        traj.info.update(rollout_key=f"{key}/0", source=source.name)
        return traj

    out, failed = [], 0
    columns = [TextColumn("rollouts of the starting policy"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, console=console) as progress, ThreadPoolExecutor(cfg.trainer.num_workers) as ex:
        bar = progress.add_task("rollouts", total=n)
        for future in as_completed([ex.submit(one, i) for i in range(n)]):
            try:
                traj = future.result()
            except Exception as e:  # an infrastructure fault: nothing to learn a value from
                failed += 1
                console.print(f"a rollout failed: {escape(str(e))}")
                traj = None
            if traj is not None and traj.exit_reason == "sandbox_error":
                failed += 1
            elif traj is not None:
                out.append(traj)
            progress.advance(bar)
    if failed:
        console.print(f"{failed} of {n} rollouts failed in their sandbox and are left out")
    return out


def fit(learner, rollouts: list, batch_size: int, epochs: int, seed: int) -> list[dict]:
    """`epochs` passes of critic-only steps; per epoch the mean loss and explained variance."""
    rng = random.Random(seed)
    history = []
    for epoch in range(epochs):
        order = rollouts[:]
        rng.shuffle(order)
        batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
        metrics = [learner.step(b) for b in batches]
        ev = sum(m["value/explained_var"] for m in metrics) / len(metrics)
        loss = sum(m["value/loss"] for m in metrics) / len(metrics)
        history.append({"epoch": epoch + 1, "value/explained_var": ev, "value/loss": loss})
        console.print(f"epoch {epoch + 1}/{epochs}: value loss {loss:.4f}, explained variance before the update {ev:.3f}")
    return history


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        check(cfg)
        algo = make_algo(cfg)
        if not algo.uses_critic:
            raise ConfigError(f"config field algo = {cfg.algo._target_!r}: value pretraining fits a critic, and this "
                              "algo has none (use algo=sao with algo.baseline=critic)")
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise ConfigError("value pretraining runs in one process: start it with python, not torchrun")
        vp = cfg.value_pretrain
        if vp.rollouts < 1 or vp.epochs < 1:
            raise ConfigError(f"config field value_pretrain = {dict(vp)!r}: rollouts and epochs must be >= 1")
        docker_client()
    except (ConfigError, SandboxError) as e:
        say_error(e)
        sys.exit(2)
    transformers.utils.logging.disable_progress_bar()  # loading and writing bars would break up the run's own
    out = Path(vp.output)
    model_path = prepare_model(cfg.model)
    algo.critic_warmup, algo.critic_warmup_steps = "steps", 1 << 62  # critic-only steps: the policy stays as it is
    learner = instantiate(cfg.learner)(model_path=model_path, algo=algo, sampling_temperature=cfg.agent.temperature,
                                       seed=cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    engine = build_engine(cfg.engine, model_path)
    pool = make_pool(cfg, f"{cfg.run_id}-value", max_live=2 * cfg.trainer.num_workers + 1)
    try:
        sampler = TaskSampler([make_source(s, engine, tokenizer, cfg) for s in cfg.sources], cfg.seed)
        rollouts = collect(cfg, sampler, pool, vp.rollouts)
    finally:
        pool.close()
        engine.close()
    if not rollouts:
        console.print("[red]error:[/red] every rollout failed in its sandbox: nothing to fit (see the messages above)")
        sys.exit(1)
    rewards = [t.reward for t in rollouts]
    console.print(f"{len(rollouts)} rollouts, reward mean {sum(rewards) / len(rewards):.3f}")
    history = fit(learner, rollouts, cfg.trainer.batch_size, vp.epochs, cfg.seed)
    staging = out.parent / f".{out.name}.learner"
    shutil.rmtree(staging, ignore_errors=True)
    learner.save(staging)
    shutil.rmtree(out, ignore_errors=True)
    (staging / "critic").rename(out)
    shutil.rmtree(staging, ignore_errors=True)
    summary = {"rollouts": len(rollouts), "reward_mean": sum(rewards) / len(rewards), "epochs": history,
               "model": model_path}
    (out / "value_pretrain.json").write_text(json.dumps(summary, indent=2))
    console.print(f"value checkpoint: {out}\nuse it: python -m training.run learner.value_checkpoint={out}")


if __name__ == "__main__":
    main()
