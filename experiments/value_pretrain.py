"""The critic's cold start with and without value pretraining, side by side: the critic's
explained variance (on each batch, before its update) over the first learner steps of the same
training run, once from the policy's checkpoint (a fresh value head) and once from a value
checkpoint fitted on the starting policy's rollouts.

    python -m experiments.value_pretrain [--steps 8] [--rollouts 64] [--epochs 4] [--quick]
                                        [--output FILE] [hydra overrides ...]

Runs `python -m training.value_pretrain`, then `python -m training.run` twice (the same seed;
`learner.value_checkpoint` in one), on the embedded default unless overrides say otherwise.
Prints a table per step and writes the numbers as JSON (stdout's last line and `--output`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks.common import read_jsonl

ROOT = Path(__file__).resolve().parents[1]


def _run(module: str, *overrides: str) -> None:
    r = subprocess.run([sys.executable, "-m", module, *overrides], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{module} failed ({r.returncode}):\n{r.stderr[-3000:]}")


def _ev(out: Path) -> list[float]:
    return [row["value/explained_var"] for row in read_jsonl(out / "metrics.jsonl")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.value_pretrain", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--rollouts", type=int, default=64)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--quick", action="store_true", help="tiny sizes, 2 steps (for the test)")
    p.add_argument("--output", type=Path)
    args, overrides = p.parse_known_args(argv)
    if args.quick:
        args.steps, args.rollouts, args.epochs = 2, 8, 1
        overrides = ["+debug=tiny", "engine=hf", *overrides]
    with tempfile.TemporaryDirectory(prefix="sao-value-") as tmp:
        tmp = Path(tmp)
        common = [*overrides, "held_out=null", f"trainer.max_steps={args.steps}", f"trainer.checkpoint_every={args.steps}"]
        _run("training.value_pretrain", *overrides, f"output_dir={tmp / 'vp'}", "run_id=bench-value",
             f"value_pretrain.rollouts={args.rollouts}", f"value_pretrain.epochs={args.epochs}")
        ckpt = tmp / "vp" / "value_checkpoint"
        fitted = json.loads((ckpt / "value_pretrain.json").read_text())
        _run("training.run", *common, f"output_dir={tmp / 'cold'}", "run_id=bench-value-cold")
        _run("training.run", *common, f"output_dir={tmp / 'warm'}", "run_id=bench-value-warm",
             f"learner.value_checkpoint={ckpt}")
        cold, warm = _ev(tmp / "cold"), _ev(tmp / "warm")
    table = Table("step", "fresh value head", "value pretrained",
                  title=f"critic explained variance before each update ({args.rollouts} rollouts, {args.epochs} epochs of pretraining)")
    for i, (c, w) in enumerate(zip(cold, warm)):
        table.add_row(str(i + 1), f"{c:.3f}", f"{w:.3f}")
    Console(stderr=True).print(table)
    result = {"steps": args.steps, "rollouts": args.rollouts, "epochs": args.epochs, "cold": cold, "warm": warm,
              "pretrain_epochs": fitted["epochs"], "reward_mean": fitted["reward_mean"],
              "cold_mean": sum(cold) / len(cold), "warm_mean": sum(warm) / len(warm)}
    Console(stderr=True).print(f"mean over the {args.steps} steps: {result['cold_mean']:.3f} fresh, "
                               f"{result['warm_mean']:.3f} pretrained")
    if args.output:
        args.output.write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
