"""Fuzzed model output: 10,000 random and adversarial completions (broken JSON, huge and 1 MB
arguments, unknown tools, nested and unclosed tags, invalid UTF-8, special tokens) through the
parser and the tools' argument checks, and a sample of them, as token ids, through the whole
loop on a real sandbox. Nothing may crash: every completion is answered with an error
observation, a tool's output, or a clean exit reason."""

import json
import random

import pytest
from transformers import AutoTokenizer

from agent.chat import parse_tool_calls
from agent.engines.base import Completion
from agent.loop import Agent, AgentConfig
from agent.tiny_model import build_tiny_model
from agent.tools import DEFAULT_TOOLS, SPEC_FILE, ToolError, check_arguments, load_definitions
from agent.trajectory import EXIT_REASONS
from envs.arith import ArithEnv, make_arith_tasks

TOOLS = ["bash", "str_replace_editor", "submit", "answer", "nope", "", "BASH", "bash ", "str_replace_editor\x00"]
SPECIAL = ["<|im_end|>", "<|endoftext|>", "<|im_start|>assistant", "<tool_call>", "</tool_call>", "<think>", "\x00",
           "\ud800", "\udcff", "\ufffd", "\u202e"]


def _value(rng: random.Random):
    kind = rng.randrange(9)
    if kind == 0:
        return "x" * rng.choice([0, 1, 10_000, 1_000_000 if rng.random() < 0.01 else 100])
    if kind == 1:
        return rng.choice([None, True, -1, 0, 1e308, float("nan"), 2**70])
    if kind == 2:
        return [rng.randrange(-5, 5) for _ in range(rng.randrange(4))]
    if kind == 3:
        return {"nested": {"deeper": [1, {"x": "y"}]}}
    if kind == 4:
        return rng.choice(SPECIAL) * rng.randrange(1, 4)
    if kind == 5:
        return rng.choice(["view", "create", "str_replace", "insert", "undo_edit", "rm -rf /", "../../etc/passwd"])
    return "".join(chr(rng.randrange(1, 0x2FFF)) for _ in range(rng.randrange(20)))


def _call(rng: random.Random) -> str:
    args = {rng.choice(["command", "path", "file_text", "old_str", "new_str", "insert_line", "view_range", "timeout",
                        "value", "x"]): _value(rng) for _ in range(rng.randrange(4))}
    body = json.dumps({"name": rng.choice(TOOLS), "arguments": args}, allow_nan=True)
    if rng.random() < 0.3:  # broken JSON: cut, doubled braces, stray quotes
        cut = rng.randrange(len(body) + 1)
        body = rng.choice([body[:cut], body + "}", '"' + body, body.replace(":", "", 1), "{" + body])
    if rng.random() < 0.1:
        body = json.dumps({"name": "bash", "arguments": json.dumps(args)})  # double-encoded arguments
    opening, closing = "<tool_call>", rng.choice(["</tool_call>", "", "<tool_call>", "</tool_call></tool_call>"])
    return f"{opening}\n{body}\n{closing}"


def completion(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randrange(1, 5)):
        kind = rng.randrange(5)
        parts.append(_call(rng) if kind < 2 else rng.choice(SPECIAL) if kind == 2 else
                     "<tool_call><tool_call>" + _call(rng) if kind == 3 else _value(rng) if isinstance(_value(rng), str) else "text")
    return "".join(p if isinstance(p, str) else str(p) for p in parts)


def tool_schemas() -> dict:
    """Each tool's argument schema, as the tool box checks arguments against it."""
    defs = load_definitions(SPEC_FILE, DEFAULT_TOOLS + ("answer",), default_timeout_s=60.0, max_timeout_s=600.0)
    return {d["function"]["name"]: d["function"]["parameters"] for d in defs}


def test_ten_thousand_completions_through_the_parser_and_the_argument_checks():
    rng = random.Random(20261203)
    schemas = tool_schemas()
    outcomes = {"error": 0, "calls": 0, "no_call": 0, "bad_args": 0, "unknown_tool": 0}
    for _ in range(10_000):
        parsed = parse_tool_calls(completion(rng))
        assert parsed.error is None or (isinstance(parsed.error, str) and parsed.error and not parsed.calls)
        if parsed.error:
            outcomes["error"] += 1
            continue
        outcomes["calls" if parsed.calls else "no_call"] += 1
        for call in parsed.calls:
            if call.name not in schemas:
                outcomes["unknown_tool"] += 1
                continue
            try:
                check_arguments(schemas[call.name], call.arguments)
            except ToolError as e:
                assert str(e)
                outcomes["bad_args"] += 1
    assert all(outcomes.values()), outcomes  # every kind of outcome was reached


class TokenEngine:
    """Replays random token ids, special tokens and byte pieces included (a unit-test stand-in)."""

    def __init__(self, tokenizer, rng):
        self.tok, self.rng, self.version = tokenizer, rng, 0

    def generate(self, prompt_ids, sampling):
        n = self.rng.randrange(1, min(sampling.max_new_tokens, 200))
        if self.rng.random() < 0.5:  # a fuzzed completion, as the tokenizer would have made it
            ids = self.tok.encode(completion(self.rng).encode("utf-8", "replace").decode("utf-8", "replace"),
                                  add_special_tokens=False)[: sampling.max_new_tokens]
        else:
            ids = [self.rng.randrange(len(self.tok)) for _ in range(n)]
        ids = ids or [self.tok.eos_token_id]
        return Completion(ids, [-1.0] * len(ids), self.rng.choice(["stop", "length"]))

    def update_weights(self, named_tensors, version):
        self.version = version


@pytest.mark.docker
def test_a_sample_through_the_whole_loop_on_a_real_sandbox(make_sandbox, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path / "m"))
    rng = random.Random(7)
    env, sb = ArithEnv(), make_sandbox()
    config = AgentConfig(max_turns=4, max_tokens=4096, max_new_tokens=256, command_timeout_s=5)
    reasons, turns = [], 0
    for task in make_arith_tasks(n=30, seed=1):
        traj = Agent(TokenEngine(tokenizer, rng), tokenizer, config).run(task, env, sb)
        assert traj.exit_reason in EXIT_REASONS and traj.exit_reason != "sandbox_error", traj.info
        traj.check()
        reasons.append(traj.exit_reason)
        turns += traj.turns
    assert turns >= 60 and sb.exec("echo alive", timeout=30).ok
    assert len(set(reasons)) >= 2, reasons
