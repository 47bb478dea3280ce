"""The paper's long run in miniature: SAO and vanilla GRPO side by side at staleness 4 for many
learner steps (the paper: GRPO collapses near step 160, SAO trains stably for 1,000).

    python -m experiments.long_run [--steps 1000] [--staleness 4] [--algos sao grpo]
        [--experiment seek] [--batch-size 16] [--seed 0] [--quick] [--output FILE.json]
        [--plot FILE.png] [--run-dir DIR [--checkpoint-every 25] [--keep-every 50] [--carry DIR [--pack]]]
        [--report [--window 50]] [overrides ...]
    python -m experiments.long_run --windows-of FILE.json --window 50

The runs go at the same time (each its own `python -m training.run`, so they share the
machine alike) with `trainer.engine_lag` set, so every rollout is sampled by the policy of that
many versions ago. Per step it keeps the reward, the masked or clipped fractions, the policy's
and the critic's gradient norms, the engine/learner logprob mismatch and the response length
(sampled tokens per rollout), prints where each run ended and its worst stretch, and plots them.
While they run, each run's step and recent reward are printed every `--progress-every` seconds.

A long run outlasts a session: with `--run-dir DIR` the runs live in DIR (one folder each, a
checkpoint every `--checkpoint-every` steps) and the same command goes on with each from its
newest checkpoint, the engine's lagged weights included; every `--keep-every`th step's
checkpoint stays (`trainer.keep_every`), for `experiments.seek_probe` or an eval of the policy
over the run. Stop it with Ctrl-C or SIGTERM to
every `training.run` (each keeps the step under way); without `--run-dir` they live in a
temporary folder and start over. The same command with `--report` writes the table, the JSON
and the plot of the steps the runs in DIR have logged so far, and runs nothing; `--windows-of
FILE.json --window N` prints the table by stretch of N steps of a JSON written earlier.

To go on on another machine: `--carry C --pack` packs each run's newest checkpoint and logs
into folder C (experiments/carry.py; a run going on beside it is not disturbed), and the same
command with `--carry C` on the next machine unpacks each pack newer than what DIR holds, then
runs (or reports) as usual.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table

from benchmarks.common import read_jsonl
from experiments import carry
from experiments.learning import ALGOS, kept_rows, run_case, run_label
from training.factories import sft_model_dir
from training.sft import DEFAULT_OUT

SERIES = {  # panel title: (metric, its label)
    "reward (mean of 10 steps)": "reward/mean",
    "tokens masked (SAO) / clipped (GRPO)": "masked",
    "policy gradient norm": "policy/grad_norm",
    "critic gradient norm": "value/grad_norm",
    "engine vs learner logprob gap (nats)": "sao/logprob_mismatch_pre",
    "sampled tokens per rollout": "length",
}


def derived(rows: list[dict], batch_size: int) -> list[dict]:
    """Adds `masked` (SAO: 1 - kept fraction; GRPO: clip fraction) and `length` to each row."""
    for r in rows:
        r["masked"] = 1.0 - r["sao/kept_frac"] if "sao/kept_frac" in r else r.get("ppo/clipfrac")
        r["length"] = r["tokens/sampled"] / batch_size if "tokens/sampled" in r else None
    return rows


def smooth(xs: list[float], k: int = 10) -> list[float]:
    return [statistics.mean(xs[max(0, i - k + 1): i + 1]) for i in range(len(xs))]


def same_runs(run_dir: Path, settings: dict) -> None:
    """Record what the runs in `run_dir` are (`long_run.json`), or check that they are these:
    going on with a run of another env, staleness, batch, seed or overrides would mix two
    experiments in one curve (a ValueError). Only the number of steps may change."""
    record = run_dir / "long_run.json"
    if record.exists():
        old = json.loads(record.read_text())
        changed = [f"{key} {old.get(key)!r} (now {value!r})" for key, value in settings.items() if old.get(key) != value]
        if changed:
            raise ValueError(f"--run-dir {run_dir} holds runs with " + ", ".join(changed)
                             + ": give the same settings, or another --run-dir")
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(settings, indent=2))


def started_from(folder: Path) -> Path | None:
    """The cached SFT model run `folder` started from (its settings read from the run's Hydra
    config), where this machine has it; None for a run without one."""
    saved = folder / ".hydra" / "config.yaml"
    if not saved.exists():
        return None
    model = OmegaConf.load(saved).model
    if not model.sft.enabled:
        return None
    out = sft_model_dir(model)[1]
    return out if (out / "stage.json").exists() else None


def progress(folders: dict[str, Path], steps: int) -> str:
    """One line: each run's last logged step and its mean reward over the last 10 steps."""
    parts = []
    for name, folder in folders.items():
        try:
            rows = read_jsonl(folder / "metrics.jsonl")  # a line half written is left out
        except FileNotFoundError:  # not started yet
            rows = []
        recent = [r["reward/mean"] for r in rows[-10:] if r.get("reward/mean") is not None]
        parts.append(f"{name} step {rows[-1]['step'] if rows else 0}/{steps}"
                     + (f" reward {statistics.mean(recent):.2f}" if recent else ""))
    return "  ".join(parts)


