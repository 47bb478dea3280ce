"""The agent loop: render, generate, parse, execute, append the tool output as masked tokens.

Token in, token out: the ids the engine sampled are kept exactly, with its logprob of each
and the policy version that sampled them; a tool's observation is appended as the chat
template's own tokens with loss mask 0; the history is never re-tokenised. How a rollout ends
is one of `EXIT_REASONS`; control flow at those edges is a few exceptions.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from agent.chat import ChatRenderer
from agent.engines.base import Engine, SamplingParams, session
from agent.tools import DEFAULT_TOOLS, ToolBox
from agent.trajectory import Trajectory
from envs.base import Env, Task
from sandbox.base import Sandbox, SandboxError, SandboxKilled

# the wall-time limit's clock (a test sets its own: a loaded machine would make real time flaky)
clock = time.monotonic

PROMPTS = Path(__file__).parent / "prompts"


@dataclass
class AgentConfig:
    max_turns: int = 30
    max_tokens: int = 16384  # the whole context: prompt, samples and observations
    max_new_tokens: int = 1024  # one assistant turn
    command_timeout_s: float = 60.0
    wall_time_s: float = 1800.0
    max_format_errors: int = 3  # consecutive
    max_observation_bytes: int = 16_000
    temperature: float = 1.0
    top_p: float = 1.0
    family: str = "hermes"
    # long-tail tool latency (any env): each rollout, after its first turn's tool calls, spends a
    # Pareto(latency_alpha) draw of seconds (at least latency_scale_s, at most latency_max_s) as a
    # real `sleep` in its sandbox, seeded by the rollout; None: off. alpha 1.5: mean 3 x scale
    latency_alpha: float | None = None
    latency_scale_s: float = 0.5
    latency_max_s: float = 120.0
    system_prompt: str = field(default_factory=lambda: (PROMPTS / "system.txt").read_text())
    format_error_prompt: str = field(default_factory=lambda: (PROMPTS / "format_error.txt").read_text())


class RolloutExit(Exception):
    """The rollout is over; `reason` is one of trajectory.EXIT_REASONS."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class Agent:
    def __init__(self, engine: Engine, tokenizer, config: AgentConfig = AgentConfig()):
        self.engine = engine
        self.tokenizer = tokenizer
        self.config = config
        self.eos_id = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)

    def run(self, task: Task, env: Env, sandbox: Sandbox, seed: int | None = None) -> Trajectory:
        """One rollout of `task` in `sandbox` (already created; the caller closes it). Its turns
        are one engine session: a router keeps them on one replica (its prefix cache)."""
        with session():
            return self._run(task, env, sandbox, seed)

    def _run(self, task: Task, env: Env, sandbox: Sandbox, seed: int | None) -> Trajectory:
        cfg = self.config
        start = clock()
        timings = {"generate": 0.0, "tools": 0.0}
        # an env may name its own tools and system prompt (a small verifiable env, say)
        handlers = env.tool_handlers(task, sandbox)
        tools = ToolBox(sandbox, tools=env.tools or DEFAULT_TOOLS, default_timeout_s=cfg.command_timeout_s,
                        max_output_bytes=cfg.max_observation_bytes, handlers=handlers)
        chat = ChatRenderer(self.tokenizer, tools.definitions, cfg.family)
        messages = [{"role": "system", "content": env.system_prompt or cfg.system_prompt}]
        try:
            t0 = time.monotonic()
            messages.append({"role": "user", "content": env.reset(task, sandbox, **versioned(env, self.engine))})
            timings["reset"] = time.monotonic() - t0
            if hasattr(sandbox, "drop_privileges"):  # the model's commands as `sandbox.user`, when set
                sandbox.drop_privileges()
        except SandboxError as e:
            traj = Trajectory(task.instance_id, prompt_ids=[], messages=messages, exit_reason="sandbox_error")
            traj.info["error"] = str(e)
            return traj
        traj = Trajectory(task.instance_id, prompt_ids=chat.prompt_ids(messages), messages=messages)
        format_errors = 0
        try:
            for turn in range(cfg.max_turns):
                if clock() - start > cfg.wall_time_s:
                    raise RolloutExit("timeout", f"wall time {cfg.wall_time_s:g}s")
                budget = cfg.max_tokens - traj.num_tokens
                if budget <= 0:
                    raise RolloutExit("context_full")
                version = self.engine.version
                t0 = time.monotonic()
                sampling = SamplingParams(min(cfg.max_new_tokens, budget), cfg.temperature, cfg.top_p,
                                          (self.eos_id,), None if seed is None else seed + turn)
                completion = self.engine.generate(traj.prompt_ids + traj.completion_ids, sampling)
                timings["generate"] += time.monotonic() - t0
                traj.append_sampled(completion.token_ids, completion.logprobs, completion.versions or version)
                traj.turns = turn + 1
                ended = bool(completion.token_ids) and completion.token_ids[-1] == self.eos_id
                text = chat.decode(completion.token_ids[:-1] if ended else completion.token_ids)
                parsed = chat.parse(text)
                messages.append({"role": "assistant", "content": parsed.content, "raw": text, "tool_calls": [
                    {"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in parsed.calls
                ]})
                if not ended and traj.num_tokens >= cfg.max_tokens:
                    raise RolloutExit("context_full")
                observations, submitted = self._act(parsed, tools, timings)
                if turn == 0 and cfg.latency_alpha:
                    traj.info["latency_s"] = self._long_tail(sandbox, seed, timings)
                if parsed.error or not parsed.calls:
                    format_errors += 1
                    if format_errors >= cfg.max_format_errors:
                        raise RolloutExit("format_errors", parsed.error or "no tool call")
                else:
                    format_errors = 0
                if submitted:
                    raise RolloutExit("submitted")
                history = [_template_view(m) for m in messages]
                traj.append_observation(chat.observation_ids(history, observations, ended))
                messages.extend(observations)
            raise RolloutExit("max_turns")
        except RolloutExit as e:
            traj.exit_reason = e.reason
            if e.detail:
                traj.info["exit_detail"] = e.detail
        except SandboxKilled as e:  # before SandboxError, its base
            traj.exit_reason = "sandbox_killed"
            traj.info["error"] = str(e)
        except SandboxError as e:
            traj.exit_reason = "sandbox_error"
            traj.info["error"] = str(e)
        timings["total"] = time.monotonic() - start
        traj.timings = timings
        return traj

    def _long_tail(self, sandbox: Sandbox, seed: int | None, timings: dict) -> float:
        """Sleep a heavy-tailed draw of seconds in the sandbox (`AgentConfig.latency_alpha`)."""
        cfg = self.config
        u = random.Random(seed).random()
        seconds = min(cfg.latency_scale_s * (1.0 - u) ** (-1.0 / cfg.latency_alpha), cfg.latency_max_s)
        t0 = time.monotonic()
        sandbox.exec(f"sleep {seconds:.3f}", timeout=seconds + 30)
        timings["tools"] += time.monotonic() - t0
        return seconds

    def _act(self, parsed, tools: ToolBox, timings: dict) -> tuple[list[dict], bool]:
        """Run the turn's calls; returns the tool messages and whether `submit` was called."""
        if parsed.error or not parsed.calls:
            error = parsed.error or "the reply had no tool call"
            return [{"role": "tool", "name": "error", "content": self.config.format_error_prompt.format(error=error)}], False
        out = []
        t0 = time.monotonic()
        for call in parsed.calls:
            result = tools.run(call.name, call.arguments)
            out.append({"role": "tool", "name": call.name, "content": result.output})
            if result.submitted:
                timings["tools"] += time.monotonic() - t0
                return out, True
        timings["tools"] += time.monotonic() - t0
        return out, False


def versioned(env: Env, engine: Engine) -> dict:
    """`{"version": engine.version}` for an env that asks for the policy version (`Env.versioned`:
    one whose rule changes as training goes on, envs/online.py),
    else nothing. The engine's version is that of the weights it samples with: the learner's
    policy updates it has been given (under `trainer.engine_lag=k`, those of k versions ago)."""
    return {"version": engine.version} if env.versioned else {}


def _template_view(message: dict) -> dict:
    """A message as the chat template reads it (without the human-only `raw` field)."""
    return {k: v for k, v in message.items() if k != "raw"}
