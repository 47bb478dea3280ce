"""Run one rollout of the agent on one task in a real sandbox, grade it, save the trajectory.

    python -m agent.rollout --dataset FILE|builtin --instance-id ID [--model PATH]
        [--engine hf|vllm] --output DIR [--max-turns N] [--seed S]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
import uuid
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from agent.engines import make_engine
from agent.loop import Agent, AgentConfig, versioned
from agent.tiny_model import DEFAULT_DIR, build_tiny_model
from agent.trajectory import Trajectory
from envs.base import Env, Task, make_env
from taskdata.load import load_tasks
from taskdata.rows import DatasetError
from sandbox.base import SandboxError
from sandbox.pool import SandboxPool

console = Console(stderr=True)


class _GradingSandbox:
    """A clean sandbox for grading, made ready (created from the task's image, its workspace
    reset) in a thread of its own while the rollout runs, so grading in a fresh sandbox adds
    little to the rollout's time. Nothing of the rollout's sandbox reaches it."""

    def __init__(self, pool: SandboxPool, image: str, task: Task, env: Env, reset_kw: dict | None = None):
        self._stack = contextlib.ExitStack()
        self._sandbox = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._prepare, args=(pool, image, task, env, reset_kw or {}),
                                        daemon=True, name=f"grading-sandbox-{task.instance_id}")
        self._thread.start()

    def _prepare(self, pool: SandboxPool, image: str, task: Task, env: Env, reset_kw: dict) -> None:
        try:
            sandbox = self._stack.enter_context(pool.sandbox(image))
            env.reset(task, sandbox, **reset_kw)
            self._sandbox = sandbox
        except BaseException as e:  # said when grading asks for it
            self._error = e

    def get(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._sandbox

    def close(self) -> None:
        self._thread.join()
        self._stack.close()


def rollout_and_grade(agent: Agent, task: Task, env: Env, pool: SandboxPool, seed: int | None = None,
                      prepare_grading: bool = True) -> Trajectory:
    """One rollout in a fresh sandbox, graded; every sandbox is removed however it ends.

    An env that grades a patch (`env.grades_patch`, the SWE env) is graded as SWE-bench's harness
    grades: the workspace's diff is taken, and the tests run in another fresh sandbox from the
    task's image with only that patch applied, so nothing the agent did outside the repository
    (a shadowed test runner, a daemon it left) touches grading. That sandbox is made ready while
    the rollout runs (`prepare_grading`; one more container per rollout, idle until grading).
    Other envs grade in place.
    """
    image = env.image_for(task)
    grading = None
    start = time.monotonic()
    timings = {}  # the phases around the agent's own (training/timings.py)
    try:
        with pool.sandbox(image) as sb:
            timings["sandbox"] = time.monotonic() - start  # waiting for a slot, and the container's start
            if env.grades_patch and prepare_grading:  # once this rollout holds its own sandbox
                grading = _GradingSandbox(pool, image, task, env, versioned(env, agent.engine))
            traj = agent.run(task, env, sb, seed=seed)
            traj.timings.update(timings)
            if traj.exit_reason == "sandbox_error":
                return traj
            if traj.exit_reason == "sandbox_killed":  # nothing left to grade: the policy stopped its sandbox
                traj.reward = 0.0
                return traj
            t0 = time.monotonic()
            if not env.grades_patch:  # (a versioned env grades by the engine's version now, envs/online.py)
                result = env.grade(task, sb, **versioned(env, agent.engine))
                traj.timings["grade"] = time.monotonic() - t0
            else:
                patch = env.patch_of(task, sb)
            t_release = time.monotonic()
        traj.timings["release"] = time.monotonic() - t_release  # the sandbox's removal
        if env.grades_patch:  # the rollout's sandbox is gone (its pool slot free) before this waits
            t0 = time.monotonic()
            if grading is not None:
                result = env.grade(task, grading.get(), patch, **versioned(env, agent.engine))
            else:
                with pool.sandbox(image) as clean:
                    env.reset(task, clean, **versioned(env, agent.engine))
                    result = env.grade(task, clean, patch, **versioned(env, agent.engine))
            traj.timings["grade"] = time.monotonic() - t0
    finally:
        if grading is not None:
            grading.close()
    traj.timings["rollout"] = time.monotonic() - start
    traj.reward = result.reward
    traj.info["grade"] = {k: v for k, v in asdict(result).items() if k != "log"}
    return traj


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agent.rollout", description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="builtin")
    p.add_argument("--instance-id", required=True)
    p.add_argument("--model", default=None, help="HF checkpoint directory or hub name (default: the tiny model)")
    p.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    p.add_argument("--output", type=Path, required=True)
    p.add_argument("--max-turns", type=int, default=AgentConfig.max_turns)
    p.add_argument("--max-tokens", type=int, default=AgentConfig.max_tokens)
    p.add_argument("--max-new-tokens", type=int, default=AgentConfig.max_new_tokens, help="per assistant turn")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run-id", default=None)
    args = p.parse_args(argv)
    from transformers import AutoTokenizer

    model = args.model or str(build_tiny_model(DEFAULT_DIR))
    try:
        task = load_tasks(args.dataset, instance_ids=[args.instance_id])[0]
        pool = SandboxPool(args.run_id or f"rollout-{uuid.uuid4().hex[:8]}", max_live=1)
    except (DatasetError, SandboxError) as e:
        console.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True)
        return 2
    engine = make_engine(args.engine, model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    config = AgentConfig(max_turns=args.max_turns, max_tokens=args.max_tokens, max_new_tokens=args.max_new_tokens,
                         temperature=args.temperature)
    traj = rollout_and_grade(Agent(engine, tokenizer, config), task, make_env("swe"), pool, seed=args.seed)
    traj.info.update(model=model, engine=args.engine)
    path = traj.save(args.output)
    console.print(
        f"{task.instance_id}: exit {traj.exit_reason}, {traj.turns} turns, {traj.num_tokens} tokens "
        f"({traj.num_sampled} sampled), reward {traj.reward:g} -> {path}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