def windows(rows: list[dict], width: int) -> list[dict]:
    """Each stretch of `width` steps (1-50, 51-100, ...; the last may be shorter): its mean
    reward, its batches' format errors (mean and worst), the largest engine-learner logprob gap
    and the largest masked (SAO) or clipped (GRPO) share of any of its steps."""
    out = []
    for start in range(0, len(rows), width):
        part = rows[start: start + width]
        errs = [r["exit/format_errors"] for r in part if r.get("exit/format_errors") is not None]
        gaps = [r["sao/logprob_mismatch_pre"] for r in part if r.get("sao/logprob_mismatch_pre") is not None]
        masked = [r["masked"] for r in part if r.get("masked") is not None]
        out.append({"first_step": part[0]["step"], "last_step": part[-1]["step"],
                    "reward": statistics.mean(r["reward/mean"] for r in part),
                    "format_errors_mean": statistics.mean(errs) if errs else None,
                    "format_errors_max": max(errs) if errs else None,
                    "gap_max": max(gaps) if gaps else None, "masked_max": max(masked) if masked else None})
    return out


def window_table(runs: dict[str, list[dict]], width: int) -> Table:
    """`windows` of each run as one table: a row per stretch, a column per run."""
    def cell(w: dict | None) -> str:
        if w is None:
            return ""
        num = (lambda x, f: "-" if x is None else format(x, f))
        return (f"{w['reward']:.2f}; {num(w['format_errors_mean'], '.3f')} / {num(w['format_errors_max'], '.2f')}; "
                f"{num(w['gap_max'], '.3f')}; " + ("-" if w["masked_max"] is None else f"{100 * w['masked_max']:.1f}%"))

    table = Table(title=f"by stretch of {width} steps: reward; format errors a batch, mean / worst; "
                        "largest engine-learner gap (nats); largest masked or clipped share")
    table.add_column("steps")
    for name in runs:
        table.add_column(name)
    per_run = {name: windows(rows, width) for name, rows in runs.items()}
    for i in range(max((len(w) for w in per_run.values()), default=0)):
        first = i * width + 1
        row = []
        for name, ws in per_run.items():
            w = ws[i] if i < len(ws) else None
            row.append(cell(w) + (f" ({w['first_step']}-{w['last_step']})" if w and w["last_step"] < first + width - 1
                                  else ""))
        table.add_row(f"{first}-{first + width - 1}", *row)
    return table


