"""One SAO learner step, the torch learner against the Megatron learner, side by side in one run:
the same model, the same batch, steps alternated between the two.

    python -m benchmarks.learner_step [--model PATH] [--rows 16] [--tokens 512] [--repeats 3]

The default model is the embedded tiny one (one process, CPU, fp32: the Megatron learner's CPU
path, megatron's local layers instead of Transformer Engine). On a CPU this measures the
overhead of megatron's machinery (schedules, DDP buffers, the distributed optimizer, packing)
over plain transformers at equal work, not what it is for (models that do not fit one device).
The last line is the result as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from rich.console import Console
from rich.table import Table


def batch(rows: int, tokens: int, vocab: int):
    """Agent-like rollouts: a 64-token prompt, then sampled turns and tool output in turn."""
    import torch

    from agent.trajectory import Trajectory

    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(rows):
        n = tokens // 2 + (tokens // 2) * i // max(rows - 1, 1)  # lengths spread over [tokens/2, tokens]
        t = Trajectory(f"b{i}", prompt_ids=torch.randint(0, vocab, (64,), generator=g).tolist(), reward=float(i % 2))
        sampled = True
        while t.num_tokens < n:
            k = min(96 if sampled else 32, n - t.num_tokens)
            ids = torch.randint(0, vocab, (k,), generator=g).tolist()
            t.append_sampled(ids, [-8.0] * k, 0) if sampled else t.append_observation(ids)
            sampled = not sampled
        out.append(t)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.learner_step", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="an HF checkpoint (default: the embedded tiny model)")
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--tokens", type=int, default=512, help="the longest trajectory")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    import torch

    from agent.tiny_model import DEFAULT_DIR, build_tiny_model
    from training.algos import SAO
    from training.learners.megatron import MegatronLearner
    from training.learners.torch import TorchLearner

    torch.set_num_threads(max(torch.get_num_threads(), 1))
    path = args.model or str(build_tiny_model(DEFAULT_DIR))
    algo = lambda: SAO(critic_warmup_steps=0, lr_policy=1e-5, lr_critic=1e-5)  # noqa: E731
    learners = {"torch": TorchLearner(path, algo()), "megatron": MegatronLearner(path, algo())}
    trajs = batch(args.rows, args.tokens, learners["torch"].tokenizer.vocab_size)
    seconds: dict[str, list[float]] = {k: [] for k in learners}
    for name, learner in learners.items():  # warm-up: optimizer state, allocator
        learner.step(trajs)
    for _ in range(args.repeats):
        for name, learner in learners.items():
            t0 = time.perf_counter()
            learner.step(trajs)
            seconds[name].append(time.perf_counter() - t0)
    tokens = sum(t.num_tokens for t in trajs)
    med = {k: statistics.median(v) for k, v in seconds.items()}
    table = Table(title=f"one SAO step (K=2 critic updates + policy update), {args.rows} rows, {tokens} tokens, CPU fp32")
    for col in ("learner", "median s / step", "tokens / s", "vs torch"):
        table.add_column(col, justify="right")
    for name in learners:
        table.add_row(name, f"{med[name]:.2f}", f"{tokens / med[name]:.0f}", f"{med[name] / med['torch']:.2f}")
    Console(width=120).print(table)
    print(json.dumps({"tokens": tokens, "seconds": seconds, "ratio_megatron_torch": med["megatron"] / med["torch"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
