"""The agents a run can use, by name (`agent=<name>`, `conf/agent/<name>.yaml`; `--agent` in the
evaluations): each takes the engine, the tokenizer and the shared `AgentConfig` (limits and
sampling), plus options of its own, and offers `run(task, env, sandbox, seed) -> Trajectory`.

    default    agent.loop.Agent: the project's own loop (its tools, its prompt)
    mini_swe   agent.mini_swe.MiniSweAgent: mini-swe-agent as it ships, through agent.endpoint
"""

from __future__ import annotations

import importlib

AGENTS = {
    "default": "agent.loop:Agent",
    "mini_swe": "agent.mini_swe:MiniSweAgent",
}


def agent_class(name_or_target: str):
    """The class `name` (a key of AGENTS) or `module.Class` / `module:Class` names."""
    target = AGENTS.get(name_or_target, name_or_target)
    module, sep, cls = target.partition(":")
    if not sep:
        module, _, cls = target.rpartition(".")
    try:
        return getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"agent {name_or_target!r}: cannot load {target} ({e}); known agents: {', '.join(AGENTS)}") from e


def make_agent(name: str, engine, tokenizer, config, **options):
    """An agent by name with the shared settings `config` (agent.loop.AgentConfig)."""
    return agent_class(name)(engine, tokenizer, config, **options)
