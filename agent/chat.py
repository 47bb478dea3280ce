"""Tool-call parsing of a model's output text, one parser per model family.

Contract of every parser: `parse(text) -> ParseResult`, and it never raises, whatever the
text (the model's mistakes are part of training: a malformed call is answered with `error`,
a message for the model, not a crash). A turn is all-or-nothing: when any call in it is
malformed, `error` is set and `calls` is empty, so a half-understood turn never runs.

Families are looked up in `PARSERS`; adding one (say Qwen3-Coder's XML form) is one function
and one entry. Chat-template rendering is not here; this module only reads output.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class ToolCall:
    """One call: the tool's name and its arguments as a JSON object."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ParseResult:
    """What one assistant turn said.

    content: the text outside the tool-call blocks, each piece stripped, joined by newlines.
    calls:   the calls in the order written; empty whenever `error` is set.
    error:   None, or a non-empty message for the model saying which call was wrong and why.
    """

    content: str
    calls: list[ToolCall] = field(default_factory=list)
    error: str | None = None


# -- Hermes / Qwen2.5 / Qwen3: <tool_call>{"name": ..., "arguments": {...}}</tool_call> ----------
OPEN, CLOSE = "<tool_call>", "</tool_call>"
HERMES_FORMAT = f'{OPEN}\n{{"name": "TOOL_NAME", "arguments": {{"ARG": "VALUE"}}}}\n{CLOSE}'
_decoder = json.JSONDecoder()


def parse_hermes(text: str) -> ParseResult:
    """Parse Hermes-style calls: JSON objects between `<tool_call>` and `</tool_call>`.

    `arguments` may be an object or a string holding one (some templates double-encode);
    a missing or empty `arguments` means no arguments. Other keys of the call are ignored.
    """
    if not isinstance(text, str):
        return ParseResult("", [], f"expected the model's output as text, got {type(text).__name__}")
    content: list[str] = []
    calls: list[ToolCall] = []
    errors: list[str] = []
    pos = blocks = 0
    while pos <= len(text):
        start, stray = text.find(OPEN, pos), text.find(CLOSE, pos)
        if stray != -1 and (start == -1 or stray < start):
            content.append(text[pos:stray])
            errors.append(f"found {CLOSE} with no {OPEN} before it")
            pos = stray + len(CLOSE)
            continue
        if start == -1:
            content.append(text[pos:])
            break
        content.append(text[pos:start])
        blocks += 1
        call, pos, problem = _parse_block(text, start + len(OPEN))
        if problem:
            errors.append(f"tool call {blocks}: {problem}")
        else:
            calls.append(call)
    # joined by newlines so that pieces around a block can never join into a tag
    joined = "\n".join(p.strip() for p in content if p.strip())
    if errors:
        message = "; ".join(errors) + f". Nothing was run. Write each call as\n{HERMES_FORMAT}"
        return ParseResult(joined, [], message)
    return ParseResult(joined, calls, None)


def _parse_block(text: str, body: int) -> tuple[ToolCall | None, int, str | None]:
    """Parse the call whose body starts at `body`: (call, index after the block, problem).

    The JSON is decoded first and the closing tag looked for after it, so a tag written
    inside a JSON string (a file that mentions `</tool_call>`) does not end the block.
    """
    i = _skip_space(text, body)
    try:
        obj, end = _decoder.raw_decode(text, i)
    except (ValueError, RecursionError) as e:  # RecursionError: absurdly deep nesting
        close = text.find(CLOSE, body)
        if close == -1:
            return None, len(text) + 1, f"{OPEN} is never closed with {CLOSE}"
        reason = e.msg if isinstance(e, json.JSONDecodeError) else str(e) or type(e).__name__
        return None, close + len(CLOSE), f"the text between the tags is not valid JSON ({reason})"
    after = _skip_space(text, end)
    if not text.startswith(CLOSE, after):
        close = text.find(CLOSE, after)
        if close == -1:
            return None, len(text) + 1, f"{OPEN} is never closed with {CLOSE}"
        return None, close + len(CLOSE), f"unexpected text after the JSON object, before {CLOSE}"
    end = after + len(CLOSE)
    if not isinstance(obj, dict):
        return None, end, f'expected a JSON object with "name" and "arguments", got {_json_type(obj)}'
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return None, end, '"name" must be a non-empty string naming the tool'
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):
            return None, end, f'"arguments" of {name!r} is a string that is not valid JSON'
    if not isinstance(args, dict):
        return None, end, f'"arguments" of {name!r} must be a JSON object, got {_json_type(args)}'
    return ToolCall(name.strip(), args), end, None


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


Parser = Callable[[str], ParseResult]
PARSERS: dict[str, Parser] = {"hermes": parse_hermes}


def get_parser(family: str) -> Parser:
    """The parser of a model family; ValueError (a configuration mistake) for an unknown one."""
    try:
        return PARSERS[family]
    except KeyError:
        raise ValueError(f"no tool-call parser for model family {family!r}; known: {sorted(PARSERS)}") from None


def parse_tool_calls(text: str, family: str = "hermes") -> ParseResult:
    """Parse one assistant turn with the parser of `family` (see the module docstring)."""
    return get_parser(family)(text)


# -- rendering: the model's own chat template, token in / token out ---------------------------
class ChatRenderer:
    """Renders with the tokenizer's own chat template (and tools), and gives the token ids of
    what comes *after* a sampled assistant turn, so the history is never re-tokenised.

    The ids of a tool observation are those of the text the template adds when the tool
    messages (and the next generation prompt) follow the assistant turn: rendered once with
    and once without them, the difference is tokenised on its own. That text starts at a
    special token, so its tokens are the ones the whole conversation would have there.
    """

    def __init__(self, tokenizer, tools: list[dict] | None = None, family: str = "hermes"):
        self.tokenizer = tokenizer
        self.tools = tools or None
        self.parse = get_parser(family)
        self.eos_text = tokenizer.eos_token or ""
        probe = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
        rendered = self.render(probe)
        # what the template writes after the assistant's end-of-turn token ("\n" for ChatML)
        self.after_eos = rendered[rendered.rindex(self.eos_text) + len(self.eos_text):] if self.eos_text else ""

    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=self.tools, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """The first prompt: system and user turns, then the assistant's generation prompt."""
        return self.encode(self.render(messages, add_generation_prompt=True))

    def observation_ids(self, history: list[dict], observations: list[dict], sampled_eos: bool) -> list[int]:
        """Ids of `observations` (tool / user messages) after the last assistant turn of
        `history`, up to the next generation prompt. `sampled_eos`: the turn's last sampled
        token was the end-of-turn token (else it is added here, masked, as a cut turn)."""
        before = self.render(history)
        after = self.render(history + observations, add_generation_prompt=True)
        if not after.startswith(before):
            raise ValueError("the chat template does not render a conversation as a prefix of its continuation")
        suffix = after[len(before):]
        head = self.after_eos if sampled_eos else self.eos_text + self.after_eos
        return self.encode(head + suffix)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)
