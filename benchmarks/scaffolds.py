"""Rollouts per hour with the project's agent and with mini-swe-agent on the same tasks, model and
engine, side by side in one run; and what the rollout endpoint costs per request against
calling the engine directly.

    python -m benchmarks.scaffolds [--tasks 8] [--rounds 2] [--workers 2] [--engine auto]
        [--max-turns 4] [--max-new-tokens 64] [--requests 40] [--quick] [--output FILE]

Rollouts: the first `--tasks` built-in SWE tasks, each rolled out and graded
(`agent.rollout.rollout_and_grade`, real sandboxes) by `agent=default` and by `agent=mini_swe`,
`--workers` at a time, the two agents in turn round by round (ABAB...) so that load that moves
falls on both. Model: the embedded tiny model after the default run's SFT warm start (the same
cached checkpoint). It has learnt neither agent's SWE work, so this measures what a rollout
costs in each scaffold (prompt length, turns, the endpoint, sandbox commands, grading), not
what it solves.

Endpoint: `--requests` requests of one conversation (mini-swe-agent's first prompt on a task),
each its own rollout, `max_tokens` 1, sent through the openai client to the endpoint, and the
same prompt ids given to `engine.generate` directly; in turn, one and then the other. The
difference per request is the endpoint's cost (HTTP, JSON, rendering, parsing), reported with
the endpoint's own measure of the time outside the engine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks.common import write_result

console = Console(stderr=True)


def _p95(xs: list[float]) -> float:
    return sorted(xs)[max(0, int(round(0.95 * len(xs))) - 1)]


def _agents(engine, tokenizer, max_turns: int, max_new_tokens: int) -> dict:
    from agent.agents import make_agent
    from agent.loop import AgentConfig

    config = AgentConfig(max_turns=max_turns, max_tokens=8192, max_new_tokens=max_new_tokens)
    return {name: make_agent(name, engine, tokenizer, config) for name in ("default", "mini_swe")}


def rollouts(agents: dict, tasks, rounds: int, workers: int) -> dict:
    from agent.rollout import rollout_and_grade
    from envs.swe import SWEEnv
    from sandbox.pool import SandboxPool

    env = SWEEnv()
    pool = SandboxPool(f"bench-scaffolds-{uuid.uuid4().hex[:6]}", max_live=2 * workers)
    out = {name: {"wall_s": 0.0, "rollouts": 0, "turns": [], "sampled": [], "tokens": [], "seconds": [],
                  "exits": {}, "reward": [], "retokenized": 0, "repaired": 0} for name in agents}
    try:
        for r in range(rounds):
            for name in (list(agents) if r % 2 == 0 else list(agents)[::-1]):
                agent, res = agents[name], out[name]
                t0 = time.monotonic()
                with ThreadPoolExecutor(workers) as ex:
                    trajs = list(ex.map(lambda kt: rollout_and_grade(agent, kt[1], env, pool, seed=1000 * r + kt[0]),
                                        enumerate(tasks)))
                res["wall_s"] += time.monotonic() - t0
                res["rollouts"] += len(trajs)
                for t in trajs:
                    res["turns"].append(t.turns)
                    res["sampled"].append(t.num_sampled)
                    res["tokens"].append(t.num_tokens)
                    res["seconds"].append(t.timings.get("rollout", 0.0))
                    res["reward"].append(t.reward)
                    res["exits"][t.exit_reason] = res["exits"].get(t.exit_reason, 0) + 1
                    res["retokenized"] += t.info.get("retokenized_turns", 0)
                    res["repaired"] += t.info.get("repaired_turns", 0)
                console.print(f"round {r + 1}/{rounds} {name}: {len(trajs)} rollouts in {time.monotonic() - t0:.1f} s")
    finally:
        pool.close()
    summary = {}
    for name, res in out.items():
        summary[name] = {
            "rollouts": res["rollouts"], "wall_s": round(res["wall_s"], 2),
            "rollouts_per_hour": round(3600 * res["rollouts"] / res["wall_s"], 1),
            "rollout_s_mean": round(statistics.mean(res["seconds"]), 2), "rollout_s_p95": round(_p95(res["seconds"]), 2),
            "turns_mean": round(statistics.mean(res["turns"]), 2),
            "prompt_plus_trajectory_tokens_mean": round(statistics.mean(res["tokens"]), 1),
            "sampled_tokens_mean": round(statistics.mean(res["sampled"]), 1),
            "reward_mean": round(statistics.mean(res["reward"]), 3), "exits": res["exits"],
            "retokenized_turns": res["retokenized"], "repaired_turns": res["repaired"],
        }
    return summary


def endpoint_overhead(engine, tokenizer, task, n: int) -> dict:
    """Per request: direct `engine.generate` against the same prompt through the endpoint."""
    from openai import OpenAI

    from agent.endpoint import ChatEndpoint
    from agent.engines.base import SamplingParams
    from agent.mini_swe import load_config
    from jinja2 import Template

    mini = load_config("swebench")
    messages = [{"role": "system", "content": mini["agent"]["system_template"]},
                {"role": "user", "content": Template(mini["agent"]["instance_template"]).render(task=task.problem_statement)}]
    tools = [{"type": "function", "function": {"name": "bash", "description": "Execute a bash command",
                                              "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                                                             "required": ["command"]}}}]
    ep = ChatEndpoint(engine, tokenizer).start()
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    direct, served, outside = [], [], []
    try:
        with ep.rollout(max_new_tokens=1) as rec:  # the prompt ids the endpoint makes of these messages
            ids = rec.prepare(messages, tools)
        client = OpenAI(base_url=ep.url, api_key="x")
        for i in range(n + 2):  # the first two of each are warm-up
            t0 = time.monotonic()
            engine.generate(ids, SamplingParams(1, 1.0, 1.0, (eos,), i))
            d = time.monotonic() - t0
            with ep.rollout(max_new_tokens=1, seed=i) as rec:
                t0 = time.monotonic()
                client.with_options(api_key=rec.key).chat.completions.create(
                    model="policy", messages=messages, tools=tools, max_tokens=1)
                s = time.monotonic() - t0
            if i >= 2:
                direct.append(d)
                served.append(s)
                outside.append(rec.serve_s)
    finally:
        ep.close()
    ms = lambda xs: round(1000 * statistics.mean(xs), 2)  # noqa: E731
    return {"requests": n, "prompt_tokens": len(ids), "direct_ms_mean": ms(direct), "endpoint_ms_mean": ms(served),
            "added_ms_mean": round(ms(served) - ms(direct), 2), "added_ms_median":
                round(1000 * statistics.median([s - d for s, d in zip(served, direct)]), 2),
            "endpoint_own_ms_mean": ms(outside), "ratio": round(statistics.mean(served) / statistics.mean(direct), 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scaffolds", description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2, help="each agent runs every task once a round")
    p.add_argument("--workers", type=int, default=2, help="rollouts at once (as the default run's num_workers)")
    p.add_argument("--engine", default="auto", help="auto: vllm where installed, else hf")
    p.add_argument("--max-turns", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--requests", type=int, default=40, help="endpoint overhead: requests of each kind")
    p.add_argument("--quick", action="store_true", help="2 tasks, 1 round, 5 requests, hf engine, 2 turns (tests)")
    p.add_argument("--output", type=Path)
    args = p.parse_args(argv)
    if args.quick:
        args.tasks, args.rounds, args.requests, args.engine, args.max_turns, args.max_new_tokens = 2, 1, 5, "hf", 2, 16
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    from agent.engines import make_engine
    from agent.engines.shared import shareable
    from taskdata.load import load_builtin_tasks
    from training.config import CONF
    from training.factories import engine_choice, prepare_model

    model_cfg = OmegaConf.merge(OmegaConf.load(CONF / "model" / "tiny.yaml"), {"sft": {"steps": 10}} if args.quick else {})
    model = prepare_model(model_cfg)
    kind, options = engine_choice(OmegaConf.create({"kind": args.engine, "options": {}}))
    engine = shareable(make_engine(kind, model, **options))
    tokenizer = AutoTokenizer.from_pretrained(model)
    tasks = load_builtin_tasks()[: args.tasks]
    try:
        result = {"engine": kind, "model": model, "tasks": [t.instance_id for t in tasks], "rounds": args.rounds,
                  "workers": args.workers, "max_turns": args.max_turns, "max_new_tokens": args.max_new_tokens,
                  "agents": rollouts(_agents(engine, tokenizer, args.max_turns, args.max_new_tokens), tasks,
                                     args.rounds, args.workers),
                  "endpoint": endpoint_overhead(engine, tokenizer, tasks[0], args.requests)}
    finally:
        if hasattr(engine, "close"):
            engine.close()
    table = Table(title=f"rollouts per hour, {len(tasks)} tasks x {args.rounds} rounds, {args.workers} at a time ({kind})")
    for col in ("agent", "rollouts/h", "rollout s (p95)", "turns", "tokens", "sampled", "exits", "retokenized"):
        table.add_column(col, justify="left" if col in ("agent", "exits") else "right")
    for name, a in result["agents"].items():
        table.add_row(name, f"{a['rollouts_per_hour']:.0f}", f"{a['rollout_s_mean']:.1f} ({a['rollout_s_p95']:.1f})",
                      f"{a['turns_mean']:.1f}", f"{a['prompt_plus_trajectory_tokens_mean']:.0f}",
                      f"{a['sampled_tokens_mean']:.0f}", json.dumps(a["exits"]), str(a["retokenized_turns"]))
    console.print(table)
    e = result["endpoint"]
    console.print(f"endpoint: {e['endpoint_ms_mean']} ms a request against {e['direct_ms_mean']} ms direct "
                  f"(+{e['added_ms_mean']} ms, median +{e['added_ms_median']} ms; its own time outside the engine "
                  f"{e['endpoint_own_ms_mean']} ms), prompt {e['prompt_tokens']} tokens, 1 new token")
    write_result(result, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
