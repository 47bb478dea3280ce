"""TRL's GRPOTrainer (the peer a user would pick instead) beside this project's SAO and GRPO,
on the same env, prompts and model: reward against samples and against wall time.

    python -m experiments.peer [--steps 16] [--batch-size 16] [--engine auto] [--quick]
        [--cases trl_grpo sao grpo ...] [--seeds 0 1 2] [--cpu]
        [--output FILE.json [--resume]] [--plot FILE.png] [overrides ...]

`--cases` picks the runs (CASES below: TRL, and the project's GRPO and SAO streaming as the
default run does, synchronous and on-policy as TRL is, synchronous with every sample exactly k
versions old, or sampled by transformers' generate as TRL samples), `--seeds` repeats each
(`seed=S` reaches TRL's GRPOConfig and the project's run alike); the table gives each case's
mean over the seeds and its standard error. The JSON is written after every run; with `--resume`
a sweep cut short goes on, the runs the file holds kept (its settings must be these).

The env is `prefer` (a hidden preferred digit named through the `answer` tool), the model the
embedded tiny one after its SFT warm start (`training.factories.prepare_model`, the same cached
checkpoint). SAO and GRPO are `python -m training.run +experiment=peer_prefer algo=...`, read
from their `metrics.jsonl`. TRL gets the same prompts rendered by the project's ChatRenderer
(system prompt, tool definitions, generation prompt) and a reward function that runs the
completion's tool calls through the project's parser, ToolBox and the env's own grader, each
in a real sandbox of its own, as a project rollout is. Settings are matched where TRL allows; the
rest is listed in the output (UNMATCHED).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import mean, stdev

from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table
from transformers import TrainerCallback

from benchmarks.common import read_jsonl
from benchmarks.cpu import GROUPS, CpuAccount, count_lines, window

ROOT = Path(__file__).resolve().parents[1]
console = Console(stderr=True)
# name: (label, the project's algo (None: TRL), its overrides). Streaming is the project's default
# (trainer.mode=async: rollouts sampled while the learner steps, staleness set by timing);
# sync waits for the whole batch, trains, then syncs (on-policy, as TRL); engine_lag=k samples
# every rollout with the policy of exactly k versions ago, so staleness is set, not timed.
CASES = {
    "trl_grpo": ("TRL GRPOTrainer", None, []),
    "sao": ("project SAO", "sao", []),
    "grpo": ("project GRPO", "grpo", []),
    "grpo_sync": ("project GRPO, synchronous", "grpo", ["trainer.mode=sync"]),
    "grpo_sync_hf": ("project GRPO, synchronous, HF generate", "grpo", ["trainer.mode=sync", "engine=hf"]),
    "grpo_lag1": ("project GRPO, every sample 1 version old", "grpo", ["trainer.mode=sync", "trainer.engine_lag=1"]),
    "grpo_lag4": ("project GRPO, every sample 4 versions old", "grpo", ["trainer.mode=sync", "trainer.engine_lag=4"]),
    "sao_sync": ("project SAO, synchronous", "sao", ["trainer.mode=sync"]),
    "sao_lag4": ("project SAO, every sample 4 versions old", "sao", ["trainer.mode=sync", "trainer.engine_lag=4"]),
}
DEFAULT_CASES = ("trl_grpo", "sao", "grpo")
LABELS = {name: label for name, (label, _, _) in CASES.items()}
GROUP_SIZE = 8  # GRPO-style group, TRL's num_generations and the project's algo.group_size
MINIBATCHES = 4  # the project's GRPO: optimizer steps per batch against one pi_old (conf/algo/grpo.yaml)
UNMATCHED = [
    "sampling engine: the project samples with its engine (`--engine`, vLLM's CPU build under auto); "
    "TRL with transformers' model.generate (its vLLM path needs CUDA)",
    "sandbox: each project rollout starts its Docker container as it begins, beside its first turn's "
    "generation, and waits for it at its first tool call (the answer tool writes a file there, the env "
    "grades it in place); the container is removed after the rollout has returned. TRL's reward function "
    "makes the container only after generation, for the tools and the grading, and removes it before "
    "taking the next (trainer.num_workers at a time)",
    "streaming: the project trains as rollouts arrive (trainer.mode=async, 2 workers, staleness up to 4); "
    "TRL generates a whole batch, then trains on it (on-policy)",
    "SAO has no TRL counterpart (group size 1, a critic with 5 critic-only warm-up steps); "
    "TRL is matched to the project's GRPO",
    "group-normalised advantage: TRL divides by std + 1e-4, the project by std + 1e-6",
    "prompt order: TRL's sampler shuffles the same 256 prompts its own way; the project's TaskSampler its way",
]


# -- the project's runs ----------------------------------------------------------------------
def project_run(name: str, seed: int, args: argparse.Namespace, out: Path) -> dict:
    """One `training.run` of case `name` on the prefer env; its reward curve from metrics.jsonl."""
    _, algo, extra = CASES[name]
    engine = [o for o in extra if o.startswith("engine=")] or [f"engine={args.engine}"]
    extra = [o for o in extra if not o.startswith("engine=")]
    cmd = [sys.executable, "-m", "training.run", "+experiment=peer_prefer", f"algo={algo}", *extra,
           f"trainer.max_steps={args.steps}", f"trainer.batch_size={args.batch_size}",
           f"trainer.checkpoint_every={args.steps}", *engine, "resume=false", f"seed={seed}",
           f"output_dir={out}", f"run_id=bench-peer-{name}-s{seed}-{int(time.time())}", *args.overrides]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    account = CpuAccount(proc.pid, count_lines(out / "metrics.jsonl")).start() if args.cpu else None
    _, stderr = proc.communicate()
    process_s = time.monotonic() - t0
    samples = account.stop() if account else None
    if proc.returncode != 0:
        raise SystemExit(f"{name} run failed ({' '.join(cmd)}):\n{stderr[-3000:]}")
    rows = read_jsonl(out / "metrics.jsonl")
    curve = [{"step": row["step"], "samples": row["step"] * args.batch_size, "reward": row["reward/mean"],
              "elapsed_s": row["time/elapsed_s"], "staleness": row.get("staleness/mean"),
              **{k: row[k] for k in row if k.startswith(("time/step/", "time/share/", "time/rollout/", "time/learner/"))}}
             for row in rows]
    return {"curve": curve, "process_s": process_s, **cpu_of(samples, args)}


def cpu_of(samples: list[dict] | None, args: argparse.Namespace) -> dict:
    """With --cpu: the machine's CPU seconds by group (benchmarks/cpu.py) from the end of the
    first step to the end of the last, in all and per sample."""
    if samples is None:
        return {}
    cut = window(samples, 1, args.steps)
    if cut is None:
        return {"cpu": None}
    n = (args.steps - 1) * args.batch_size
    return {"cpu": {"seconds": cut, "per_sample": {k: v / n for k, v in cut.items()}}}


# -- TRL's run -------------------------------------------------------------------------------
def trl_run(cfg, model_path: str, args: argparse.Namespace, out: Path) -> dict:
    """TRL's GRPOTrainer on the prefer prompts, the project's settings where TRL has them."""
    import torch
    from datasets import Dataset
    from hydra.utils import instantiate
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from agent.chat import ChatRenderer
    from agent.tools import ToolBox
    from sandbox.pool import SandboxPool
    from training.factories import agent_settings, make_source_env

    spec = cfg.sources[0]
    env, tasks = make_source_env(spec), {t.instance_id: t for t in instantiate(spec.tasks)}
    agent = agent_settings(cfg, spec.agent)[2]
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    eos_id = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)

    def toolbox(task, sandbox):  # as agent.loop builds one for a rollout of this env
        handlers = env.tool_handlers(task, sandbox) if hasattr(env, "tool_handlers") else None
        return ToolBox(sandbox, tools=env.tools, default_timeout_s=agent.command_timeout_s,
                       max_output_bytes=agent.max_observation_bytes, handlers=handlers)

    pool = SandboxPool(f"bench-peer-{int(time.time())}", limits=instantiate(cfg.sandbox),
                       max_live=cfg.trainer.num_workers)
    first = next(iter(tasks.values()))
    with pool.sandbox(env.image_for(first)) as sb:  # the prompts, as a rollout's reset gives them
        renderer = ChatRenderer(tokenizer, toolbox(first, sb).definitions, agent.family)
        prompts = {k: renderer.render([{"role": "system", "content": env.system_prompt},
                                       {"role": "user", "content": env.reset(t, sb)}], add_generation_prompt=True)
                   for k, t in tasks.items()}
    dataset = Dataset.from_list([{"prompt": text, "instance_id": k} for k, text in prompts.items()])
    log = RewardLog(args.batch_size)

    def one_reward(ids, key) -> float:
        """1.0 iff the completion's tool calls, run as the agent runs them in a fresh sandbox,
        answer the preferred digit."""
        ids = list(ids)
        text = renderer.decode(ids[:-1] if ids and ids[-1] == eos_id else ids)  # as agent.loop decodes
        parsed, task = renderer.parse(text), tasks[key]
        with pool.sandbox(env.image_for(task)) as sandbox:
            env.reset(task, sandbox)
            tools = toolbox(task, sandbox)
            for call in parsed.calls:  # agent.loop.Agent._act: in order, until one ends the episode
                if tools.run(call.name, call.arguments).submitted:
                    break
            return float(env.grade(task, sandbox).resolved)

    def prefer_reward(prompts, completions, completion_ids, instance_id, **_) -> list[float]:
        t0 = time.monotonic()
        with ThreadPoolExecutor(cfg.trainer.num_workers) as workers:
            rewards = list(workers.map(one_reward, completion_ids, instance_id))
        log.pending.extend(rewards)
        log.reward_s += time.monotonic() - t0  # containers, tools and grading: the step's reward phase
        return rewards

    lr = cfg.model.algo_overrides.lr_policy  # the tiny model's, as make_algo gives SAO and GRPO
    grpo = OmegaConf.load(ROOT / "conf" / "algo" / "grpo.yaml")  # its clip range: TRL's epsilon, epsilon_high
    trl_args = GRPOConfig(
        output_dir=str(out), seed=cfg.seed, report_to="none", save_strategy="no", disable_tqdm=True,
        logging_steps=MINIBATCHES, bf16=False, use_cpu=True,
        learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
        num_generations=GROUP_SIZE, per_device_train_batch_size=args.batch_size // MINIBATCHES,
        steps_per_generation=MINIBATCHES, gradient_accumulation_steps=1, num_iterations=1,
        max_steps=args.steps * MINIBATCHES, max_completion_length=spec.agent.max_new_tokens,
        temperature=agent.temperature, top_p=agent.top_p, top_k=0, beta=0.0,
        epsilon=grpo.eps_low, epsilon_high=grpo.eps_high,
        scale_rewards="group", loss_type="bnpo",  # bnpo: a token mean over each minibatch, as ppo_clip_loss
    )
    t0 = time.monotonic()
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    trainer = GRPOTrainer(model=model, reward_funcs=prefer_reward, args=trl_args, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[log])
    trainer.remove_callback(PrinterCallback)  # its per-step dicts; RewardLog prints one line a step
    account = CpuAccount(os.getpid(), lambda: len(log.rows)).start() if args.cpu else None
    try:
        trainer.train()
    finally:
        pool.close()
        samples = account.stop() if account else None
    return {"curve": log.rows, "process_s": time.monotonic() - t0, **cpu_of(samples, args),
            "settings": {k: getattr(trl_args, k) for k in (
                "learning_rate", "lr_scheduler_type", "num_generations", "per_device_train_batch_size",
                "steps_per_generation", "generation_batch_size", "max_steps", "max_completion_length",
                "temperature", "top_p", "beta", "epsilon", "epsilon_high", "scale_rewards", "loss_type")}}


class RewardLog(TrainerCallback):
    """One row per generation batch: the rewards the reward function gave it, and the wall
    time when the last of its optimizer steps ended (as the project's `time/elapsed_s`)."""

    def __init__(self, batch_size: int):
        self.batch_size, self.pending, self.rows, self.t0 = batch_size, [], [], 0.0
        self.reward_s = 0.0  # seconds in the reward function since the last row

    def on_train_begin(self, args, state, control, **kwargs):
        self.t0 = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % args.steps_per_generation:
            return
        step = state.global_step // args.steps_per_generation
        self.rows.append({"step": step, "samples": step * self.batch_size, "reward": mean(self.pending),
                          "elapsed_s": time.monotonic() - self.t0, "reward_s": self.reward_s})
        self.reward_s = 0.0
        console.print(f"trl step {step}  reward {mean(self.pending):.3f}  {self.rows[-1]['elapsed_s']:.1f}s")
        self.pending = []


# -- the comparison --------------------------------------------------------------------------
def summary(run: dict) -> dict:
    """Reward over the first and the last 20% of samples, samples per second of training,
    training wall time (from the start of the training loop to the end of the last step) and
    the run's whole time: the subprocess of a project run (start-up: model, engine, Docker),
    TRL's from loading the model (its import, which loads vLLM, is not counted); for a project
    run, the mean staleness of its samples (versions behind the learner)."""
    curve = run["curve"]
    total = curve[-1]["samples"]
    tail = [r["reward"] for r in curve if r["samples"] > 0.8 * total] or [curve[-1]["reward"]]
    head = [r["reward"] for r in curve if r["samples"] <= 0.2 * total] or [curve[0]["reward"]]
    wall = curve[-1]["elapsed_s"]
    stale = [r["staleness"] for r in curve if r.get("staleness") is not None]
    return {"samples": total, "reward_first_20pct": mean(head), "reward_last_20pct": mean(tail),
            "samples_per_s": total / wall, "train_s": wall, "process_s": run["process_s"],
            "staleness_mean": mean(stale) if stale else 0.0}


def over_seeds(by_seed: dict[str, dict]) -> dict:
    """A case's summaries over its seeds: each figure's mean, and for the rewards the standard
    error of that mean (0 with one seed) and each seed's value."""
    sums = [run["summary"] for run in by_seed.values()]
    out = {k: mean(s[k] for s in sums) for k in sums[0]}
    for k in ("reward_first_20pct", "reward_last_20pct"):
        values = [s[k] for s in sums]
        out[f"{k}_se"] = stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0
        out[f"{k}_by_seed"] = values
    out["seeds"] = len(sums)
    return out


def mean_curve(by_seed: dict[str, dict]) -> list[dict]:
    """The seeds' curves step by step: the mean reward and the mean wall time of each step."""
    curves = [run["curve"] for run in by_seed.values()]
    return [{"samples": rows[0]["samples"], "reward": mean(r["reward"] for r in rows),
             "elapsed_s": mean(r["elapsed_s"] for r in rows)} for rows in zip(*curves)]


def kept_runs(saved: dict, report: dict) -> dict[str, dict]:
    """The runs of a sweep written earlier that this one keeps (`--resume`): those of its cases
    and seeds; a file of other settings is refused (a ValueError naming the field)."""
    for key in ("steps", "batch_size", "engine", "model", "lr_policy", "max_new_tokens", "overrides"):
        a, b = saved.get(key), report[key]
        if key == "model":  # the SFT cache's folder, named by what made it; its parent is the machine's
            a, b = Path(a or "").name, Path(b).name
        if a != b:
            raise ValueError(f"--resume: the runs saved in it have {key}={a!r}, this sweep {b!r}")
    return {name: {seed: run for seed, run in saved["runs"][name]["by_seed"].items() if int(seed) in report["seeds"]}
            for name in report["runs"] if name in saved.get("runs", {})}


def plot(results: dict, path: Path, window: int = 4) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    seeds = 0
    for name, case in results.items():
        curve = mean_curve(case["by_seed"])
        seeds = max(seeds, len(case["by_seed"]))
        reward = [r["reward"] for r in curve]
        smooth = [mean(reward[max(0, i - window + 1): i + 1]) for i in range(len(reward))]
        for ax, x in zip(axes, ("samples", "elapsed_s")):
            xs = [r[x] for r in curve]
            line, = ax.plot(xs, smooth, "-", lw=2, label=LABELS[name])
            ax.plot(xs, reward, "o", ms=3, alpha=0.3, color=line.get_color())
    axes[0].set_xlabel("samples (completions graded)")
    axes[1].set_xlabel("training wall seconds")
    what = "a batch" if seeds == 1 else f"a batch, mean of {seeds} seeds"
    axes[0].set_ylabel(f"reward (dots: {what}; line: mean of last {window})")
    for ax in axes:
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[1].legend(loc="lower right", fontsize=7)
    fig.suptitle("prefer env, tiny Qwen2 after SFT: TRL GRPOTrainer vs this project's SAO and GRPO")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def composed(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("config", overrides=["+experiment=peer_prefer", *overrides])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.peer", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=16, help="learner steps of each run (TRL: generation batches)")
    p.add_argument("--batch-size", type=int, default=16, help="samples per step, a multiple of 8 (a GRPO group)")
    p.add_argument("--engine", default="auto", help="the project's engine (auto: vLLM where installed)")
    p.add_argument("--cases", nargs="+", default=list(DEFAULT_CASES), metavar="CASE",
                   help=f"the runs, in this order: {', '.join(CASES)} (default: {' '.join(DEFAULT_CASES)})")
    p.add_argument("--seeds", nargs="+", type=int, default=[0], help="each case once per seed (default: 0)")
    p.add_argument("--quick", action="store_true", help="2 steps of 8 samples each, engine hf, a 10-step SFT (tests)")
    p.add_argument("--cpu", action="store_true", help="also account the machine's CPU seconds per sample by "
                   "process group (trainer, engine, Docker, containers: benchmarks/cpu.py), from step 1 to the last")
    p.add_argument("--output", type=Path, help="the raw curves and summaries as JSON (written after every run)")
    p.add_argument("--resume", action="store_true", help="keep the runs --output already holds (same settings), run the rest")
    p.add_argument("--plot", type=Path, help="reward vs samples and vs wall seconds (PNG)")
    p.add_argument("overrides", nargs="*", help="more training.run overrides, for all runs (model.* too)")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.batch_size, args.engine = 2, 8, "hf"
        args.overrides = ["model.sft.steps=10", *args.overrides]
    if args.batch_size % GROUP_SIZE or args.batch_size % MINIBATCHES:
        p.error(f"--batch-size {args.batch_size}: must be a multiple of {GROUP_SIZE} (whole groups) "
                f"and of {MINIBATCHES} (GRPO's minibatches)")
    unknown = [c for c in args.cases if c not in CASES]
    if unknown:
        p.error(f"--cases: no case {', '.join(unknown)}; the cases are {', '.join(CASES)}")
    if len(set(args.cases)) < len(args.cases) or len(set(args.seeds)) < len(args.seeds):
        p.error("--cases and --seeds: each at most once")
    if args.resume and not args.output:
        p.error("--resume goes on with the runs in --output FILE: give it")
    if any(o.split("=", 1)[0].lstrip("+~") == "seed" for o in args.overrides):
        p.error("give the seed with --seeds, not as an override (it goes to TRL and to every project run)")
    warnings.filterwarnings("ignore", message="TRL currently supports vLLM")  # its vLLM path is not used
    try:
        import trl
    except ImportError:
        p.error("TRL is not installed: pip install -e '.[peer]'")
    from training.factories import prepare_model

    cfg = composed(args.overrides)
    model_path = prepare_model(cfg.model)  # the cached SFT checkpoint every run starts from
    results: dict[str, dict] = {name: {"by_seed": {}} for name in args.cases}
    report = {"steps": args.steps, "batch_size": args.batch_size, "engine": args.engine, "model": model_path,
              "trl_version": trl.__version__, "lr_policy": cfg.model.algo_overrides.lr_policy,
              "max_new_tokens": cfg.sources[0].agent.max_new_tokens, "seeds": args.seeds,
              "cases": {name: {"label": LABELS[name], "overrides": CASES[name][2]} for name in args.cases},
              "overrides": args.overrides, "unmatched": UNMATCHED, "runs": results}
    if args.resume and args.output.exists():
        try:
            done = kept_runs(json.loads(args.output.read_text()), report)
        except ValueError as e:
            p.error(f"{args.output}: {e}")
        for name, by_seed in done.items():
            results[name]["by_seed"].update(by_seed)
            results[name]["summary"] = over_seeds(results[name]["by_seed"])
        console.print(f"--resume: {sum(map(len, done.values()))} runs kept from {args.output}")
    with tempfile.TemporaryDirectory(prefix="sao-peer-") as tmp:
        for seed in args.seeds:
            for name in args.cases:
                if str(seed) in results[name]["by_seed"]:
                    continue
                console.print(f"{LABELS[name]}, seed {seed}: {args.steps} x {args.batch_size} samples"
                              + (f" (TRL {trl.__version__})" if CASES[name][1] is None else ""))
                out = Path(tmp) / f"{name}-s{seed}"
                if CASES[name][1] is None:
                    run = trl_run(composed([*args.overrides, f"seed={seed}"]), model_path, args, out)
                else:
                    run = project_run(name, seed, args, out)
                run["summary"] = summary(run)
                results[name]["by_seed"][str(seed)] = run
                results[name]["summary"] = over_seeds(results[name]["by_seed"])
                if args.output:  # a long sweep keeps what it has done
                    args.output.parent.mkdir(parents=True, exist_ok=True)
                    args.output.write_text(json.dumps(report, indent=2))

    n = len(args.seeds)
    table = Table(title=f"prefer env, tiny model after SFT: {args.steps} steps x {args.batch_size} samples, "
                        f"seed{'s' if n > 1 else ''} {' '.join(map(str, args.seeds))} "
                        f"(project engine {args.engine}; TRL {trl.__version__})")
    cols = ("run", "samples", "reward first 20%", "reward last 20%" + (f" (mean of {n} ± s.e.)" if n > 1 else ""),
            "staleness", "samples/s", "train s", "process s")
    for col in cols:
        table.add_column(col, justify="left" if col == "run" else "right")
    for name in args.cases:
        s = results[name]["summary"]
        last = f"{s['reward_last_20pct']:.3f}" + (f" ± {s['reward_last_20pct_se']:.3f}" if n > 1 else "")
        table.add_row(LABELS[name], str(s["samples"]), f"{s['reward_first_20pct']:.3f}", last,
                      "" if CASES[name][1] is None else f"{s['staleness_mean']:.2f}",
                      f"{s['samples_per_s']:.2f}", f"{s['train_s']:.0f}", f"{s['process_s']:.0f}")
    Console(width=160).print(table)
    Console(width=140).print("settings not matched:\n" + "\n".join(f"- {u}" for u in UNMATCHED))
    if args.cpu:
        cpu = Table(title="the machine's CPU seconds per sample, by process group, from the end of step 1 to the last "
                          f"(benchmarks/cpu.py; seed {args.seeds[0]})")
        for col in ("run", *GROUPS, "busy", "wall s / sample"):
            cpu.add_column(col, justify="left" if col == "run" else "right")
        for name in args.cases:
            c = results[name]["by_seed"][str(args.seeds[0])].get("cpu")
            if c:
                per = c["per_sample"]
                cpu.add_row(LABELS[name], *(f"{per[g]:.3f}" for g in (*GROUPS, "busy", "wall_s")))
        Console(width=160).print(cpu)
    if args.output:
        args.output.write_text(json.dumps(report, indent=2))
    if args.plot:
        plot(results, args.plot)
    print(json.dumps({name: results[name]["summary"] for name in args.cases}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
