"""Peak memory and time of per-token logprobs, forward + backward: chunked
(`training.logprobs.token_logprobs`) against the naive full-vocabulary logits.

    python -m benchmarks.logprobs_memory [--tokens 1024 4096 8192] [--vocab 32768] [--hidden 256]

Each case runs in a fresh process; peak memory is the process's peak resident set minus its size
once the inputs exist, after a small warm-up (CPU), or torch's peak allocation (CUDA), so the two columns compare
the same thing side by side. The naive way holds [T, V] fp32 logits and their softmax for
the backward pass; the chunked way about chunk x V.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

from rich.console import Console
from rich.table import Table


def _peak_mb(device: str) -> float:
    import torch

    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB, high-water mark


def _now_mb(device: str) -> float:
    import torch

    if device == "cuda":
        return torch.cuda.memory_allocated() / 2**20
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def measure(way: str, tokens: int, vocab: int, hidden: int, chunk: int, device: str) -> dict:
    """One forward + backward in this process; returns seconds and peak MB above the inputs."""
    import torch

    from training.logprobs import token_logprobs

    def run(h, w, targets):
        if way == "naive":
            logp = torch.log_softmax((h @ w.T).float(), -1).gather(-1, targets[:, None])[:, 0]
        else:
            logp = token_logprobs(h, w, targets, chunk_size=chunk)
        logp.sum().backward()

    torch.manual_seed(0)
    # a small warm-up first: one-off costs (lazy initialisation, thread pools) are not the method's
    run(torch.randn(64, hidden, device=device, requires_grad=True),
        torch.randn(vocab, hidden, device=device, requires_grad=True), torch.randint(0, vocab, (64,), device=device))
    h = torch.randn(tokens, hidden, device=device, requires_grad=True)
    w = (torch.randn(vocab, hidden, device=device) * 0.02).requires_grad_()
    targets = torch.randint(0, vocab, (tokens,), device=device)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    base = _now_mb(device)
    t0 = time.perf_counter()
    run(h, w, targets)
    if device == "cuda":
        torch.cuda.synchronize()
    return {"seconds": time.perf_counter() - t0, "peak_mb": _peak_mb(device) - base}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.logprobs_memory", description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096, 8192])
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--chunk", type=int, default=1024)
    p.add_argument("--device", default="cpu")
    p.add_argument("--one", nargs=2, metavar=("WAY", "TOKENS"), help=argparse.SUPPRESS)  # a child run
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.one[0], int(args.one[1]), args.vocab, args.hidden, args.chunk, args.device)))
        return 0
    table = Table(title=f"logprobs fwd+bwd, vocab {args.vocab}, hidden {args.hidden}, chunk {args.chunk}, {args.device}")
    for col in ("tokens", "naive MB", "chunked MB", "memory ratio", "naive s", "chunked s", "time ratio"):
        table.add_column(col, justify="right")
    rows = []
    for tokens in args.tokens:
        r = {}
        for way in ("naive", "chunked"):
            out = subprocess.run([sys.executable, "-m", "benchmarks.logprobs_memory", "--one", way, str(tokens),
                                  "--vocab", str(args.vocab), "--hidden", str(args.hidden), "--chunk", str(args.chunk),
                                  "--device", args.device], capture_output=True, text=True, check=True)
            r[way] = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append((tokens, r))
        table.add_row(str(tokens), f"{r['naive']['peak_mb']:.0f}", f"{r['chunked']['peak_mb']:.0f}",
                      f"{r['chunked']['peak_mb'] / max(r['naive']['peak_mb'], 1e-9):.3f}",
                      f"{r['naive']['seconds']:.2f}", f"{r['chunked']['seconds']:.2f}",
                      f"{r['chunked']['seconds'] / r['naive']['seconds']:.2f}")
    Console(width=120).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
