"""`agent=mini_swe`: mini-swe-agent (its package, its prompts, its config) as the agent.

Its `DefaultAgent` runs as it ships, with two parts put in its hands: its model is its own
`LitellmModel` pointed at the rollout endpoint (`agent.endpoint`: OpenAI chat completions in
front of the engine, recording every token under this rollout's key), and its environment runs
its bash actions in the project's sandbox (`SandboxEnvironment`, mini-swe-agent's Environment
protocol). The trajectory is the endpoint's record, token in and token out (`agent.recorder`).

What is graded is what mini-swe-agent submits (`echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT &&
cat patch.txt`, its protocol), as its own SWE-bench runner grades it: a rollout that stops
without submitting (step limit, format errors, time) is graded on an empty patch.

Limits come from the run's agent settings: `max_turns` is its `step_limit`, `wall_time_s` its
`wall_time_limit_seconds`, `max_format_errors` its `max_consecutive_format_errors`,
`command_timeout_s` the timeout of each action; `max_tokens` ends the rollout as `context_full`.
Its cost limit is off (a local model costs nothing).
"""

from __future__ import annotations

import copy
import os
import shlex
import time
from typing import Any

import yaml

from agent.endpoint import endpoint_for
from agent.engines.base import Engine
from agent.loop import AgentConfig, versioned
from agent.trajectory import Trajectory
from envs.base import Env, Task
from sandbox.base import Sandbox, SandboxError, SandboxKilled

