"""SAO against the baselines the paper compares it with, on the same env, model and number of
samples: vanilla GRPO, GRPO + DIS and the running-mean baseline, at controlled staleness
(`trainer.engine_lag`), over seeds; and the paper's Table 4 ablations in miniature.

    python -m experiments.learning [--steps 30] [--batch-size 16] [--seeds 0 1 2]
        [--staleness 0 2 4] [--algos sao grpo grpo_dis running_mean [running_mean_global grpo_one_update] [stability]]
        [--ablations one_critic_update full_critic no_mask running_mean] [--ablation-staleness 2]
        [--experiment seek] [--jobs 1] [--quick] [--output FILE.json [--resume | --report]] [--plot FILE.png]
        [overrides ...]

Every case is `python -m training.run +experiment=<experiment>` with the same batch of
rollouts per step (SAO: that many prompts x 1; GRPO: prompts x 8) and the same steps, so the
same samples. Prints, per case, the mean reward over the last quarter of the steps (mean and
spread over seeds), the best step's reward and the samples per second; writes every run's
per-step rows (reward, masked fractions, gradient norms, explained variance, logprob
mismatch, staleness) as JSON, and a plot of reward against samples and against wall time.
`--jobs N` runs N of them at once: they share the machine, so wall times compare within one
invocation only. `--resume` adds to an `--output` file that holds earlier runs of the same
experiment, steps, batch size and overrides: runs already there are kept and not run again,
and its other cases stay in the table and the plot (more seeds, staleness levels or ablations
across sessions). It cannot tell that an env or its SFT demonstrations changed in between:
start a new file then.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks.common import read_jsonl, train

# case -> overrides (on top of the experiment). running_mean: SAO's loss with A = r - the mean
# of the prompt's 8 most recent rewards instead of a critic (the paper's ablation); with one
# rollout per prompt that window is mostly empty (A = r). running_mean_global: the mean of the
# 128 most recent rewards of all prompts (the paper's online experiment); asked by name only.
# grpo_one_update: vanilla GRPO with one optimizer step a batch, as GRPO + DIS and SAO take (its
# ratio against pi_old is then 1 and the clip never binds): what GRPO's 4 steps a batch cost,
# apart from its loss; asked by name only
ALGOS = {
    "sao": ["algo=sao"],
    "grpo": ["algo=grpo"],
    "grpo_dis": ["algo=grpo_dis"],
    "grpo_one_update": ["algo=grpo", "algo.policy_minibatches=1"],
    "running_mean": ["algo=sao", "algo.baseline=running_mean"],
    "running_mean_global": ["algo=sao", "algo.baseline=running_mean", "algo.baseline_scope=global",
                            "algo.baseline_window=128"],
}
# the stability study (issue 30): SAO with each policy-loss mean x each reading of the critic's
# values (before its K updates on the batch, or after), every option named so the defaults
# can move without changing what a case ran; GRPO + DIS with each group standard deviation
for _mean, _short in (("kept", "kept"), ("sampled", "sampled"), ("seq_mean_token_mean", "seqmean")):
    for _after in (False, True):
        ALGOS[f"sao_{_short}_{'after' if _after else 'before'}"] = [
            "algo=sao", f"algo.token_mean={_mean}", f"algo.values_after_critic={str(_after).lower()}"]
for _std in ("population", "unbiased"):
    ALGOS[f"grpo_dis_{_std}"] = ["algo=grpo_dis", f"algo.group_std={_std}"]
STABILITY = [name for name in ALGOS if name.startswith(("sao_", "grpo_dis_"))]
DEFAULT_ALGOS = ["sao", "grpo", "grpo_dis", "running_mean"]  # the paper's comparison
COLOURS = {name: f"C{i}" for i, name in enumerate(DEFAULT_ALGOS + ["running_mean_global", "grpo_one_update"])}
# the stability cases: a colour per loss mean (GRPO + DIS its own), solid before, dashed after
STYLES = {name: {"color": {"kept": "C0", "sampled": "C1", "seqmean": "C2"}[name.split("_")[1]],
                 "ls": "--" if name.endswith("after") else "-"} for name in STABILITY if name.startswith("sao_")}
STYLES.update({"grpo_dis_population": {"color": "C3", "ls": "-"}, "grpo_dis_unbiased": {"color": "C3", "ls": "--"}})
# the paper's Table 4, each one change to SAO
ABLATIONS = {
    "one_critic_update": ["algo=sao", "algo.critic_steps=1"],
    "full_critic": ["algo=sao", "algo.freeze_critic_attention=false"],
    "no_mask": ["algo=sao", "algo.mask=false"],
    "running_mean": ALGOS["running_mean"],
}
KEPT = ("step", "reward/mean", "time/elapsed_s", "staleness/mean", "sao/kept_frac", "sao/mask_frac_low",
        "sao/mask_frac_high", "ppo/clipfrac", "policy/grad_norm", "value/grad_norm", "value/explained_var",
        "sao/logprob_mismatch_pre", "sao/logprob_mismatch_fresh", "tokens/sampled", "exit/format_errors",
        "value/explained_var_after", "advantage/mean")


def run_case(name: str, overrides: list[str], lag: int, seed: int, args, tmp: Path, resume: bool = False,
             checkpoint_every: int | None = None, keep_every: int = 0) -> list[dict]:
    """One run's kept rows, from `tmp/<name>-lag<lag>-s<seed>`: a checkpoint at the end only,
    or every `checkpoint_every` steps (kept: the newest 3 and every `keep_every`th step's); with
    `resume`, a run already there goes on from its newest."""
    label = run_label(name, lag, seed)
    out = tmp / label
    train([f"+experiment={args.experiment}", *overrides, f"seed={seed}", f"trainer.max_steps={args.steps}",
           f"trainer.batch_size={args.batch_size}", f"trainer.engine_lag={lag}",
           f"trainer.max_staleness={max(lag, 4)}", f"trainer.checkpoint_every={checkpoint_every or args.steps}",
           f"trainer.keep_every={keep_every}", *args.overrides], out, label, resume=resume)
    return kept_rows(out)


def run_label(name: str, lag: int, seed: int) -> str:
    """A run's folder name (and its run id's stem): case, staleness and seed."""
    return f"{name}-lag{lag}-s{seed}"


def kept_rows(out: Path) -> list[dict]:
    """The metrics a benchmark keeps (`KEPT`) of each step a run in `out` has logged."""
    return [{k: r[k] for k in KEPT if r.get(k) is not None} for r in read_jsonl(out / "metrics.jsonl")]


def summary(runs: list[list[dict]], batch_size: int) -> dict[str, float]:
    """Over seeds: the mean reward of the last quarter of the steps, the first quarter's, the
    best step's, and samples per second from the end of the first step on."""
    def quarter(rows, last):
        k = max(1, len(rows) // 4)
        part = rows[-k:] if last else rows[:k]
        return statistics.mean(r["reward/mean"] for r in part)

    finals = [quarter(rows, True) for rows in runs]
    rates = [(len(rows) - 1) * batch_size / (rows[-1]["time/elapsed_s"] - rows[0]["time/elapsed_s"])
             for rows in runs if len(rows) > 1 and rows[-1]["time/elapsed_s"] > rows[0]["time/elapsed_s"]]
    return {"first": statistics.mean(quarter(rows, False) for rows in runs), "final": statistics.mean(finals),
            "final_sd": statistics.stdev(finals) if len(finals) > 1 else 0.0,
            "best": statistics.mean(max(r["reward/mean"] for r in rows) for rows in runs),
            "samples_per_s": statistics.mean(rates) if rates else 0.0}


def earlier_runs(old: dict, results: dict, plan: list, runs: dict) -> list[dict]:
    """Fill `runs` with the runs of `old` (an earlier --output) that this plan has; return its
    other cases. Runs of another experiment, length, batch or overrides do not mix: a ValueError."""
    for key in ("experiment", "steps", "batch_size", "overrides"):
        if old.get(key) != results[key]:
            raise ValueError(f"it holds runs with {key} {old.get(key)!r}, this run has {results[key]!r}")
    index = {(group, name, lag): i for i, (group, name, _, lag) in enumerate(plan)}
    kept = []
    for case in old["cases"]:
        i = index.get((case["group"], case["name"], case["lag"]))
        if i is None:
            kept.append({**case, "summary": summary(case["runs"], results["batch_size"])})
            continue
        if case["overrides"] != plan[i][2]:
            raise ValueError(f"its case {case['name']} at staleness {case['lag']} ran with {case['overrides']}, "
                             f"which is now {plan[i][2]}")
        for seed, rows in zip(case["seeds"], case["runs"], strict=True):
            runs[(i, seed)] = rows
    return kept


def plot(results: dict, batch_size: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lags = sorted({c["lag"] for c in results["cases"] if c["group"] == "algo"}) or [0]
    ablated = sorted({c["lag"] for c in results["cases"] if c["group"] == "ablation"})
    cols = len(lags) + bool(ablated)  # a column for the ablations only when there are some
    fig, axes = plt.subplots(2, cols, figsize=(4.2 * cols, 7), squeeze=False)
    for col, lag in enumerate(lags):
        for case in (c for c in results["cases"] if c["lag"] == lag and c["group"] == "algo"):
            runs = case["runs"]
            n = min(len(r) for r in runs)
            mean = [statistics.mean(r[i]["reward/mean"] for r in runs) for i in range(n)]
            smooth = [statistics.mean(mean[max(0, i - 4): i + 1]) for i in range(n)]
            samples = [(i + 1) * batch_size for i in range(n)]
            seconds = [statistics.mean(r[i]["time/elapsed_s"] for r in runs) for i in range(n)]
            style = {"lw": 2, "label": case["name"], **STYLES.get(case["name"], {"color": COLOURS.get(case["name"])})}
            axes[0][col].plot(samples, smooth, **style)
            axes[1][col].plot(seconds, smooth, **style)
        axes[0][col].set_title(f"staleness {lag} (engine_lag={lag})")
        axes[0][col].set_xlabel("samples")
        axes[1][col].set_xlabel("wall seconds")
        for ax in (axes[0][col], axes[1][col]):
            ax.set_ylabel("reward (mean of 5 steps, over seeds)")
            ax.set_ylim(-0.02, 1.02)
            ax.grid(alpha=0.3)
            ax.legend(loc="lower right", fontsize=7, ncol=2 if len(ax.get_lines()) > 5 else 1)
    # the ablations beside SAO at each staleness they ran at; an ablation that is also an algo
    # case at that staleness ran once, as the algo case
    bars = []
    for lag in ablated:
        bars += [c for c in results["cases"] if c["name"] == "sao" and c["lag"] == lag and c["group"] == "algo"]
        bars += [c for c in results["cases"] if c["group"] == "ablation" and c["lag"] == lag]
        bars += [c for c in results["cases"] if c["group"] == "algo" and c["name"] in ABLATIONS and c["lag"] == lag]
    if bars:
        ax = axes[0][-1]
        drawn = ax.bar(range(len(bars)), [c["summary"]["final"] for c in bars],
                       yerr=[c["summary"]["final_sd"] for c in bars],
                       color=["C0" if c["name"] == "sao" else "C7" for c in bars])
        ax.bar_label(drawn, [f"{c['summary']['final']:.2f}" for c in bars], padding=2, fontsize=8)
        ax.set_xticks(range(len(bars)), [f"{c['name']} @{c['lag']}" for c in bars], rotation=35, ha="right",
                     fontsize=8)
        ax.set_title("ablations (@ staleness): reward, last quarter")
        ax.set_ylim(0, 1.02)
        axes[1][-1].axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(results: dict, plot_path: Path | None) -> int:
    """Where a benchmark stands: each case's seeds so far, their last-quarter rewards, the
    lowest step, the most format errors and the least kept share of a batch."""
    table = Table(title=f"{results['experiment']}: {results['steps']} steps x {results['batch_size']} rollouts")
    for col in ("case", "staleness", "seeds", "last quarter", "per seed", "lowest step", "format errors, most",
                "kept, least"):
        table.add_column(col, justify="left" if col == "case" else "right")
    for c in results["cases"]:
        s = summary(c["runs"], results["batch_size"])
        per_seed = [summary([rows], results["batch_size"])["final"] for rows in c["runs"]]
        kept = [r["sao/kept_frac"] for rows in c["runs"] for r in rows if r.get("sao/kept_frac") is not None]
        table.add_row(c["name"], str(c["lag"]), ",".join(map(str, c["seeds"])),
                      f"{s['final']:.2f} ± {s['final_sd']:.2f}", ", ".join(f"{v:.2f}" for v in per_seed),
                      f"{min(r['reward/mean'] for rows in c['runs'] for r in rows):.2f}",
                      f"{max((r.get('exit/format_errors') or 0.0) for rows in c['runs'] for r in rows):.2f}",
                      f"{min(kept):.3f}" if kept else "-")
    Console(width=160).print(table)
    if plot_path:
        plot(results, results["batch_size"], plot_path)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.learning", description=__doc__.split("\n\n")[0])
    p.add_argument("--experiment", default="seek",
                   help="conf/experiment/<name>.yaml (seek: the env the tiny model learns)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--staleness", type=int, nargs="+", default=[0, 2, 4])
    p.add_argument("--algos", nargs="*", default=DEFAULT_ALGOS, choices=list(ALGOS) + ["stability"],
                   help="cases by name; 'stability': the SAO loss-mean x critic-order cases and GRPO + DIS's two stds")
    p.add_argument("--ablations", nargs="*", default=list(ABLATIONS), choices=list(ABLATIONS))
    p.add_argument("--ablation-staleness", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="3 steps of 8, one seed, staleness 2, sao and grpo, no ablations")
    p.add_argument("--jobs", type=int, default=1, help="runs at once (each a training.run process; they share the machine)")
    p.add_argument("--output", type=Path)
    p.add_argument("--resume", action="store_true", help="keep the runs already in --output and run only the others")
    p.add_argument("--report", action="store_true",
                   help="run nothing: the table (with each seed's last-quarter reward) and the plot of what --output holds")
    p.add_argument("--plot", type=Path)
    p.add_argument("overrides", nargs="*", help="more training.run overrides, for every case")
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error("--jobs must be at least 1")
    if args.quick:
        args.steps, args.batch_size, args.seeds, args.staleness = 3, 8, [0], [2]
        args.algos, args.ablations = ["sao", "grpo"], []
    if "stability" in args.algos:
        args.algos = [a for a in args.algos if a != "stability"] + [a for a in STABILITY if a not in args.algos]
    if args.steps < 2:
        p.error("--steps must be at least 2")
    if args.batch_size % 8:
        p.error("--batch-size must be a multiple of 8 (GRPO's groups of 8)")
    if any(k < 0 for k in args.staleness):
        p.error("--staleness values must be 0 or more")
    if (args.resume or args.report) and not args.output:
        p.error("--resume and --report need --output (the file whose runs they read)")
    if args.report:
        return report(json.loads(args.output.read_text()), args.plot)
    plan = [("algo", a, ALGOS[a], lag) for lag in args.staleness for a in args.algos]
    plan += [("ablation", a, ABLATIONS[a], args.ablation_staleness) for a in args.ablations
             if not (a in args.algos and args.ablation_staleness in args.staleness)]  # a case run once
    if not plan:
        p.error("nothing to run: give --algos or --ablations")
    results = {"experiment": args.experiment, "steps": args.steps, "batch_size": args.batch_size,
               "overrides": args.overrides, "seeds": args.seeds, "cases": []}
    runs: dict[tuple[int, int], list[dict]] = {}
    kept: list[dict] = []  # earlier cases outside this plan, kept as they are
    if args.resume and args.output.exists():
        try:
            kept = earlier_runs(json.loads(args.output.read_text()), results, plan, runs)
        except (ValueError, KeyError, TypeError) as e:
            p.error(f"--resume: {args.output}: {e}")
    seeds = sorted(set(args.seeds) | {seed for _, seed in runs} | {seed for case in kept for seed in case["seeds"]})
    results["seeds"] = seeds
    # seed by seed: a benchmark cut short has every case at its first seeds, not some at all three
    jobs = [(i, seed) for seed in args.seeds for i in range(len(plan)) if (i, seed) not in runs]
    if runs:
        print(f"--resume: {len(runs)} run(s) already in {args.output}, {len(jobs)} to run", file=sys.stderr)
    finished: list[tuple[int, int]] = []  # by this invocation
    lock = threading.Lock()

    def one(job: tuple[int, int]) -> None:
        i, seed = job
        group, name, overrides, lag = plan[i]
        print(f"[start] {name}, staleness {lag}, seed {seed}", file=sys.stderr, flush=True)
        rows = run_case(name, overrides, lag, seed, args, Path(tmp))
        with lock:
            runs[job] = rows
            finished.append(job)
            print(f"[{len(finished)}/{len(jobs)} done] {name}, staleness {lag}, seed {seed}", file=sys.stderr, flush=True)
            results["cases"] = kept + cases_so_far()
            if args.output:  # after each run: a long benchmark keeps what it measured
                args.output.write_text(json.dumps(results))

    def cases_so_far() -> list[dict]:
        cases = []
        for i, (group, name, overrides, lag) in enumerate(plan):
            done = [runs[(i, seed)] for seed in seeds if (i, seed) in runs]
            if done:
                cases.append({"group": group, "name": name, "lag": lag, "overrides": overrides,
                              "seeds": [seed for seed in seeds if (i, seed) in runs],
                              "summary": summary(done, args.batch_size), "runs": done})
        return cases

    results["cases"] = kept + cases_so_far()
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        for future in [pool.submit(one, job) for job in jobs]:
            future.result()
    table = Table(title=f"{args.experiment}: {args.steps} steps x {args.batch_size} rollouts, seeds {args.seeds}")
    for col in ("case", "staleness", "reward, first quarter", "reward, last quarter", "best step", "samples/s"):
        table.add_column(col, justify="left" if col == "case" else "right")
    for c in results["cases"]:
        s = c["summary"]
        table.add_row(c["name"] + (" (ablation)" if c["group"] == "ablation" else ""), str(c["lag"]),
                      f"{s['first']:.3f}", f"{s['final']:.3f} ± {s['final_sd']:.3f}", f"{s['best']:.3f}",
                      f"{s['samples_per_s']:.2f}")
    Console(width=140).print(table)
    if args.output:
        args.output.write_text(json.dumps(results))
    if args.plot:
        plot(results, args.batch_size, args.plot)
    print(json.dumps({f"{c['name']}@{c['lag']}": c["summary"] for c in results["cases"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
