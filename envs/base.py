"""`Task`, the `Env` protocol (and `EnvBase`, its defaults), grading results, and the env registry.

`Task` maps the SWE-bench instance schema one to one (the v5 fields `image`, `eval_script`,
`log_parser`, `eval_type` included) and adds what a task made from a local repository needs.
"""

from __future__ import annotations

import importlib
import json
import random
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Protocol

from sandbox.base import Sandbox


@dataclass
class Task:
    instance_id: str
    repo: str  # "owner/name" for SWE-bench rows, or a local git repository path
    base_commit: str
    problem_statement: str
    patch: str = ""  # the gold patch
    test_patch: str = ""
    FAIL_TO_PASS: list[str] = field(default_factory=list)
    PASS_TO_PASS: list[str] = field(default_factory=list)
    version: str = ""
    environment_setup_commit: str = ""
    hints_text: str = ""
    created_at: str = ""
    # -- beyond the v4 schema --
    image: str | None = None  # None: the sandbox base image
    test_cmd: str | None = None  # None: pytest -rA over the files named in the test lists
    log_parser: str = "parse_log_pytest"  # a key of swebench's PARSER_REGISTRY
    eval_script: str | None = None  # swebench v5: a whole eval.sh (applies test_patch itself)
    eval_type: str = "pass_and_fail"  # swebench's, or "expected_exact" / "expected_passed" (R2E-style)
    # -- what a dataset family's own harness does (taskdata/*.py) --
    layout: str = "swe-bench"  # the family whose harness lays out, runs and grades the task
    # None: the workspace is the image's repository (or `repo`) checked out at base_commit. Else
    # bash run in the workspace at reset that puts the task in place (a branch checked out,
    # tests hidden); the tree it leaves is the task's start, which the patch is taken against.
    setup_script: str | None = None
    expected_output: dict[str, str] = field(default_factory=dict)  # R2E-style: test -> expected status
    repo_path: str | None = None  # `repo` resolved to an absolute local path, when it is one
    extra: dict[str, Any] = field(default_factory=dict)  # other columns, kept for round trips

    @property
    def test_files(self) -> list[str]:
        """Files named by FAIL_TO_PASS / PASS_TO_PASS ids (`path::test`), in order."""
        seen: dict[str, None] = {}
        for test in self.FAIL_TO_PASS + self.PASS_TO_PASS:
            path = test.split("::", 1)[0]
            if path.endswith(".py"):
                seen.setdefault(path, None)
        return list(seen)

    def to_row(self) -> dict[str, Any]:
        """The SWE-bench-format row (test lists as JSON strings, as the hub datasets have them)."""
        row = {k: v for k, v in asdict(self).items() if k not in ("extra", "repo_path", "expected_output")}
        if self.expected_output:
            row["expected_output_json"] = json.dumps(self.expected_output)
        row["FAIL_TO_PASS"] = json.dumps(self.FAIL_TO_PASS)
        row["PASS_TO_PASS"] = json.dumps(self.PASS_TO_PASS)
        row.update(self.extra)
        return {k: v for k, v in row.items() if v is not None}


@dataclass
class GradeResult:
    """The outcome of grading one patch. `reward` is 1.0 exactly when `resolved`."""

    instance_id: str
    resolved: bool
    patch_applied: bool
    tests_status: dict[str, str] = field(default_factory=dict)  # test id -> PASSED / FAILED / ...
    report: dict[str, Any] = field(default_factory=dict)  # swebench's get_eval_report entry
    log: str = ""
    error: str | None = None  # why grading could not judge the patch (timeout, apply failure...)
    timed_out: bool = False
    empty_patch: bool = False
    test_edits: list[str] = field(default_factory=list)  # test infrastructure the patch edits unasked
    duration_s: float = 0.0
    # the canary tests (envs/canary.py): "ok", "unsupported (...)" for a runner or parser that
    # cannot take them, "" where the env has none; `tampered` says what the log showed instead
    # of the canaries' pass and fail (the grade is then unresolved, whatever else it claims)
    canary: str = ""
    tampered: str | None = None

    @property
    def reward(self) -> float:
        return 1.0 if self.resolved and not self.tampered else 0.0


ANSWER_FILE = "/testbed/.answer"  # where the agent's `answer` tool puts its value, for the env's grader


class Env(Protocol):
    """A task family. `reset` lays out the workspace and returns the prompt; `grade` judges it.
    Everything below `grade` is optional: `EnvBase` gives each its default, and the agent and
    the rollout read them as declared here (never by probing)."""

    name: str
    tools: tuple[str, ...] | None  # the agent's tools for this env (agent/tools.yaml); None: bash, editor, submit
    system_prompt: str | None  # None: the agent's own system prompt
    versioned: bool  # reset and grade take `version=` (the engine's policy version): a rule that changes in training
    grades_patch: bool  # grade the workspace's diff (`patch_of`) in a fresh sandbox, as SWE-bench does; else in place

    def image_for(self, task: Task) -> str: ...

    def reset(self, task: Task, sandbox: Sandbox) -> str: ...

    def grade(self, task: Task, sandbox: Sandbox, patch: str | None = None) -> GradeResult: ...

    def tool_handlers(self, task: Task, sandbox: Sandbox) -> dict[str, Callable[..., Any]] | None:
        """Tools this env answers itself (a game's move, a notebook cell), by name; None: none."""

    def patch_of(self, task: Task, sandbox: Sandbox) -> str:
        """The workspace's change, as a patch (only where `grades_patch`)."""

    def demonstrations(self, n: int, rng: random.Random, seed: int, **options: Any) -> list[list[dict]]:
        """`n` worked conversations (after the system prompt) for an SFT warm start."""


class EnvBase:
    """The defaults of `Env`'s optional parts; an env subclasses it and sets what it needs."""

    name: str = ""
    tools: tuple[str, ...] | None = None
    system_prompt: str | None = None
    versioned: bool = False
    grades_patch: bool = False

    def tool_handlers(self, task: Task, sandbox: Sandbox) -> dict[str, Callable[..., Any]] | None:
        return None

    def patch_of(self, task: Task, sandbox: Sandbox) -> str:
        raise NotImplementedError(f"env {self.name!r} grades in place: it has no patch to take")

    def demonstrations(self, n: int, rng: random.Random, seed: int, **options: Any) -> list[list[dict]]:
        raise NotImplementedError(f"env {self.name!r} has no demonstrations to warm start on")


def call_message(name: str, **arguments: Any) -> dict:
    """An assistant turn that is one tool call, as a demonstration for an env's SFT writes it."""
    return {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": name, "arguments": arguments}}]}


_REGISTRY: dict[str, Callable[..., Env]] = {}


def register_env(name: str):
    """Class decorator: make an env constructible by name (`make_env(name, **cfg)`)."""

    def wrap(cls):
        _REGISTRY[name] = cls
        cls.name = name
        return cls

    return wrap


def make_env(name: str, **cfg) -> Env:
    """Build a registered env; `envs.<name>` is imported first if nothing registered it yet."""
    if name not in _REGISTRY:
        try:
            importlib.import_module(f"envs.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"envs.{name}":
                raise
    if name not in _REGISTRY:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise KeyError(f"no env named {name!r} (registered: {known}); add envs/{name}.py with @register_env")
    return _REGISTRY[name](**cfg)


def registered_envs() -> list[str]:
    return sorted(_REGISTRY)