def plot(runs: dict[str, list[dict]], lag: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 7.5))
    for ax, (title, key) in zip(axes.flat, SERIES.items()):
        for name, rows in runs.items():
            pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, smooth(list(ys)) if key == "reward/mean" else ys, lw=1.5 if key == "reward/mean" else 1,
                        label=name)
        ax.set_title(title)
        ax.set_xlabel("learner step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"staleness {lag}: every rollout sampled by the policy of {lag} versions ago")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.long_run", description=__doc__.split("\n\n")[0])
    p.add_argument("--experiment", default="seek",
                   help="conf/experiment/<name>.yaml (seek: the env the tiny model learns)")
    p.add_argument("--steps", type=int, help="learner steps per run (1000; 4 with --quick)")
    p.add_argument("--staleness", type=int, default=4)
    p.add_argument("--algos", nargs="+", default=["sao", "grpo"], choices=list(ALGOS))
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="4 steps (unless --steps says) of 8 rollouts")
    p.add_argument("--output", type=Path)
    p.add_argument("--plot", type=Path)
    p.add_argument("--run-dir", type=Path, help="keep the runs here; the same command goes on with them")
    p.add_argument("--checkpoint-every", type=int, default=25, help="with --run-dir: steps between checkpoints")
    p.add_argument("--keep-every", type=int,
                   help="with --run-dir: every this many steps' checkpoint is kept beside the newest 3, a multiple of "
                        "--checkpoint-every (default: every other checkpoint, 50 at the default 25; 0: none)")
    p.add_argument("--progress-every", type=float, default=60.0, help="seconds between progress lines")
    p.add_argument("--report", action="store_true",
                   help="with --run-dir: the table, JSON and plot of the steps its runs have logged so far; runs nothing")
    p.add_argument("--carry", type=Path,
                   help="with --run-dir: a folder of packed runs (one file each) to go on from where it is newer than "
                        "--run-dir's, and where --pack writes")
    p.add_argument("--pack", action="store_true",
                   help="with --carry: pack each run's newest checkpoint and logs into it; runs nothing")
    p.add_argument("--window", type=int,
                   help="also a table by stretch of this many steps (reward; format errors a batch, mean and worst; "
                        "the largest engine-learner gap; the largest masked share), in the JSON too")
    p.add_argument("--windows-of", type=Path, metavar="JSON",
                   help="with --window: that table of the runs in a JSON an earlier --output wrote; runs nothing")
    p.add_argument("overrides", nargs="*", help="more training.run overrides, for every run")
    args = p.parse_args(argv)
    if args.quick:
        args.batch_size = 8
    args.steps = args.steps or (4 if args.quick else 1000)
    if args.steps < 2 or args.staleness < 0 or args.batch_size % 8:
        p.error("--steps must be at least 2, --staleness 0 or more, --batch-size a multiple of 8")
    if args.keep_every is None:
        args.keep_every = 2 * args.checkpoint_every
    if args.window is not None and args.window < 1:
        p.error(f"--window must be at least 1 step, got {args.window}")
    if args.checkpoint_every < 1 or args.keep_every < 0 or args.progress_every <= 0:
        p.error("--checkpoint-every must be at least 1, --keep-every 0 or more and --progress-every above 0")
    if args.keep_every % args.checkpoint_every:
        p.error(f"--keep-every {args.keep_every} must be a multiple of --checkpoint-every ({args.checkpoint_every}): "
                "checkpoints are written only at those steps")
    if args.windows_of is not None:
        return windows_of(p, args.windows_of, args.window)
    if args.report and args.run_dir is None:
        p.error("--report reads the runs in --run-dir: give it")
    if args.report and args.carry is None and not (args.run_dir / "long_run.json").exists():
        p.error(f"--report reads the runs in --run-dir: {args.run_dir} holds none")
    if (args.carry or args.pack) and args.run_dir is None:
        p.error("--carry and --pack work on the runs in --run-dir: give it")
    if args.pack and args.carry is None:
        p.error("--pack writes into the folder --carry names: give it")
    runs: dict[str, list[dict]] = {}
    errors: list[BaseException] = []

    kept = args.run_dir is not None
    if args.carry and not args.pack and (args.carry / "long_run.json").exists() \
            and not (args.run_dir / "long_run.json").exists():
        args.run_dir.mkdir(parents=True, exist_ok=True)  # a fresh machine: the carried runs' settings come first
        (args.run_dir / "long_run.json").write_text((args.carry / "long_run.json").read_text())
    if args.report and not args.pack and args.carry and not (args.run_dir / "long_run.json").exists():
        p.error(f"--report reads the runs in --run-dir: {args.run_dir} holds none, nor does --carry {args.carry}")
    if kept:
        try:
            same_runs(args.run_dir, {key: getattr(args, key) for key in ("experiment", "staleness", "batch_size", "seed",
                                                                          "overrides")})
        except ValueError as e:
            p.error(str(e))
    labels = {name: run_label(name, args.staleness, args.seed) for name in args.algos}
    if args.pack:
        (args.carry).mkdir(parents=True, exist_ok=True)
        (args.carry / "long_run.json").write_text((args.run_dir / "long_run.json").read_text())
        for name, label in labels.items():
            try:
                record = carry.pack(args.run_dir / label, args.carry)
            except ValueError as e:
                p.error(f"--pack: {e}")
            print(f"{name}: step {record['step']} packed into {args.carry / (label + carry.SUFFIX)} "
                  f"({record['bytes'] / 2**20:.1f} MiB)", file=sys.stderr)
        model = started_from(args.run_dir / next(iter(labels.values())))
        if model is not None:
            record = carry.pack_model(model, args.carry)
            print(f"the model the runs started from, {model.name}, packed too ({record['bytes'] / 2**20:.1f} MiB)",
                  file=sys.stderr)
        return 0
    if args.carry:
        model = carry.unpack_model(args.carry, DEFAULT_OUT.parent)
        if model is not None:
            print(f"{model}: unpacked from {args.carry} (the model the runs started from)", file=sys.stderr)
        for name, label in labels.items():
            try:
                step = carry.unpack(args.carry, args.run_dir / label)
            except ValueError as e:
                p.error(f"--carry: {e}")
            if step is not None:
                print(f"{name}: going on from step {step}, unpacked from {args.carry}", file=sys.stderr)

    if args.report:
        folders = {name: args.run_dir / run_label(name, args.staleness, args.seed) for name in args.algos}
        # a run going on beside this may be half-way through a line: kept_rows leaves it out
        runs = {name: derived(kept_rows(folder), args.batch_size) if (folder / "metrics.jsonl").exists() else []
                for name, folder in folders.items()}
        missing = [str(folders[name]) for name, rows in runs.items() if not rows]
        if missing:
            p.error(f"--report: no steps logged in {', '.join(missing)}")
        return report(runs, args)

    def one(name: str, where: Path) -> None:
        try:
            rows = run_case(name, ALGOS[name], args.staleness, args.seed, args, where, resume=kept,
                            checkpoint_every=args.checkpoint_every if kept else None,
                            keep_every=args.keep_every if kept else 0)
            runs[name] = derived(rows, args.batch_size)
        except BaseException as e:  # SystemExit from a failed run, said below
            errors.append(e)

    print(f"{', '.join(args.algos)}: {args.steps} steps each at staleness {args.staleness}, side by side"
          + (f", in {args.run_dir} (the same command goes on with them)" if kept else ""), file=sys.stderr, flush=True)
    with contextlib.ExitStack() as stack:
        where = args.run_dir if kept else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        threads = [threading.Thread(target=one, args=(name, where)) for name in args.algos]
        for t in threads:
            t.start()
        folders = {name: where / run_label(name, args.staleness, args.seed) for name in args.algos}
        while any(t.is_alive() for t in threads):
            deadline = time.monotonic() + args.progress_every
            for t in threads:
                t.join(max(0.0, deadline - time.monotonic()))
            if any(t.is_alive() for t in threads):
                print(progress(folders, args.steps), file=sys.stderr, flush=True)
    if errors:
        raise SystemExit(str(errors[0]))
    return report(runs, args)


