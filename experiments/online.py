"""The paper's online-learning experiment (§4.5) in miniature: SAO with its critic against the
running-mean baseline over the 128 most recent rewards, on the env whose rewarded writing
style switches cute -> chuunibyou -> classical (envs/online.py, +experiment=online).

    python -m experiments.online [--seeds 0 1] [--updates N] [--quick] [--output FILE]
                                [--plot FILE.png] [--window 3] [--threshold 0.5] [hydra overrides ...]

Runs `python -m training.run +experiment=online` once per baseline and seed, same seed and the
same budget of policy updates (`--updates`, by default the experiment's trainer.max_steps less
SAO's critic-only warm-up steps): `sao` as configured (conf/algo/sao.yaml: the critic, which
first takes its warm-up steps, batches that update only the critic; they come on top) and
`running_mean` (`algo.baseline=running_mean algo.baseline_scope=global algo.baseline_window=128`,
no critic, so no warm-up). The phases switch at policy versions, so both runs meet each switch
after the same number of policy updates. The env records each grading (style answered, style
rewarded, phase); joined on the instance id with the run's rollouts.jsonl, that gives per
learner step the reward and the share of each style among the rollouts trained on.

A phase's **switch step** is the first learner step whose batch was at least half graded under
that phase. **Steps to recover** after a switch: the first step t from the switch step on such
that the mean reward over steps t .. t+window-1 is at least `threshold` (all inside the phase),
counted as t - switch step (0: the first window is already there); "never" when no such window
exists in the phase. For phase 0 the same count runs from the first policy update and says how
fast each run learns at all. Per phase it also gives the mean reward over its steps and over
its last `window` steps (the share answering the rewarded style: reward is 1 exactly then), and
over those last steps the share answering the style the previous phase rewarded and the share
naming no style (no well-formed `answer` call, or a name in no pool).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import mean

from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table

from benchmarks.common import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
RUNS = {  # label: the overrides that make it
    "sao": [],
    "running_mean": ["algo.baseline=running_mean", "algo.baseline_scope=global", "algo.baseline_window=128"],
}
# --quick (the test): three short phases, small batches, a short SFT, the transformers engine
QUICK_PHASES = [{"start": 0, "pool": ["cute", "chuunibyou"], "rewarded": "cute"},
                {"start": 2, "pool": ["cute", "chuunibyou"], "rewarded": "chuunibyou"},
                {"start": 4, "pool": ["classical", "chuunibyou"], "rewarded": "classical"}]
QUICK = ["trainer.max_steps=7", "trainer.batch_size=4", "trainer.num_workers=2", "engine=hf", "model.sft.steps=10",
         "model.algo_overrides.critic_warmup_steps=1"]  # 6 policy updates: two per phase
NONE = "(none)"  # a rollout that answered nothing, or no style of any pool


def _flow(value) -> str:
    """A value in Hydra's override grammar (lists and dicts in flow style, strings quoted)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    if isinstance(value, (int, float)):
        return str(value)
    return "'" + str(value).replace("'", "\\'") + "'"


def settings(label: str, phases: list[dict] | None, overrides: list[str]) -> dict:
    """What a run will do, from the config it composes: its phases, batch size, and critic-only
    warm-up steps (learner steps that make no policy update)."""
    from hydra import compose, initialize_config_dir

    from training.factories import make_algo

    extra = [f"+sources.0.env_options={_flow({'phases': phases})}"] if phases else []
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["+experiment=online", *RUNS[label], *extra, *overrides])
    algo = make_algo(cfg)
    warmup = 0
    while algo.uses_critic and not algo.policy_updates_at(warmup):
        warmup += 1
    options = cfg.sources[0].get("env_options") or {}
    env_phases = options.get("phases") or OmegaConf.load(ROOT / "conf" / "env" / "online.yaml").phases
    return {"warmup_steps": warmup, "batch_size": cfg.trainer.batch_size, "max_steps": cfg.trainer.max_steps,
            "phases": OmegaConf.to_container(env_phases)}


