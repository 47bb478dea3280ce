"""Hermes tool-call parsing: exact cases, then thousands of random and mutated outputs."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.chat import CLOSE, OPEN, PARSERS, ParseResult, ToolCall, get_parser, parse_tool_calls


def block(name, arguments, as_string=False):
    args = json.dumps(arguments, ensure_ascii=False) if as_string else arguments
    return f"{OPEN}\n{json.dumps({'name': name, 'arguments': args}, ensure_ascii=False)}\n{CLOSE}"


# -- exact cases ------------------------------------------------------------------------------------
def test_one_call():
    r = parse_tool_calls(block("bash", {"command": "ls -la"}))
    assert r == ParseResult("", [ToolCall("bash", {"command": "ls -la"})], None)


def test_two_calls_with_content_before_and_between():
    text = "Let me look first.\n" + block("bash", {"command": "ls"}) + "\nthen\n" + block("submit", {})
    r = parse_tool_calls(text)
    assert r.error is None
    assert r.calls == [ToolCall("bash", {"command": "ls"}), ToolCall("submit", {})]
    assert r.content == "Let me look first.\nthen"


def test_arguments_as_json_string_or_missing():
    r = parse_tool_calls(block("str_replace_editor", {"command": "view", "path": "a.py"}, as_string=True))
    assert r.calls == [ToolCall("str_replace_editor", {"command": "view", "path": "a.py"})] and r.error is None
    assert parse_tool_calls(f'{OPEN}{{"name": "submit"}}{CLOSE}').calls == [ToolCall("submit", {})]
    assert parse_tool_calls(f'{OPEN}{{"name": "submit", "arguments": ""}}{CLOSE}').calls == [ToolCall("submit", {})]


def test_no_call_is_plain_content():
    assert parse_tool_calls("  I am done.  ") == ParseResult("I am done.", [], None)
    assert parse_tool_calls("") == ParseResult("", [], None)


def test_tags_inside_json_strings_do_not_end_the_block():
    args = {"command": "create", "path": "doc.md", "file_text": f"use {OPEN}...{CLOSE} like this"}
    r = parse_tool_calls(block("str_replace_editor", args))
    assert r.error is None and r.calls == [ToolCall("str_replace_editor", args)]


@pytest.mark.parametrize("text, says", [
    (f"{OPEN}{{'name': 'bash'}}{CLOSE}", "not valid JSON"),
    (f'{OPEN}{{"arguments": {{}}}}{CLOSE}', '"name" must be'),
    (f'{OPEN}{{"name": 3, "arguments": {{}}}}{CLOSE}', '"name" must be'),
    (f'{OPEN}{{"name": "bash", "arguments": [1]}}{CLOSE}', "must be a JSON object, got an array"),
    (f'{OPEN}{{"name": "bash", "arguments": "ls"}}{CLOSE}', "string that is not valid JSON"),
    (f'{OPEN}{{"name": "bash", "arguments": "[1]"}}{CLOSE}', "must be a JSON object"),
    (f'{OPEN}["bash"]{CLOSE}', "expected a JSON object"),
    (f'{OPEN}{{"name": "bash", "arguments": {{"command": "ls"}}}}', "never closed"),
    (f'{OPEN}{{"name": "bash", "arguments": {{"command": "ls"', "never closed"),
    (f'{OPEN}{{"name": "bash"}} trailing {CLOSE}', "unexpected text after the JSON"),
    (f'{{"name": "bash"}}{CLOSE}', f"{CLOSE} with no {OPEN}"),
    (f'{OPEN}{OPEN}{{"name": "bash"}}{CLOSE}', "not valid JSON"),
])
def test_malformed_calls_give_an_error_and_no_calls(text, says):
    r = parse_tool_calls("thinking... " + text)
    assert r.calls == [] and r.error and says in r.error, r
    assert "Nothing was run" in r.error and '"name": "TOOL_NAME"' in r.error  # tells the model the format


def test_one_bad_call_stops_the_whole_turn():
    r = parse_tool_calls(block("bash", {"command": "ls"}) + f"{OPEN}{{oops}}{CLOSE}")
    assert r.calls == [] and r.error.startswith("tool call 2:")


def test_registry():
    assert get_parser("hermes") is PARSERS["hermes"]
    with pytest.raises(ValueError, match="known: \\['hermes'\\]"):
        get_parser("nope")


# -- properties -----------------------------------------------------------------------------------
def assert_consistent(r, text):
    assert isinstance(r, ParseResult) and isinstance(r.content, str) and isinstance(r.calls, list)
    assert r.content == r.content.strip()
    assert OPEN not in r.content and CLOSE not in r.content
    assert r.error is None or (isinstance(r.error, str) and r.error)
    if r.error is not None:
        assert r.calls == []
    for c in r.calls:
        assert isinstance(c, ToolCall) and isinstance(c.name, str) and c.name and isinstance(c.arguments, dict)
    if OPEN not in text and CLOSE not in text:
        assert r == ParseResult(text.strip(), [], None)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)
names = st.from_regex(r"[a-z_][a-z0-9_]{0,15}", fullmatch=True)
arguments = st.dictionaries(st.text(max_size=10), json_values, max_size=4)
# prose between calls: any text, tag fragments and unicode included, but no whole tag
prose = st.text(st.characters(), max_size=40) | st.lists(
    st.sampled_from(["<tool_", "call>", "</tool", "{", "}", '"', "\\", "é", "🙂", "\u2028", "\n", " ", "x"]),
    max_size=10).map("".join)
prose = prose.filter(lambda s: OPEN not in s and CLOSE not in s)
pieces = st.sampled_from([OPEN, CLOSE, "{", "}", "[", "]", '"name"', '"arguments"', ":", ",", '"bash"',
                          '"{\\"a\\": 1}"', "null", "1", " ", "\n", "\\", '"', "é", "🙂", "\x00"])
random_text = st.text() | st.lists(pieces | st.text(max_size=4), max_size=30).map("".join)


@st.composite
def rendered_turns(draw):
    """(text, the calls in it, (start, end) of each block) for a well-formed turn."""
    calls = draw(st.lists(st.tuples(names, arguments, st.booleans()), max_size=4))
    text, spans = draw(prose), []
    for name, args, as_string in calls:
        text += "\n"
        call = block(name, args, as_string)
        spans.append((len(text), len(text) + len(call)))
        text += call + "\n" + draw(prose)
    return text, [ToolCall(n, a) for n, a, _ in calls], spans


# Generating a structured turn costs far more than parsing it, so those tests draw fewer turns and
# the truncation test parses every prefix of each (tens of thousands of parses in all).
FAST = settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TURNS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(random_text)
def test_random_text_never_raises(text):
    assert_consistent(parse_tool_calls(text), text)


@TURNS
@given(rendered_turns())
def test_turns_and_their_prefixes_keep_the_complete_calls_or_say_why(turn):
    """The whole turn round-trips; a prefix (a generation cut off by a token limit) keeps the
    calls it holds in full, or, when the cut falls inside a block, is an error."""
    text, calls, spans = turn
    for cut in range(len(text) + 1):
        r = parse_tool_calls(text[:cut])
        assert_consistent(r, text[:cut])
        if any(start + len(OPEN) <= cut < end for start, end in spans):  # cut inside a block
            assert r.error and r.calls == []
        else:
            assert r.error is None and r.calls == calls[: sum(end <= cut for _, end in spans)]


MUTATION_PIECES = [OPEN, CLOSE, "{", "}", '"', "\\", ",", ":", "null", "é", "🙂", "\x00", "\n", "<tool_", "call>"]


@TURNS
@given(rendered_turns(), st.randoms(use_true_random=False))
def test_mutated_turns_never_raise(turn, rnd):
    text = turn[0]
    for _ in range(10):  # ten mutations in a row, each result parsed: thousands of outputs in all
        i = rnd.randint(0, len(text))
        j = rnd.randint(i, min(len(text), i + 12))
        how = rnd.choice(["delete", "insert", "duplicate", "nest"])
        if how == "delete":
            text = text[:i] + text[j:]
        elif how == "insert":
            text = text[:i] + rnd.choice(MUTATION_PIECES) + text[i:]
        elif how == "duplicate":
            text = text[:j] + text[i:j] + text[j:]
        else:
            text = text[:i] + OPEN + text[i:j] + CLOSE + text[j:]
        assert_consistent(parse_tool_calls(text), text)