def windows_of(p: argparse.ArgumentParser, path: Path, width: int | None) -> int:
    """The table by stretch of `width` steps of the runs a long-run JSON holds (one written by
    an earlier orchestrator too: only the steps' rows are read)."""
    if width is None:
        p.error("--windows-of prints the table by stretch of --window steps: give --window")
    try:
        runs = json.loads(path.read_text())["runs"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        p.error(f"--windows-of {path}: not a long-run JSON with its runs ({type(e).__name__}: {e})")
    if not isinstance(runs, dict) or not runs or not all(isinstance(rows, list) and rows for rows in runs.values()):
        p.error(f"--windows-of {path}: field 'runs' holds no steps")
    Console(width=200).print(window_table(runs, width))
    print(json.dumps({name: windows(rows, width) for name, rows in runs.items()}))
    return 0


def report(runs: dict[str, list[dict]], args) -> int:
    """The table, `--output` JSON and `--plot` of `runs` (each run's rows, up to the step it reached)."""
    reached = {name: rows[-1]["step"] if rows else 0 for name, rows in runs.items()}
    so_far = "" if all(step >= args.steps for step in reached.values()) else \
        " (so far: " + ", ".join(f"{name} at step {step}" for name, step in reached.items()) + ")"
    table = Table(title=f"{args.experiment}, staleness {args.staleness}: {args.steps} steps x {args.batch_size} rollouts"
                  + so_far)
    for col in ("algo", "reward, first 10%", "reward, best 10-step mean", "reward, last 10%", "worst 10-step mean after best",
                "masked/clipped, last 10%", "policy grad norm, max"):
        table.add_column(col, justify="left" if col == "algo" else "right")
    summary = {}
    for name, rows in runs.items():
        k = max(1, len(rows) // 10)
        reward = smooth([r["reward/mean"] for r in rows])
        # full 10-step windows only (the first 9 steps' means are over fewer steps)
        best = max(range(min(9, len(reward) - 1), len(reward)), key=reward.__getitem__)
        norms = [r["policy/grad_norm"] for r in rows if r.get("policy/grad_norm") is not None]
        masked = [r["masked"] for r in rows[-k:] if r.get("masked") is not None]
        summary[name] = {"first": statistics.mean(r["reward/mean"] for r in rows[:k]), "best": reward[best],
                         "best_step": rows[best]["step"], "last": statistics.mean(r["reward/mean"] for r in rows[-k:]),
                         "worst_after_best": min(reward[best:]),
                         "masked_last": statistics.mean(masked) if masked else None,
                         "grad_norm_max": max(norms) if norms else None}
        s = summary[name]
        table.add_row(name, f"{s['first']:.3f}", f"{s['best']:.3f} (step {s['best_step']})", f"{s['last']:.3f}",
                      f"{s['worst_after_best']:.3f}", "-" if s["masked_last"] is None else f"{s['masked_last']:.3f}",
                      "-" if s["grad_norm_max"] is None else f"{s['grad_norm_max']:.3g}")
    Console(width=160).print(table)
    result = {"experiment": args.experiment, "steps": args.steps, "reached": reached, "staleness": args.staleness,
              "batch_size": args.batch_size, "seed": args.seed, "summary": summary, "runs": runs}
    if args.window:
        Console(width=200).print(window_table(runs, args.window))
        result["windows"] = {"width": args.window, **{name: windows(rows, args.window) for name, rows in runs.items()}}
    if args.output:
        args.output.write_text(json.dumps(result))
    if args.plot:
        plot(runs, args.staleness, args.plot)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
