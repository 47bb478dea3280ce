"""Blocking batches against continuous batching, side by side: 16 concurrent multi-turn
rollouts of uneven length on the tiny model, through vLLM's blocking `LLM.generate` behind a
SharedEngine (`vllm_batch`: requests that arrive while a batch runs wait and go together as
the next one, which returns when its longest member ends) and through vLLM's async engine
(`vllm`: a request joins the running batch when it arrives and leaves it when it ends).

    python -m benchmarks.engine_continuous [--rollouts 16] [--turns 8] [--short 8] [--long 128 256]
        [--long-share 0.3] [--tool-ms 50] [--repeats 1] [--seed 0] [--quick] [--output FILE]

Each rollout is a prompt, then turns: generate (a short or a long turn, drawn from a seeded
spread), append the sampled ids and a fixed "observation", sleep a seeded random tool time,
go on. Both engines get the same seeds and the same work, their runs alternating with
`--repeats`. Prints sampled tokens per second (wall time), p50 / p95 turn latency (each
generate call), each engine's speed alone (one request of the longest turn's length, after
each run: how fast it decodes without batching) and the async / blocking ratios. The numbers
go as JSON to stdout's last line and to `--output` when given. `--quick` is a tiny run, for
the test.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from agent.engines import make_engine
from agent.engines.base import SamplingParams
from agent.engines.shared import shareable
from agent.tiny_model import DEFAULT_DIR, build_tiny_model
from benchmarks.common import write_result

OBSERVATION = [100 + k for k in range(12)]  # the "tool output" appended after each turn
MAX_MODEL_LEN = 4096


def plan(args: argparse.Namespace) -> list[list[tuple[int, float]]]:
    """Per rollout, its turns as (tokens to sample, tool seconds after): uneven turn counts,
    most turns short, some long."""
    rollouts = []
    for i in range(args.rollouts):
        rng = random.Random(args.seed * 1000 + i)
        turns = []
        for _ in range(rng.randint(max(1, args.turns // 2), args.turns)):
            tokens = rng.randint(*args.long) if rng.random() < args.long_share else args.short
            turns.append((tokens, rng.uniform(0, args.tool_ms) / 1000))
        rollouts.append(turns)
    return rollouts


def alone(engine, tokens: int, seed: int) -> float:
    """Tokens per second of one request with the engine to itself: its speed without batching."""
    t0 = time.perf_counter()
    c = engine.generate(list(range(16, 80)), SamplingParams(max_new_tokens=tokens, seed=seed, stop_token_ids=()))
    return len(c.token_ids) / (time.perf_counter() - t0)


def run_rollouts(engine, work: list[list[tuple[int, float]]], seed: int) -> dict:
    """All rollouts at once, one thread each: wall time, each turn's latency, the sampled ids."""
    latencies: list[float] = []
    samples: list[list[int]] = [[] for _ in work]

    def rollout(i: int) -> None:
        history = [16 + (i * 97 + k * 13) % 4000 for k in range(64)]  # the prompt
        for t, (tokens, tool_s) in enumerate(work[i]):
            sampling = SamplingParams(max_new_tokens=tokens, seed=seed * 100_000 + i * 100 + t, stop_token_ids=())
            t0 = time.perf_counter()
            c = engine.generate(history, sampling)
            latencies.append(time.perf_counter() - t0)
            samples[i] += c.token_ids
            history = history + c.token_ids + OBSERVATION
            time.sleep(tool_s)

    threads = [threading.Thread(target=rollout, args=(i,)) for i in range(len(work))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"wall_s": time.perf_counter() - t0, "latencies": latencies, "samples": samples}


