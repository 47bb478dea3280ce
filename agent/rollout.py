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


class _SandboxInThread:
    """A sandbox from the pool made ready in a thread of its own (created from `image`, then
    `ready(sandbox)` run on it), so the rollout can go on meanwhile; `get()` waits for it.
    `release()` removes it in the background: the rollout does not wait for the removal, and
    the pool's slot stays held until the container is gone (the pool's close sweeps any left)."""

    def __init__(self, pool: SandboxPool, image: str, ready=None, name: str = "sandbox",
                 after: "_SandboxInThread | None" = None):
        """`after`: ask the pool only once that one has its sandbox (a rollout's grading sandbox
        after the rollout's own: with fewer pool slots than two a rollout, the other order could
        leave every slot to grading sandboxes whose rollouts wait for one)."""
        self._after = after
        self._stack = contextlib.ExitStack()
        self._sandbox = None
        self._error: BaseException | None = None
        self.start_s = 0.0  # waiting for a pool slot, and the container's start (and `ready`)
        self._thread = threading.Thread(target=self._prepare, args=(pool, image, ready), daemon=True, name=name)
        self._thread.start()

    def _prepare(self, pool: SandboxPool, image: str, ready) -> None:
        if self._after is not None:
            self._after._thread.join()
        t0 = time.monotonic()
        try:
            sandbox = self._stack.enter_context(pool.sandbox(image))
            if ready is not None:
                ready(sandbox)
            self._sandbox = sandbox
        except BaseException as e:  # said when the sandbox is asked for
            self._error = e
        finally:
            self.start_s = time.monotonic() - t0

    def get(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._sandbox

    def close(self) -> None:
        """Remove it now (waiting for its start first, if it is still starting)."""
        self._thread.join()
        self._stack.close()

    def release(self) -> None:
        threading.Thread(target=self.close, daemon=True, name="sandbox-removal").start()


class _Waiting:
    """The rollout's sandbox while it starts: every use waits for it, so an env whose reset needs
    none (the answer envs: `prefer`, `arith`) generates its first turn meanwhile and waits only at
    its first tool call; an env that sets up its workspace in reset (SWE) waits there, as before.
    `drop_privileges` is applied when the sandbox is first reached. `blocked_s`: the time spent
    waiting for it."""

    def __init__(self, held: _SandboxInThread):
        self._held = held
        self._drop = False
        self._lock = threading.Lock()
        self.blocked_s = 0.0

    def _get(self):
        with self._lock:
            t0 = time.monotonic()
            sandbox = self._held.get()
            if self._drop:
                self._drop = False
                sandbox.drop_privileges()
            self.blocked_s += time.monotonic() - t0
        return sandbox

    def drop_privileges(self) -> None:
        self._drop = True

    def __getattr__(self, name: str):
        return getattr(self._get(), name)


def rollout_and_grade(agent: Agent, task: Task, env: Env, pool: SandboxPool, seed: int | None = None,
                      prepare_grading: bool = True) -> Trajectory:
    """One rollout in a fresh sandbox, graded; every sandbox is removed however it ends.

    The rollout's sandbox starts in a thread the moment the rollout begins, and the agent waits
    for it only where it first needs it (`_Waiting`); it is removed in the background once the
    rollout is done with it. An env that grades a patch (`env.grades_patch`, the SWE env) is
    graded as SWE-bench's harness grades: the workspace's diff is taken, and the tests run in
    another fresh sandbox from the task's image with only that patch applied, so nothing the
    agent did outside the repository (a shadowed test runner, a daemon it left) touches grading.
    That sandbox is made ready while the rollout runs (`prepare_grading`; one more container
    per rollout, idle until grading). Other envs grade in place.
    """
    image = env.image_for(task)
    grading = None
    start = time.monotonic()
    held = _SandboxInThread(pool, image, name=f"sandbox-{task.instance_id}")
    sb = _Waiting(held)
    try:
        if env.grades_patch and prepare_grading:  # made ready beside the rollout's own
            kw = versioned(env, agent.engine)  # (the engine's version as the rollout starts)
            grading = _SandboxInThread(pool, image, lambda clean: env.reset(task, clean, **kw),
                                       name=f"grading-sandbox-{task.instance_id}", after=held)
        own = held
        traj = agent.run(task, env, sb, seed=seed)
        if traj.exit_reason == "sandbox_error":
            return traj
        if traj.exit_reason == "sandbox_killed":  # nothing left to grade: the policy stopped its sandbox
            traj.reward = 0.0
            return traj
        t0 = time.monotonic()
        if not env.grades_patch:  # (a versioned env grades by the engine's version now, envs/online.py)
            result = env.grade(task, sb, **versioned(env, agent.engine))
        else:
            # what the agent submitted, where its scaffold submits a patch (agent.mini_swe), else the workspace's diff
            patch = traj.info["submission"] if "submission" in traj.info else env.patch_of(task, sb)
            held.release()  # the rollout's sandbox goes (its pool slot free once it is gone) before this waits
            held = None
            if grading is not None:
                result = env.grade(task, grading.get(), patch, **versioned(env, agent.engine))
            else:
                with pool.sandbox(image) as clean:
                    env.reset(task, clean, **versioned(env, agent.engine))
                    result = env.grade(task, clean, patch, **versioned(env, agent.engine))
        traj.timings["grade"] = time.monotonic() - t0
        # (the sandbox's start is over by now: grading or the patch needed it)
        traj.timings.update(sandbox=own.start_s, sandbox_blocked=sb.blocked_s)
    finally:
        if held is not None:
            held.release()
        if grading is not None:
            grading.release()
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
