"""What a policy does in the seek env, move by move: how often it follows the reply's word.

    python -m experiments.seek_probe MODEL [MODEL ...] [--games 4] [--levels 4] [--show N] [--output FILE]

Each MODEL (an HF model folder, or a training checkpoint folder holding `policy/`) plays every
hidden number `--games` times, with the seek experiment's agent settings (conf/config.yaml's
`agent` under conf/experiment/seek.yaml's source) and sampling, in real sandboxes, graded by
the env: the rollouts training samples. Per model it prints the share found and, per move, how
often the move went the way the latest reply said (follow), the other way (opposite), or the
game ended before it (a win or the format-error limit), and the share of each move's plays
that went up. It also gives how often the first move is `up` for numbers below and above the
start: a policy that learned the rule moves up only above it, a policy that learned a bias
moves up on both sides. A reward curve says how much a run wins; this says which behaviour it
learned (BENCHMARKS.md, the long run). A game lost to a sandbox error is left out of the
counts and said, and the exit status is then 1. `--show N` prints what the policy wrote in
N of each model's games, turn by turn (a format error's text, say).
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table

from envs.base import Task
from envs.seek import replay

def model_dir(path: Path) -> Path:
    """An HF model folder: `path`, or a checkpoint's `policy/`; a ValueError otherwise."""
    for candidate in (path, path / "policy"):
        if (candidate / "config.json").exists():
            return candidate
    raise ValueError(f"{path}: neither a model folder (config.json) nor a checkpoint holding policy/")


def move_sides(secret: int, levels: int, moves: list[str]) -> list[tuple[str, str]]:
    """(the reply's word before the move, the move) for each move played: the word says where
    the number is from the pointer (the prompt's for the first move)."""
    out = []
    for k, move in enumerate(moves[: levels - 1]):
        pointer, found = replay(secret, levels, moves[:k])
        if found:
            break
        out.append(("up" if secret > pointer else "down", move))
    return out


def summarise(games: list[dict], levels: int) -> dict:
    """Per-move follow / opposite / ended / up counts, the share found, first-move `up` shares below and above
    the start, turns without a move a game (a format error, or a direction other than up or down)
    and the exit reasons, from each game's secret, moves, reward, exit reason and turns."""
    start = 1 << (levels - 1)
    moves = [{"follow": 0, "opposite": 0, "ended": 0, "up": 0} for _ in range(levels - 1)]
    first_up = {"below": [0, 0], "above": [0, 0]}
    for g in games:
        sides = move_sides(g["secret"], levels, g["moves"])
        for k in range(levels - 1):
            if k >= len(sides):
                moves[k]["ended"] += 1
                continue
            said, move = sides[k]
            moves[k]["follow" if move == said else "opposite"] += 1
            moves[k]["up"] += move == "up"
        if sides:
            side = first_up["below" if g["secret"] < start else "above"]
            side[0] += sides[0][1] == "up"
            side[1] += 1
    n = max(1, len(games))
    return {"games": len(games), "found": sum(g["reward"] > 0 for g in games) / n, "moves": moves,
            "first_up_below": first_up["below"][0] / first_up["below"][1] if first_up["below"][1] else None,
            "first_up_above": first_up["above"][0] / first_up["above"][1] if first_up["above"][1] else None,
            "turns_without_a_move": sum(g["turns"] - len(g["moves"]) for g in games) / n,
            "exits": dict(Counter(g["exit"] for g in games))}