# before minisweagent and litellm are imported: no banner, no cost map fetched from the network,
# no cost accounting for a local model, few retries against an endpoint on this machine
for _k, _v in {"MSWEA_SILENT_STARTUP": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
               "MSWEA_COST_TRACKING": "ignore_errors", "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "2"}.items():
    os.environ.setdefault(_k, _v)

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
EXITS = {"Submitted": "submitted", "LimitsExceeded": "max_turns", "TimeExceeded": "timeout",
                "RepeatedFormatError": "format_errors"}


def load_config(config: str | dict = "swebench") -> dict:
    """mini-swe-agent's config: a name it ships (swebench, swebench_xml, mini, ...), a yaml path,
    or the dict itself."""
    if isinstance(config, dict):
        return copy.deepcopy(config)
    from minisweagent.config import get_config_path

    return yaml.safe_load(get_config_path(config).read_text())


class SandboxEnvironment:
    """mini-swe-agent's Environment over the project's sandbox: each action a fresh `bash -c` in
    `cwd` with the config's environment variables, its output and exit code returned as
    mini-swe-agent's own environments return them; the submission marker raises `Submitted`.
    Sandbox faults are not the model's: they propagate (the rollout ends as `sandbox_error`)."""

    def __init__(self, sandbox: Sandbox, cwd: str, timeout: float, env: dict[str, str] | None = None):
        from pydantic import BaseModel

        class Config(BaseModel):
            cwd: str
            timeout: float
            env: dict[str, str] = {}

        self.sandbox = sandbox
        self.config = Config(cwd=cwd, timeout=timeout, env=env or {})
        self.tools_s = 0.0

    def execute(self, action: dict, cwd: str = "", *, timeout: float | None = None) -> dict[str, Any]:
        from minisweagent.exceptions import Submitted

        command = action.get("command", "") if isinstance(action, dict) else str(action)
        exports = "".join(f"export {k}={shlex.quote(str(v))}; " for k, v in self.config.env.items())
        limit = timeout or self.config.timeout
        t0 = time.monotonic()
        try:
            r = self.sandbox.exec(exports + command, timeout=limit, workdir=cwd or self.config.cwd)
        finally:
            self.tools_s += time.monotonic() - t0
        output = {"output": r.output, "returncode": r.exit_code, "exception_info": ""}
        if r.timed_out:
            output.update(returncode=-1, exception_info=f"The command timed out after {limit:g} seconds")
        lines = r.output.lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and r.exit_code == 0:
            submission = "".join(lines[1:])
            raise Submitted({"role": "exit", "content": submission,
                             "extra": {"exit_status": "Submitted", "submission": submission}})
        return output

    def get_template_vars(self, **kwargs) -> dict[str, Any]:
        return {**self.config.model_dump(), **kwargs}

    def serialize(self) -> dict:
        return {"info": {"config": {"environment": self.config.model_dump(mode="json"),
                                    "environment_type": f"{type(self).__module__}.{type(self).__name__}"}}}


class MiniSweAgent:
    """The `Agent` interface (`run(task, env, sandbox, seed) -> Trajectory`, `.engine`) with
    mini-swe-agent inside. `config`: mini-swe-agent's config (name, path or dict; its `agent` and
    `model` sections are used, its `environment` section's `env` too)."""

    bash_only = True  # no env tools: an env answered with its own (prefer's `answer`) is refused by the config check

    def __init__(self, engine: Engine, tokenizer, config: AgentConfig = AgentConfig(), mini_config: str | dict = "swebench"):
        self.engine, self.tokenizer, self.config = engine, tokenizer, config
        self.mini = load_config(mini_config)
        if config.latency_alpha:
            raise ValueError("agent.latency_alpha: the simulated tool latency is the default agent's; "
                             "mini_swe runs mini-swe-agent's own loop (set it to null)")

    def run(self, task: Task, env: Env, sandbox: Sandbox, seed: int | None = None) -> Trajectory:
        import litellm
        from minisweagent.agents.default import DefaultAgent
        from minisweagent.models.litellm_model import LitellmModel

        litellm.suppress_debug_info = True  # its "Provider List" banner on every cost lookup of a local model

        cfg = self.config
        endpoint = endpoint_for(self.engine, self.tokenizer, cfg.family)
        start = time.monotonic()
        with endpoint.rollout(instance_id=task.instance_id, max_tokens=cfg.max_tokens,
                              max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                              seed=seed) as rec:
            exit_reason, info, reset_s, shell = "", {}, 0.0, None
            try:
                t0 = time.monotonic()
                env.reset(task, sandbox, **versioned(env, self.engine))  # the workspace (its prompt is mini-swe-agent's)
                reset_s = time.monotonic() - t0
                if hasattr(sandbox, "drop_privileges"):
                    sandbox.drop_privileges()
                shell = SandboxEnvironment(sandbox, sandbox.workdir, cfg.command_timeout_s,
                                           (self.mini.get("environment") or {}).get("env"))
                model_cfg = {**(self.mini.get("model") or {}), "model_name": "openai/policy", "cost_tracking": "ignore_errors"}
                model_cfg["model_kwargs"] = {**(model_cfg.get("model_kwargs") or {}), "api_base": endpoint.url,
                                             "api_key": rec.key, "drop_params": True, "max_tokens": cfg.max_new_tokens}
                agent_cfg = {**(self.mini.get("agent") or {}), "step_limit": cfg.max_turns, "cost_limit": 0,
                             "wall_time_limit_seconds": int(cfg.wall_time_s), "max_consecutive_format_errors": cfg.max_format_errors}
                agent_cfg.pop("output_path", None)
                mini = DefaultAgent(LitellmModel(**model_cfg), shell, **agent_cfg)
                try:
                    result = mini.run(task.problem_statement)
                    status = result.get("exit_status", "")
                    exit_reason = EXITS.get(status, "")
                    if status == "Submitted":
                        info["submission"] = result.get("submission", "")
                    elif not exit_reason:
                        info["exit_detail"] = status
                finally:
                    info["scaffold_messages"] = len(mini.messages)
            except SandboxKilled as e:
                exit_reason, info["error"] = "sandbox_killed", str(e)
            except SandboxError as e:
                exit_reason, info["error"] = "sandbox_error", str(e)
            except Exception as e:  # the endpoint refused the context, or the scaffold stopped
                if rec.context_full:
                    exit_reason = "context_full"
                else:
                    raise RuntimeError(f"mini-swe-agent stopped on {task.instance_id}: {type(e).__name__}: {e}") from e
        traj = rec.finish()
        traj.exit_reason = exit_reason or ("context_full" if rec.context_full else "max_turns")
        traj.info.update(info, agent="mini_swe")
        if traj.exit_reason in ("max_turns", "timeout", "format_errors", "context_full"):
            traj.info.setdefault("submission", "")  # mini-swe-agent's runner grades no submission as an empty patch
        traj.timings.update(reset=reset_s, tools=shell.tools_s if shell else 0.0, total=time.monotonic() - start)
        return traj