def train(label: str, seed: int, out: Path, phases: list[dict] | None, overrides: list[str]) -> Path:
    """One `training.run +experiment=online` into `out`; the env's grading record is
    `out/record.jsonl`. A failed run ends the benchmark with its stderr's tail."""
    options = {"record": str(out / "record.jsonl"), **({"phases": phases} if phases else {})}
    cmd = [sys.executable, "-m", "training.run", "+experiment=online", *RUNS[label], f"seed={seed}",
           f"output_dir={out}", f"run_id=bench-online-{label}-{seed}-{int(time.time())}", "resume=false",
           f"+sources.0.env_options={_flow(options)}", *overrides]
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    (out / "stderr.log").write_text(r.stderr)  # (run.log is Hydra's own)
    if r.returncode != 0:
        raise SystemExit(f"{label} (seed {seed}) failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    Console(stderr=True).print(f"{label} seed {seed}: {time.monotonic() - t0:.0f} s")
    return out


def per_step(out: Path, styles: list[str]) -> dict:
    """Per learner step of a finished run: mean reward, the majority phase, the policy version,
    and the share of each style (and of none: no answer, or a name in no pool) among the
    rollouts trained on."""
    graded = {g["instance_id"]: g for g in read_jsonl(out / "record.jsonl")}
    metrics = {m["step"]: m for m in read_jsonl(out / "metrics.jsonl")}
    by_step: dict[int, list[dict]] = {}
    for r in read_jsonl(out / "rollouts.jsonl"):
        g = graded.get(r["instance_id"])
        if g is None:  # cannot happen while every instance id is graded once (+experiment=online)
            raise SystemExit(f"{out}: rollout {r['instance_id']} has no grading record")
        by_step.setdefault(r["step"], []).append({**g, "reward": r["reward"]})
    steps = sorted(by_step)
    names = styles + [NONE]
    shares = {s: [] for s in names}
    reward, phase = [], []
    for step in steps:
        batch = by_step[step]
        reward.append(mean(g["reward"] for g in batch))
        phases = [g["phase"] for g in batch]
        phase.append(max(set(phases), key=lambda p: (phases.count(p), p)))
        for s in names:
            shares[s].append(sum((g["given"] if g["given"] in styles else NONE) == s for g in batch) / len(batch))
    return {"steps": steps, "reward": reward, "phase": phase, "shares": shares,
            "version": [metrics[s].get("learner/version") for s in steps]}


def phase_stats(run: dict, phases: list[dict], window: int, threshold: float, warmup: int) -> list[dict]:
    """Per phase: its switch step, the steps to recover (module docstring), mean rewards, and the
    shares of the previously rewarded style and of no style over its last `window` steps.
    Phase 0 counts from the first policy update (after `warmup` critic-only steps)."""
    steps, reward, phase = run["steps"], run["reward"], run["phase"]
    out = []
    for k, spec in enumerate(phases):
        idx = [i for i, p in enumerate(phase) if p == k and (k or steps[i] > warmup)]
        if not idx:
            out.append({"phase": k, "rewarded": spec["rewarded"], "switch_step": None, "recover_steps": None})
            continue
        first = idx[0]
        last = idx[-1]
        recover = None
        for i in range(first, last - window + 2):
            if mean(reward[i:i + window]) >= threshold:
                recover = i - first
                break
        tail = list(range(max(first, last - window + 1), last + 1))
        previous = phases[k - 1]["rewarded"] if k else None
        out.append({
            "phase": k, "rewarded": spec["rewarded"], "switch_step": steps[first], "end_step": steps[last],
            "recover_steps": recover, "reward_mean": mean(reward[first:last + 1]),
            "reward_end": mean(reward[i] for i in tail),
            "no_answer_end": mean(run["shares"][NONE][i] for i in tail),
            "previous_share_end": mean(run["shares"][previous][i] for i in tail) if previous else None,
        })
    return out


def summarise(seeds: dict[str, dict]) -> list[dict]:
    """Phase stats averaged over seeds (recovery: the mean over the seeds that recovered, and
    how many did)."""
    per_seed = [s["phases"] for s in seeds.values()]
    out = []
    for k in range(len(per_seed[0])):
        rows = [p[k] for p in per_seed if p[k].get("switch_step") is not None]
        row = {"phase": k, "rewarded": per_seed[0][k]["rewarded"], "seeds": len(rows)}
        for key in ("switch_step", "reward_mean", "reward_end", "previous_share_end", "no_answer_end"):
            vals = [r[key] for r in rows if r.get(key) is not None]
            row[key] = mean(vals) if vals else None
        recovered = [r["recover_steps"] for r in rows if r["recover_steps"] is not None]
        row["recovered"] = len(recovered)
        row["recover_steps"] = mean(recovered) if recovered else None
        out.append(row)
    return out


def _fmt(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def print_table(result: dict) -> None:
    n = len(result["seeds"])
    table = Table("run", "phase (rewarded)", "switch step", "steps to recover", "mean reward", "reward at end",
                  "previous style's share at end", "no style at end",
                  title=f"online learning: recovery = first {result['window']}-step mean reward >= {result['threshold']:g} "
                        f"({n} seed{'s' if n > 1 else ''}, {result['updates']} policy updates of {result['batch_size']} rollouts each)")
    for label, run in result["runs"].items():
        for row in run["summary"]:
            name = label if row["phase"] or not run["warmup_steps"] else f"{label} (+{run['warmup_steps']} critic-only steps)"
            recover = "never" if row["recovered"] == 0 else _fmt(row["recover_steps"], ".1f")
            if n > 1 and row["recovered"]:
                recover += f" ({row['recovered']}/{row['seeds']})"
            table.add_row(name, f"{row['phase']} ({row['rewarded']})", _fmt(row["switch_step"], ".0f"), recover,
                          _fmt(row["reward_mean"]), _fmt(row["reward_end"]), _fmt(row["previous_share_end"]),
                          _fmt(row["no_answer_end"]))
        table.add_section()
    Console(stderr=True, width=200).print(table)


def plot(result: dict, path: Path) -> None:
    """Reward per step for both runs (seed mean) with each run's switches marked, and the share
    of each style per step for each run; x is the learner step less the run's critic-only
    warm-up steps (so x = policy updates made, and both runs meet the switches at the same x)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(result["runs"])
    fig, axes = plt.subplots(1 + len(labels), 1, figsize=(10, 3 + 2.6 * len(labels)), sharex=True)
    colours = {"sao": "tab:blue", "running_mean": "tab:orange"}
    styles = result["styles"] + [NONE]
    style_colours = dict(zip(styles, plt.get_cmap("tab10").colors))
    for label in labels:
        run = result["runs"][label]
        seeds = list(run["seeds"].values())
        n = min(len(s["steps"]) for s in seeds)
        x = [step - run["warmup_steps"] for step in seeds[0]["steps"][:n]]
        switches = [row["switch_step"] - run["warmup_steps"] - 0.5 for row in run["summary"][1:]
                    if row["switch_step"] is not None]
        axes[0].plot(x, [mean(s["reward"][i] for s in seeds) for i in range(n)], label=label, color=colours.get(label))
        ax = axes[1 + labels.index(label)]
        for style in styles:
            share = [mean(s["shares"][style][i] for s in seeds) for i in range(n)]
            if any(share):
                ax.plot(x, share, label=style, color=style_colours[style])
        for at in switches:
            axes[0].axvline(at, color=colours.get(label), linestyle="--", alpha=0.6)
            ax.axvline(at, color="grey", linestyle="--", alpha=0.6)
        ax.set_ylim(-0.02, 1.02)
        ax.set_ylabel(f"{label}: share")
        ax.legend(loc="upper left", fontsize=7, ncol=len(styles))
    axes[0].axhline(result["threshold"], color="grey", linestyle=":", linewidth=1)
    axes[0].set_ylim(-0.02, 1.02)
    axes[0].set_ylabel("reward (batch mean)")
    n_seeds = len(result["seeds"])
    axes[0].set_title("rewarded style " + " -> ".join(p["rewarded"] for p in result["phases"])
                      + f" (dashed: each run's switches; {n_seeds} seed{'s' if n_seeds > 1 else ''})")
    axes[0].legend(loc="upper left")
    axes[-1].set_xlabel("learner step less the run's critic-only warm-up steps (= policy updates made)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.online", description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--window", type=int, default=3, help="steps in the mean that recovery asks for")
    p.add_argument("--threshold", type=float, default=0.5, help="that mean's level (uniform over 4 styles: 0.25)")
    p.add_argument("--quick", action="store_true", help="tiny sizes and phases (for the test)")
    p.add_argument("--output", type=Path, help="write the numbers as JSON")
    p.add_argument("--plot", type=Path, help="write the reward and style-share curves (PNG)")
    p.add_argument("--keep", type=Path, help="keep the runs' output folders here (default: a temporary one)")
    p.add_argument("--updates", type=int, help="policy updates per run (default: the experiment's "
                                                "trainer.max_steps less SAO's critic-only warm-up steps)")
    args, overrides = p.parse_known_args(argv)
    phases = QUICK_PHASES if args.quick else None
    if args.quick:
        overrides = [*QUICK, *overrides]
    runs = {label: settings(label, phases, overrides) for label in RUNS}
    updates = args.updates or runs["sao"]["max_steps"] - runs["sao"]["warmup_steps"]
    phase_list = runs["sao"]["phases"]
    styles = list(dict.fromkeys(s for ph in phase_list for s in ph["pool"]))
    result = {"updates": updates, "batch_size": runs["sao"]["batch_size"], "window": args.window,
              "threshold": args.threshold, "phases": phase_list, "styles": styles, "seeds": args.seeds,
              "overrides": overrides,
              "runs": {label: {"overrides": RUNS[label], "warmup_steps": runs[label]["warmup_steps"],
                               "max_steps": updates + runs[label]["warmup_steps"], "seeds": {}} for label in RUNS}}
    with tempfile.TemporaryDirectory(prefix="sao-online-") as tmp:
        root = args.keep or Path(tmp)
        for seed in args.seeds:
            for label, spec in result["runs"].items():
                steps = spec["max_steps"]
                out = train(label, seed, root / f"{label}-{seed}", phases,
                            [*overrides, f"trainer.max_steps={steps}", f"trainer.checkpoint_every={steps}"])
                run = per_step(out, styles)
                run["phases"] = phase_stats(run, phase_list, args.window, args.threshold, spec["warmup_steps"])
                spec["seeds"][str(seed)] = run
    for run in result["runs"].values():
        run["summary"] = summarise(run["seeds"])
    print_table(result)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=2))
    if args.plot:
        plot(result, args.plot)
    print(json.dumps({label: run["summary"] for label, run in result["runs"].items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
