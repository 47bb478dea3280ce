"""Decoding throughput of the shared engine with N rollout threads: one request at a time
(`max_batch=1`) against requests batched while the engine is busy, side by side.

    python -m benchmarks.engine_batching [--engine vllm|hf] [--threads 1 4 8] [--requests 4] [--tokens 64]

Each thread sends `--requests` prompts one after the other (as an agent's turns do), each
decoding `--tokens` tokens (no stop token), through one `SharedEngine` on the tiny model.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

from rich.console import Console
from rich.table import Table

from agent.engines import make_engine
from agent.engines.base import SamplingParams
from agent.engines.shared import SharedEngine
from agent.tiny_model import DEFAULT_DIR, build_tiny_model


def tokens_per_s(engine, threads: int, requests: int, tokens: int, max_batch: int) -> tuple[float, float]:
    shared = SharedEngine(engine, max_batch=max_batch)

    def worker(i: int) -> None:
        for j in range(requests):
            prompt = [10 + (i * 31 + j * 7 + k) % 3000 for k in range(48)]
            shared.generate(prompt, SamplingParams(max_new_tokens=tokens, seed=i * 1000 + j))

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    t0 = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    seconds = time.perf_counter() - t0
    return threads * requests * tokens / seconds, shared.requests / max(shared.batches, 1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.engine_batching", description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", default="vllm_batch", help="an engine with generate_batch: vllm_batch (vLLM's blocking "
                   "LLM.generate); the async engine (vllm) batches by itself: benchmarks/engine_continuous.py")
    p.add_argument("--model", default=None, help="default: the tiny model")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 4, 8])
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--tokens", type=int, default=64)
    args = p.parse_args(argv)
    model = args.model or str(build_tiny_model(DEFAULT_DIR))
    options = {"max_model_len": 4096} if args.engine.startswith("vllm") else {}
    engine = make_engine(args.engine, model, **options)
    tokens_per_s(engine, 1, 1, 8, 1)  # warm-up
    table = Table(title=f"{args.engine} engine, tiny model: {args.requests} requests x {args.tokens} tokens per thread")
    for col in ("threads", "one at a time tok/s", "batched tok/s", "mean batch", "batched / one at a time"):
        table.add_column(col, justify="right")
    for n in args.threads:
        serial, _ = tokens_per_s(engine, n, args.requests, args.tokens, max_batch=1)
        batched, mean_batch = tokens_per_s(engine, n, args.requests, args.tokens, max_batch=256)
        table.add_row(str(n), f"{serial:.0f}", f"{batched:.0f}", f"{mean_batch:.1f}", f"{batched / serial:.2f}")
    Console(width=120).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