def summary(runs: list[dict]) -> dict:
    tokens = sum(len(s) for r in runs for s in r["samples"])
    wall = sum(r["wall_s"] for r in runs)
    latencies = [x for r in runs for x in r["latencies"]]
    return {"tokens": tokens, "turns": len(latencies), "wall_s": wall, "tokens_per_s": tokens / wall,
            "p50_turn_s": float(np.percentile(latencies, 50)), "p95_turn_s": float(np.percentile(latencies, 95)),
            "tokens_per_s_each": [sum(map(len, r["samples"])) / r["wall_s"] for r in runs],
            "alone_tokens_per_s": float(np.median([r["alone_tokens_per_s"] for r in runs]))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.engine_continuous", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="default: the tiny model")
    p.add_argument("--rollouts", type=int, default=16)
    p.add_argument("--turns", type=int, default=8, help="most turns per rollout (each has turns/2 to this many)")
    p.add_argument("--short", type=int, default=8, help="tokens in a short turn")
    p.add_argument("--long", type=int, nargs=2, default=[128, 256], help="tokens in a long turn: from, to")
    p.add_argument("--long-share", type=float, default=0.3, help="chance that a turn is long")
    p.add_argument("--tool-ms", type=float, default=50, help="tool time after a turn: 0 to this, uniform")
    p.add_argument("--repeats", type=int, default=1, help="runs per engine, the engines alternating")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="a tiny run (for the test): 4 rollouts x 3 turns, 4-32 tokens")
    p.add_argument("--output", type=Path, default=None, help="also write the numbers as JSON here")
    args = p.parse_args(argv)
    if args.quick:
        args.rollouts, args.turns, args.short, args.long, args.repeats = 4, 3, 4, [16, 32], 1
    if 64 + args.turns * (args.long[1] + len(OBSERVATION)) > MAX_MODEL_LEN:
        p.error(f"--turns x --long would pass the engines' max_model_len {MAX_MODEL_LEN}")
    model = args.model or str(build_tiny_model(DEFAULT_DIR))
    work = plan(args)
    longest = max(tokens for turns in work for tokens, _ in turns)

    # both engines up at once (about 1 GiB of KV cache each), so their runs can alternate and a
    # neighbour's load falls on both alike; the async one first: its engine core is a process
    # of its own, the blocking one runs in this process
    engines = {}
    runs: dict[str, list[dict]] = {"blocking": [], "async": []}
    try:
        for name, kind in (("async", "vllm"), ("blocking", "vllm_batch")):
            print(f"starting engine {kind} ...", file=sys.stderr, flush=True)
            engines[name] = shareable(make_engine(kind, model, max_model_len=MAX_MODEL_LEN))
            engines[name].generate([5, 6, 7, 8], SamplingParams(max_new_tokens=8, seed=1))  # warm-up, not timed
        for i in range(args.repeats):
            for name in runs:
                print(f"run {i + 1}/{args.repeats}: {name}", file=sys.stderr, flush=True)
                runs[name].append(run_rollouts(engines[name], work, args.seed))
                runs[name][-1]["alone_tokens_per_s"] = alone(engines[name], longest, args.seed)
    finally:
        for engine in engines.values():
            engine.close()
    results = {name: summary(r) for name, r in runs.items()}
    same = all(r["samples"] == runs["blocking"][0]["samples"] for rs in runs.values() for r in rs)
    a, b = results["async"], results["blocking"]
    ratios = {key: a[key] / b[key] for key in ("tokens_per_s", "p50_turn_s", "p95_turn_s", "alone_tokens_per_s")}

    turns = sum(len(w) for w in work)
    table = Table(title=f"vLLM CPU, tiny model: {args.rollouts} rollouts, {turns} turns ({args.short} or "
                        f"{args.long[0]}-{args.long[1]} tokens), tool 0-{args.tool_ms:g} ms, {args.repeats} repeat(s)")
    for col in ("engine", "tokens", "wall s", "tok/s", "p50 turn s", "p95 turn s", "alone tok/s"):
        table.add_column(col, justify="right")
    for name, label in (("blocking", "blocking (vllm_batch)"), ("async", "continuous (vllm)")):
        r = results[name]
        table.add_row(label, str(r["tokens"]), f"{r['wall_s']:.1f}", f"{r['tokens_per_s']:.0f}",
                      f"{r['p50_turn_s']:.2f}", f"{r['p95_turn_s']:.2f}", f"{r['alone_tokens_per_s']:.0f}")
    table.add_row("async / blocking", "", "", *(f"{ratios[k]:.2f}" for k in ratios))
    Console(width=120).print(table)

    out = {"config": {k: v for k, v in vars(args).items() if k != "output"} | {"total_turns": turns},
           "engines": results, "ratios_async_blocking": ratios, "identical_samples": same}
    write_result(out, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
