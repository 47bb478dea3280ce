"""How far a policy's weights moved between checkpoints, beside the gradients that moved them.

    python -m experiments.weight_drift CKPT [CKPT ...] [--base MODEL] [--metrics FILE] [--output FILE]

Each CKPT is a training checkpoint (`step_N`, holding `policy/`) or an HF model folder named
`step_N` (a policy copied out of one); they are taken in step order. `--base` is the model the
run started from, taken as step 0. Per interval between two of them it prints the steps, the L2
distance between the two policies' weights, that distance a step, the mean policy gradient
norm over the interval's steps (`policy/grad_norm` in the run's metrics.jsonl: `--metrics`, or
found beside a CKPT that lies in `<run>/checkpoints/`), and the distance a step per unit of that
norm. Per checkpoint it prints the distance from the base (or from the first CKPT), and where
its `learner.pt` holds the policy's AdamW state, the norm of the step that state alone would
take, lr * m_hat / (sqrt(v_hat) + eps), beside the norm of m_hat, its averaged gradient
(weight decay left out). The distance between two checkpoints is a lower bound on the path
the weights took between them (steps that cancel do not add), so wide intervals read lower
per step than narrow ones over the same steps. A reward curve says when a run broke; this says how fast the weights
moved while it did, and how much of that the gradient explains (BENCHMARKS.md, the long run).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from statistics import mean

import torch
from rich.console import Console
from rich.table import Table
from safetensors.torch import load_file

from benchmarks.common import read_jsonl
from experiments.seek_probe import model_dir
from training.checkpoint import Checkpoints


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    """The policy's weights in `path` (a model folder or a checkpoint's `policy/`), in fp32."""
    files = sorted(model_dir(path).glob("*.safetensors"))
    if not files:
        raise ValueError(f"{model_dir(path)}: no *.safetensors weights")
    weights = {}
    for f in files:
        weights.update({k: v.float() for k, v in load_file(f).items()})
    return weights


def distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], where: str) -> float:
    """The L2 distance between two sets of the same weights; a ValueError names what differs."""
    if a.keys() != b.keys():
        raise ValueError(f"{where}: the weights differ in names ({sorted(a.keys() ^ b.keys())[:3]} ...)")
    bad = [k for k in a if a[k].shape != b[k].shape]
    if bad:
        raise ValueError(f"{where}: {bad[0]} is {tuple(a[bad[0]].shape)} against {tuple(b[bad[0]].shape)}")
    return float(sum(((a[k] - b[k]) ** 2).sum() for k in a) ** 0.5)


def adam_step(learner_file: Path) -> dict[str, float] | None:
    """The norms of AdamW's own next step (lr * m_hat / (sqrt(v_hat) + eps), weight decay left out)
    and of m_hat, from a torch learner's `learner.pt`; None where it holds no such state."""
    if not learner_file.is_file():
        return None
    state = torch.load(learner_file, map_location="cpu", weights_only=False)
    opt = state.get("policy_opt") if isinstance(state, dict) else None
    if not opt or not opt.get("state"):
        return None
    step_sq = m_sq = 0.0
    for group in opt["param_groups"]:
        beta1, beta2 = group["betas"]
        for index in group["params"]:
            s = opt["state"].get(index)
            if not s:
                continue
            t = float(s["step"])
            m_hat = s["exp_avg"].float() / (1 - beta1 ** t)
            v_hat = s["exp_avg_sq"].float() / (1 - beta2 ** t)
            step_sq += float(((group["lr"] * m_hat / (v_hat.sqrt() + group["eps"])) ** 2).sum())
            m_sq += float((m_hat ** 2).sum())
    return {"adam_step_norm": step_sq ** 0.5, "m_hat_norm": m_sq ** 0.5}


def grad_norms(metrics: Path) -> dict[int, float]:
    """`policy/grad_norm` by learner step (a step logged twice: its last row)."""
    return {int(r["step"]): r["policy/grad_norm"] for r in read_jsonl(metrics) if "policy/grad_norm" in r}


def drift(checkpoints: list[Path], base: Path | None = None, metrics: Path | None = None) -> dict:
    """The per-checkpoint and per-interval rows (see the module's doc) as a dict."""
    for c in checkpoints:
        if not Checkpoints.is_step(c):
            raise ValueError(f"{c}: not named step_N, so its step is unknown")
    checkpoints = sorted(checkpoints, key=Checkpoints.step_of)
    if metrics is None:
        found = [c.parent.parent / "metrics.jsonl" for c in checkpoints if c.parent.name == "checkpoints"]
        metrics = next((m for m in found if m.is_file()), None)
    norms = grad_norms(metrics) if metrics else {}
    points = ([(0, base)] if base else []) + [(Checkpoints.step_of(c), c) for c in checkpoints]
    rows, intervals, start, prev = [], [], None, None
    for step, path in points:
        w = load_weights(path)
        start = w if start is None else start
        rows.append({"checkpoint": str(path), "step": step, "from_start": distance(start, w, str(path)),
                     **(adam_step(path / "learner.pt") or {})})
        if prev is not None:
            moved = distance(prev[1], w, str(path))
            steps = step - prev[0]
            if steps <= 0:
                raise ValueError(f"{path}: step {step} again")
            g = [norms[s] for s in range(prev[0] + 1, step + 1) if s in norms]
            row = {"from": prev[0], "to": step, "steps": steps, "moved": moved, "moved_per_step": moved / steps,
                   "grad_norm_mean": mean(g) if g else None, "grad_norm_steps": len(g)}
            row["moved_per_grad_norm"] = row["moved_per_step"] / row["grad_norm_mean"] if g else None
            intervals.append(row)
        prev = (step, w)
    return {"metrics": str(metrics) if metrics else None, "checkpoints": rows, "intervals": intervals}


def fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.weight_drift", description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoints", nargs="+", type=Path, help="training checkpoints or model folders named step_N")
    p.add_argument("--base", type=Path, help="the model the run started from, as step 0")
    p.add_argument("--metrics", type=Path, help="the run's metrics.jsonl (default: beside <run>/checkpoints/)")
    p.add_argument("--output", type=Path, help="write the rows as JSON")
    args = p.parse_args(argv)
    try:
        out = drift(args.checkpoints, args.base, args.metrics)
    except (ValueError, OSError) as e:
        print(f"weight_drift: {e}", file=sys.stderr)
        return 2
    console = Console(width=160)
    table = Table(title="weights moved, interval by interval")
    for col in ("steps", "L2 moved", "a step", "policy grad norm (mean)", "a step per unit of grad norm"):
        table.add_column(col, justify="right")
    for r in out["intervals"]:
        table.add_row(f"{r['from']} to {r['to']}", fmt(r["moved"]), fmt(r["moved_per_step"], 4),
                      fmt(r["grad_norm_mean"], 4), fmt(r["moved_per_grad_norm"], 2))
    console.print(table)
    table = Table(title="per checkpoint")
    for col in ("step", "L2 from the start", "AdamW's own step (norm)", "its m_hat (norm)", "ratio"):
        table.add_column(col, justify="right")
    for r in out["checkpoints"]:
        step, m = r.get("adam_step_norm"), r.get("m_hat_norm")
        table.add_row(str(r["step"]), fmt(r["from_start"]), fmt(step, 4), fmt(m, 4),
                      fmt(step / m, 2) if step is not None and m else "-")
    console.print(table)
    if not out["metrics"]:
        print("no metrics.jsonl found: gradient norms left out (pass --metrics)", file=sys.stderr)
    if args.output:
        args.output.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