def play(model: Path, games: int, levels: int, seed: int, jobs: int) -> list[dict]:
    """`games` rollouts of every hidden number with `model`, in sandboxes, graded."""
    from transformers import AutoTokenizer

    from agent.engines import make_engine
    from agent.rollout import rollout_and_grade
    from sandbox.pool import SandboxPool
    from training.config import CONF
    from training.factories import make_agent, make_source_env

    cfg = OmegaConf.create({"agent": OmegaConf.load(CONF / "agent" / "default.yaml")})  # the default agent's settings
    source = next(s for s in OmegaConf.load(CONF / "experiment" / "seek.yaml").sources if s.env == "seek")
    env = make_source_env(source)
    engine = make_engine("hf", str(model))
    agent = make_agent(engine, AutoTokenizer.from_pretrained(model), cfg, source.get("agent"))
    start, top = 1 << (levels - 1), (1 << levels) - 1
    tasks = [Task(instance_id=f"probe-{secret}-{i}", repo="seek", base_commit="-", problem_statement="",
                  extra={"secret": secret, "levels": levels})
             for secret in range(1, top + 1) if secret != start for i in range(games)]
    pool = SandboxPool(f"seek-probe-{uuid.uuid4().hex[:8]}", max_live=jobs)

    def one(job: tuple[int, Task]) -> dict:
        i, task = job
        traj = rollout_and_grade(agent, task, env, pool, seed=seed + i)
        report = traj.info.get("grade", {}).get("report", {})
        return {"secret": task.extra["secret"], "moves": list(report.get("moves", [])), "reward": traj.reward or 0.0,
                "exit": traj.exit_reason, "turns": traj.turns, "error": traj.info.get("error"),
                "said": [m.get("raw", m.get("content", "")) for m in traj.messages if m["role"] == "assistant"]}

    with ThreadPoolExecutor(jobs) as threads:
        return list(threads.map(one, enumerate(tasks)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.seek_probe", description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="+", type=Path, help="HF model folders or training checkpoints (with policy/)")
    p.add_argument("--games", type=int, default=4, help="games per hidden number")
    p.add_argument("--levels", type=int, default=4, help="the env's levels: numbers 1 to 2^levels - 1 (4: 15)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=4, help="games at once")
    p.add_argument("--show", type=int, default=0, help="print what the policy wrote in this many games a model")
    p.add_argument("--output", type=Path, help="write the counts as JSON")
    args = p.parse_args(argv)
    if args.games < 1 or args.levels < 2 or args.jobs < 1 or args.show < 0:
        p.error("--games and --jobs must be at least 1, --levels at least 2, --show 0 or more")
    try:
        models = [model_dir(m) for m in args.models]
    except ValueError as e:
        p.error(str(e))
    results, failed = {}, False
    table = Table(title=f"seek, {args.games} game(s) per number, levels {args.levels}")
    for col in ["model", "found", *[f"move {k + 1} follow / opposite / ended" for k in range(args.levels - 1)],
                "up, each move", "first move up: below / above", "turns without a move, a game"]:
        table.add_column(col, justify="left" if col == "model" else "right", overflow="fold")
    for name, model in zip(args.models, models):
        print(f"{name}: playing", file=sys.stderr, flush=True)
        games = play(model, args.games, args.levels, args.seed, args.jobs)
        lost = [g for g in games if g["exit"] == "sandbox_error"]  # no move of the policy's: left out
        if lost:
            failed = True
            print(f"{name}: {len(lost)} of {len(games)} game(s) lost to a sandbox error, left out: {lost[0]['error']}",
                  file=sys.stderr)
        for g in games[: args.show]:  # the games of a few numbers, in order
            print(f"{name}: number {g['secret']}, {g['exit']}, reward {g['reward']:g}")
            for turn, text in enumerate(g["said"], 1):
                print(f"  turn {turn}: {text!r}")
        s = summarise([g for g in games if g["exit"] != "sandbox_error"], args.levels)
        results[str(name)] = s
        share = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        table.add_row(str(name), f"{s['found']:.2f}",
                      *[f"{m['follow']} / {m['opposite']} / {m['ended']}" for m in s["moves"]],
                      " / ".join(share(m["up"] / played if (played := m["follow"] + m["opposite"]) else None)
                                 for m in s["moves"]),
                      f"{share(s['first_up_below'])} / {share(s['first_up_above'])}", f"{s['turns_without_a_move']:.2f}")
    Console(width=160).print(table)
    if args.output:
        args.output.write_text(json.dumps({"games": args.games, "levels": args.levels, "seed": args.seed,
                                           "models": results}, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
