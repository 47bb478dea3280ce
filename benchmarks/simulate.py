"""The project's orchestrator at scale, in simulated time: its stream, sampler, staleness control
and learner loop as they are, with simulated parts in place of the engine, the sandboxes and the
learner, and time compressed (`--compression 60`: a simulated hour takes a real minute).

    python -m benchmarks.simulate [--in-flight 64 256 1024] [--algos sao grpo] [--steps 8]
        [--batch-size 128] [--compression 60] [--params FILE.json] [--max-staleness 4] [--quick]
        [--output FILE]

The simulated parts (PARAMS below; `--params` replaces any of them):
- an engine of `replicas` replicas, each sharing its decode rate among the requests it holds
  (processor sharing: aggregate tokens a second by concurrent sequences, interpolated from
  `decode_table`), up to `max_seqs` at once (the rest queue), a prefill at `prefill_tok_s`
  for each turn's new observation tokens; a weight sync takes `sync_s`, requests in flight go
  on (vLLM's `continue` mode) and each turn carries the version it started under;
- a rollout: a sandbox start, a number of turns from a log-normal around `turns_median`, each
  turn `new_tokens` sampled and `obs_tokens` of observation after a tool call whose latency is a
  Pareto(`tool_alpha`) draw from `tool_scale_s` (at most `tool_max_s`), then the tests;
- a learner step of `learner_overhead_s` plus the batch's tokens at `learner_tok_s` (times
  `critic_factor` for SAO, whose critic is updated too).
Each value's source is in SOURCES (and in the result): public figures where there are any,
said as not sourced where there are none.
A rollout's trajectory holds one sampled token per turn (carrying that turn's policy version, so
the stream's staleness is the real computation) and its simulated token counts in `info`.

These are a simulation, not a measurement: what they say is how the real orchestrator behaves
when its parts take these times, and what it costs itself (its CPU seconds per rollout).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import math
import random
import statistics
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from agent.trajectory import Trajectory
from benchmarks.common import write_result
from envs.base import Task
from training.orchestrator import Orchestrator, RunConfig, Source, TaskSampler

console = Console(stderr=True)

# Simulated seconds and tokens: Qwen3-30B-A3B at the two-node layout of docs/cluster.md (two
# engine replicas of 2 H200 each, a learner on 12 H200), SWE rollouts of a SWE-agent-style
# scaffold. Each value's public source (or the lack of one) is in SOURCES; BENCHMARKS.md
# tabulates them. --params replaces any of them.
PARAMS = {
    "replicas": 2,
    "max_seqs": 1024,  # sequences one replica decodes at once
    "decode_table": [[1, 100.0], [18, 1500.0], [128, 6544.0]],
    "prefill_tok_s": 20000.0,
    "sync_s": 13.0,
    "sandbox_start_s": 5.0,
    "turns_median": 40,
    "turns_sigma": 0.5,
    "turns_max": 250,
    "prompt_tokens": 1500,
    "new_tokens": 250,
    "obs_tokens": 800,
    "tool_alpha": 1.0,
    "tool_scale_s": 0.3,
    "tool_max_s": 300.0,
    "test_s": 30.0,
    "learner_overhead_s": 5.0,
    "learner_tok_s": 17000.0,
    "critic_factor": 2.0,
    "reward_p": 0.3,
}

SOURCES = {
    "replicas": "docs/cluster.md's two-node layout (2 replicas x TP 2 on H200)",
    "max_seqs": "vLLM 0.32 engine/arg_utils.py get_batch_defaults: max_num_seqs 1024 on GPUs of >= 70 GiB other than A100",
    "decode_table": ("1 sequence: 104 tok/s, Qwen3-30B-A3B under vLLM on A100, ISL/OSL 128 (tenstorrent/tt-inference-server "
                     "#340; a lower bound for H200); 18 sequences: ~1,500 tok/s a TP-2 H200 replica (82 tok/s a request, "
                     "jessicaochen/rl-lab experiments/inference-scheduler, verl + vLLM, 8k prompts); 128: 6,544 = 2 GPUs x "
                     "3,272 tok/s/GPU measured at TP 8 with 128 sessions (rl-lab docs/scaling-ladder.md), assuming the "
                     "per-GPU rate carries to TP 2; flat beyond (no figure)"),
    "prefill_tok_s": "25,292 tok/s at ISL 2048 on A100, concurrency 1 (tt-inference-server #340); prefix caching hits 94% of "
                     "a turn's prompt in rl-lab's H200 runs, so prefill is a small share either way",
    "sync_s": ("12-13 s a weight update, verl NCCL from 8 or 16 H200 into vLLM (rl-lab docs/scaling-ladder.md); 10 s after "
               "slime's optimizations (sglang PR #8751, Qwen3-30B-A3B on H100/H200)"),
    "sandbox_start_s": "no public start time of a SWE-bench image's container found: a warm start assumed (image present)",
    "turns_median": ("SWE-agent 1.1 on SWE-Bench Pro: median turns 29 (Gemini 2.5 Pro) to 78 (Claude Sonnet 4.5), limit 250 "
                     "(nilenso swe-bench-pro-cost-token-time-analysis); a trained 30B-A3B policy takes ~10 (rl-lab): 40 between"),
    "turns_sigma": "not sourced: spread of the log-normal, p25-p75 of 63-89 and 34-76 in nilenso's per-model tables fit 0.3-0.6",
    "turns_max": "SWE-agent's 250-turn limit in nilenso's analysis (maxima 215-251)",
    "prompt_tokens": "1,405 prompt tokens, mini-swe-agent on r2e-gym tasks, Qwen3 tokenizer (rl-lab docs/scaling-ladder.md)",
    "new_tokens": "Claude Sonnet 4.5: 17,705 visible output tokens over 78 calls, ~227 a turn (nilenso report.txt); a thinking "
                  "policy writes ~1,200 (rl-lab)",
    "obs_tokens": "2.8k-4.0k characters of observation a step (nilenso report.txt), at ~4 characters a token",
    "tool_alpha": ("nilenso: per-step tool time median ~0.5 s, 2.4-3.7% of calls over 10 s, mean tool time a task 266-296 s; "
                   "Pareto(1.0, 0.3 s) capped at 300 s gives median 0.6 s, 3% over 10 s, mean 2.4 s a step"),
    "tool_scale_s": "as tool_alpha",
    "tool_max_s": "not sourced (a tool timeout)",
    "test_s": "not sourced: no public per-instance grading time found",
    "learner_overhead_s": "~4 parameter offload/load moves of 0.6-1.9 s a step on 8 H200 (rl-lab experiments/gpu-host-offload)",
    "learner_tok_s": ("policy update ~12k tok/s on 8 H200, ~22k on 16 (rl-lab: update_actor 1.12-1.25 s and 0.63 s a sample of "
                      "~13.5k tokens, TP 2 x EP 4, Megatron): ~17k on 12, interpolated"),
    "critic_factor": "not sourced: SAO's critic is the policy's size, so its update is counted as a second one (x2 for SAO)",
    "reward_p": "not used by the rates (a reward for the batch's mean)",
}


class Clock:
    """Simulated time: real time since start, times the compression."""

    def __init__(self, compression: float):
        self.compression = compression
        self.t0 = time.monotonic()

    def now(self) -> float:
        return (time.monotonic() - self.t0) * self.compression

    async def sleep(self, sim_s: float) -> None:
        await asyncio.sleep(max(sim_s, 0.0) / self.compression)

    def block(self, sim_s: float) -> None:
        time.sleep(max(sim_s, 0.0) / self.compression)


@dataclass
class _Request:
    tokens: float
    done: asyncio.Future


@dataclass
class _Replica:
    active: list[_Request] = field(default_factory=list)
    waiting: deque = field(default_factory=deque)


class SimEngine:
    """Replicas sharing their decode rate among the requests they hold, ticked on the event loop."""

    def __init__(self, p: dict, clock: Clock, tick_s: float = 0.02):
        self.p, self.clock, self.tick_s = p, clock, tick_s
        self.replicas = [_Replica() for _ in range(int(p["replicas"]))]
        self.counts, self.rates = zip(*p["decode_table"])
        self.version = 0
        self.busy_s = 0.0  # real seconds with a request in a replica, averaged over the replicas
        self.tick_cpu_s = 0.0  # the simulation's own CPU time (left out of the orchestrator's)
        self._task: asyncio.Task | None = None

    def rate(self, n: int) -> float:
        """Aggregate tokens a second of one replica holding n sequences (linear between rows)."""
        if n <= self.counts[0]:
            return self.rates[0] * n / self.counts[0]
        i = bisect.bisect_left(self.counts, n)
        if i >= len(self.counts):
            return self.rates[-1]
        (n0, r0), (n1, r1) = (self.counts[i - 1], self.rates[i - 1]), (self.counts[i], self.rates[i])
        return r0 + (r1 - r0) * (n - n0) / (n1 - n0)

    async def generate(self, new_tokens: int, prefill_tokens: int) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._tick())
        await self.clock.sleep(prefill_tokens / self.p["prefill_tok_s"])
        replica = min(self.replicas, key=lambda r: len(r.active) + len(r.waiting))
        req = _Request(float(new_tokens), asyncio.get_running_loop().create_future())
        (replica.active if len(replica.active) < self.p["max_seqs"] else replica.waiting).append(req)
        await req.done

    async def _tick(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(self.tick_s)
            c0 = time.thread_time()
            now = time.monotonic()
            dt_real, last = now - last, now
            dt = dt_real * self.clock.compression
            busy = 0
            for r in self.replicas:
                if not r.active:
                    continue
                busy += 1
                each = self.rate(len(r.active)) / len(r.active) * dt
                still = []
                for req in r.active:
                    req.tokens -= each
                    if req.tokens <= 0:
                        req.done.set_result(None)
                    else:
                        still.append(req)
                r.active = still
                while r.waiting and len(r.active) < self.p["max_seqs"]:
                    r.active.append(r.waiting.popleft())
            self.busy_s += dt_real * busy / len(self.replicas)
            self.tick_cpu_s += time.thread_time() - c0

    def update_weights(self, named_tensors, version: int) -> None:
        """In the learner's thread: the sync's time, then the new version (requests go on)."""
        self.clock.block(self.p["sync_s"])
        self.version = version

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()


class SimLearner:
    """A learner step's simulated time from the batch's tokens; the version goes up by one."""

    def __init__(self, p: dict, clock: Clock, critic: bool = False):
        self.p, self.clock, self.version = p, clock, 0
        self.factor = p["critic_factor"] if critic else 1.0  # SAO updates a critic of the policy's size too
        self.steps: list[float] = []

    def step(self, batch: list[Trajectory], group_ids=None) -> dict:
        tokens = sum(t.info["sim_tokens"] for t in batch)
        seconds = self.p["learner_overhead_s"] + self.factor * tokens / self.p["learner_tok_s"]
        self.clock.block(seconds)
        self.steps.append(seconds)
        self.version += 1
        return {"reward/mean": sum(t.reward for t in batch) / len(batch), "sim/learner_s": seconds,
                "sim/batch_tokens": float(tokens)}

    def state_dict_for_engine(self):
        return []


def sim_rollout(p: dict, engine: SimEngine, clock: Clock, finished: list[str]):
    """The orchestrator's `rollout(source, task, seed)`: one simulated rollout (its task and seed
    appended to `finished` when it ends)."""

    async def rollout(source: Source, task: Task, seed: int) -> Trajectory:
        rng = random.Random(seed)
        start = clock.now()
        await clock.sleep(p["sandbox_start_s"])
        turns = max(1, min(int(p["turns_max"]), round(p["turns_median"] * math.exp(rng.gauss(0.0, p["turns_sigma"])))))
        traj = Trajectory(task.instance_id, prompt_ids=[0])
        tokens, sampled, prefill, gen_s, tool_s = p["prompt_tokens"], 0, p["prompt_tokens"], 0.0, 0.0
        for _ in range(turns):
            version, t0 = engine.version, clock.now()
            await engine.generate(p["new_tokens"], prefill)
            gen_s += clock.now() - t0
            traj.append_sampled([1], [-1.0], version)
            latency = min(p["tool_scale_s"] * (1.0 - rng.random()) ** (-1.0 / p["tool_alpha"]), p["tool_max_s"])
            await clock.sleep(latency)
            tool_s += latency
            traj.append_observation([2])
            tokens += p["new_tokens"] + p["obs_tokens"]
            sampled += p["new_tokens"]
            prefill = p["obs_tokens"]
        await clock.sleep(p["test_s"])
        traj.turns, traj.exit_reason = turns, "submitted"
        traj.reward = float(rng.random() < p["reward_p"])
        traj.info.update(sim_tokens=tokens, sim_sampled=sampled)
        traj.timings = {"generate": gen_s, "tools": tool_s, "grade": p["test_s"], "sandbox": p["sandbox_start_s"],
                        "rollout": clock.now() - start}
        finished.append(f"{task.instance_id}/{seed}")
        return traj

    return rollout


def simulate(algo: str, in_flight: int, p: dict, steps: int, batch_size: int, compression: float,
             max_staleness: int = 4, seed: int = 0) -> dict:
    """One run of the real orchestrator with the simulated parts: the numbers of its table."""
    clock = Clock(compression)
    engine, learner = SimEngine(p, clock), SimLearner(p, clock, critic=algo == "sao")
    group = 8 if algo == "grpo" else 1
    mode = "sync" if algo == "grpo" else "async"
    tasks = [Task(instance_id=f"sim-{i}", repo="sim", base_commit="-", problem_statement="")
             for i in range(max(4 * in_flight, 4 * batch_size))]
    sampler = TaskSampler([Source("sim", env=None, tasks=tasks, agent=None)], seed=seed)
    cfg = RunConfig(mode=mode, batch_size=batch_size, group_size=group, num_workers=in_flight, max_steps=steps,
                    max_staleness=max_staleness, seed=seed, max_failed_in_a_row=10**9)
    rows: list[dict] = []
    trained_keys: list[str] = []
    finished: list[str] = []

    def on_step(step, metrics, batch):
        rows.append(dict(metrics, step=step))
        trained_keys.extend(t.info["rollout_key"] for t in batch)

    orch = Orchestrator(cfg, sampler, pool=None, engine=engine, learner=learner, on_step=on_step,
                        rollout=sim_rollout(p, engine, clock, finished))
    cpu0, real0 = time.process_time(), time.monotonic()

    async def main():
        try:
            await orch.run()
        finally:
            engine.close()

    asyncio.run(main())
    real_s = time.monotonic() - real0
    cpu_s = time.process_time() - cpu0 - engine.tick_cpu_s
    sim_s = real_s * compression
    counts = orch.stream.counts
    hist: dict[str, float] = {}  # of trained rollouts, as each step's metrics count them
    for row in rows:
        for k, v in row.items():
            if k.startswith("staleness/hist_") and v:
                hist[k.rsplit("_", 1)[1]] = hist.get(k.rsplit("_", 1)[1], 0) + int(v)
    trained = len(trained_keys)
    return {
        "algo": algo, "mode": mode, "in_flight": in_flight, "steps": len(rows), "trained": trained,
        "unique_trained": len(set(trained_keys)), "finished": len(finished), "unique_finished": len(set(finished)),
        "dropped_stale": counts["dropped_stale"], "sim_hours": round(sim_s / 3600, 3),
        "rollouts_per_hour": round(trained / (sim_s / 3600), 1),
        "step_s_mean": round(statistics.mean(r["time/step/wall_s"] for r in rows) * compression, 1) if rows else 0.0,
        "learner_s_mean": round(statistics.mean(learner.steps), 1) if learner.steps else 0.0,
        "learner_idle_frac": round(rows[-1]["time/learner_idle_frac"], 3) if rows else 1.0,
        "engine_idle_frac": round(rows[-1]["time/engine_idle_frac"], 3) if rows else 1.0,
        "staleness_hist": hist,
        "staleness_mean": round(sum(int(k) * v for k, v in hist.items() if k != "over") / max(1, sum(hist.values())), 3),
        "orchestrator_cpu_ms_per_rollout": round(1000 * cpu_s / max(1, len(finished)), 3),
        "real_s": round(real_s, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.simulate", description=__doc__.split("\n\n")[0])
    p.add_argument("--in-flight", type=int, nargs="+", default=[64, 256, 1024], help="rollouts in flight (workers)")
    p.add_argument("--algos", nargs="+", choices=["sao", "grpo"], default=["sao", "grpo"],
                   help="sao: async, one rollout per prompt; grpo: sync, groups of 8")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--compression", type=float, default=60.0, help="simulated seconds per real second")
    p.add_argument("--params", type=Path, help="a JSON object replacing any of PARAMS")
    p.add_argument("--max-staleness", type=int, default=4, help="trainer.max_staleness (async SAO)")
    p.add_argument("--quick", action="store_true", help="a tiny case (tests): 2 steps of 8, 16 in flight, x2000")
    p.add_argument("--output", type=Path)
    args = p.parse_args(argv)
    params = dict(PARAMS)
    if args.params:
        extra = json.loads(args.params.read_text())
        unknown = sorted(set(extra) - set(PARAMS))
        if unknown:
            p.error(f"--params {args.params}: unknown {unknown}; known: {sorted(PARAMS)}")
        params.update(extra)
    if args.quick:
        args.in_flight, args.steps, args.batch_size, args.compression = [16], 2, 8, 2000.0
        params.update(turns_median=4, turns_max=8, tool_max_s=20.0)
    results = []
    for n in args.in_flight:
        for algo in args.algos:
            r = simulate(algo, n, params, args.steps, args.batch_size, args.compression, args.max_staleness)
            console.print(f"{algo} {n} in flight: {r['rollouts_per_hour']:.0f} rollouts/h, step {r['step_s_mean']:.0f} s "
                          f"(real {r['real_s']:.0f} s)")
            results.append(r)
    table = Table(title=f"simulated: batches of {args.batch_size}, {args.steps} steps, x{args.compression:g} time")
    for col in ("algo", "in flight", "rollouts/h", "step s", "learner idle", "engine idle", "staleness mean",
                "dropped", "orchestrator CPU ms/rollout"):
        table.add_column(col, justify="left" if col == "algo" else "right")
    for r in results:
        table.add_row(f"{r['algo']} ({r['mode']})", str(r["in_flight"]), f"{r['rollouts_per_hour']:.0f}",
                      f"{r['step_s_mean']:.0f}", f"{r['learner_idle_frac']:.2f}", f"{r['engine_idle_frac']:.2f}",
                      f"{r['staleness_mean']:.2f}", str(r["dropped_stale"]), f"{r['orchestrator_cpu_ms_per_rollout']:.2f}")
    console.print(table)
    out = {"max_staleness": args.max_staleness, "params": params,
           "sources": {k: SOURCES[k] for k in params if k in SOURCES}, "compression": args.compression,
           "steps": args.steps, "batch_size": args.batch_size,
           "results": results}
    write_result(out, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
