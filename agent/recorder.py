"""One rollout's chat-completion requests, assembled into one `Trajectory` token in, token out.

A scaffold (mini-swe-agent, OpenHands, anything that speaks OpenAI chat completions) re-sends the
whole conversation every turn. Rendering it again with the chat template need not give the ids
that were sampled: the template writes a tool call's JSON its own way (jinja's `tojson` escapes
`<`, `>`, `&` and `'`), BPE merges differently across a boundary, a scaffold truncates or rewrites
an old message. So the recorder never takes a turn's ids from a re-rendering when it can avoid it:

* **The conversation goes on as recorded** (every message the scaffold sends again equals, as a
  message, the one it sent or was given before: role, text, tool calls by name and arguments):
  the engine's prompt is the recorded ids plus the ids of the new messages alone (the chat
  template's own text after the last assistant turn, `ChatRenderer.observation_ids`). When a
  re-rendering of the same messages would have given other ids, the turn is counted as
  *repaired* (`repaired_turns`): its text is the same, its recorded ids were kept.
* **The conversation departs from the record** (a message changed, dropped or added before the
  end): the engine's prompt is the request rendered afresh, since that is what the scaffold
  asked about. The trajectory keeps its recorded ids up to the first id where the two differ;
  everything after is the new rendering, trained as observation (loss mask 0). Each sampled turn
  that lost its place is counted (`retokenized_turns`): its tokens are no longer trained as
  actions, because they are no longer what the model saw.

Either way what the learner trains on is exactly what the engine was given and what it sampled.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

from agent.chat import ChatRenderer
from agent.engines.base import Completion, SamplingParams
from agent.trajectory import Trajectory


class ContextFull(Exception):
    """The conversation has no room for another turn (`AgentConfig.max_tokens`)."""

    def __init__(self, tokens: int, limit: int):
        super().__init__(f"This model's maximum context length is {limit} tokens. However, your messages "
                         f"resulted in {tokens} tokens. Please reduce the length of the messages.")
        self.tokens, self.limit = tokens, limit


class BadRequest(ValueError):
    """A request the endpoint cannot serve (said to the client as HTTP 400, with the field)."""


def text_of(content: Any) -> str:
    """A message's text: a string, None, or OpenAI's list of parts (their text joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, str):
                parts.append(part)
            else:
                raise BadRequest(f"message content part {part!r}: only text parts are served")
        return "".join(parts)
    raise BadRequest(f"message content must be a string or a list of text parts, got {type(content).__name__}")


def _arguments(raw: Any) -> Any:
    """A tool call's arguments as an object where they are JSON (OpenAI sends a string)."""
    if isinstance(raw, str):
        try:
            return json.loads(raw) if raw.strip() else {}
        except ValueError:
            return raw
    return raw if raw is not None else {}


def normalize(message: dict, index: int) -> dict:
    """An OpenAI message as the chat template reads it: role, text, tool calls with their
    arguments as objects. Raises BadRequest naming the message for what cannot be one."""
    if not isinstance(message, dict):
        raise BadRequest(f"messages[{index}]: expected an object, got {type(message).__name__}")
    role = message.get("role")
    if role not in ("system", "user", "assistant", "tool"):
        raise BadRequest(f"messages[{index}].role: {role!r} is not one of system, user, assistant, tool")
    try:
        out = {"role": role, "content": text_of(message.get("content"))}
    except BadRequest as e:
        raise BadRequest(f"messages[{index}].content: {e}") from None
    if role == "assistant" and message.get("tool_calls"):
        calls = []
        for j, call in enumerate(message["tool_calls"]):
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise BadRequest(f"messages[{index}].tool_calls[{j}].function.name: missing")
            calls.append({"id": call.get("id"), "type": "function",
                          "function": {"name": fn["name"], "arguments": _arguments(fn.get("arguments"))}})
        out["tool_calls"] = calls
    if role == "tool":
        out["tool_call_id"] = message.get("tool_call_id")
    return out


def same(a: dict, b: dict) -> bool:
    """Two normalized messages say the same: role, text, and tool calls by name and arguments
    (call ids and key order aside)."""
    def calls(m):
        return [(c["function"]["name"], json.dumps(c["function"]["arguments"], sort_keys=True))
                for c in m.get("tool_calls") or []]
    return a["role"] == b["role"] and a["content"] == b["content"] and calls(a) == calls(b)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class Recorder:
    """The record of one rollout (one API key): its trajectory so far and the messages it covers.

    `prepare(messages, tools)` gives the ids to sample from, `record(completion, version)` adds
    what was sampled and returns the assistant message for the client. Requests of one rollout
    are served one at a time (a lock: a scaffold that sends two at once gets them in order)."""

    key: str
    tokenizer: Any
    family: str = "hermes"
    instance_id: str = ""
    max_tokens: int = 16384  # the whole context
    max_new_tokens: int = 1024  # one reply
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    trajectory: Trajectory | None = None
    repaired_turns: int = 0
    retokenized_turns: int = 0
    context_full: bool = False
    requests: int = 0
    generate_s: float = 0.0  # the engine's time, all requests
    serve_s: float = 0.0  # the endpoint's own time around it (rendering, parsing, HTTP)
    messages: list[dict] = field(default_factory=list)  # the conversation the ids cover, last reply included
    lock: threading.Lock = field(default_factory=threading.Lock)
    _renderers: dict = field(default_factory=dict)
    _chat: ChatRenderer | None = None
    _checked_upto: int = 0  # ids before this were compared with a fresh rendering already
    _ended_eos: bool = True

    def renderer(self, tools: list[dict] | None) -> ChatRenderer:
        key = json.dumps(tools, sort_keys=True) if tools else ""
        if key not in self._renderers:
            self._renderers[key] = ChatRenderer(self.tokenizer, tools or None, self.family)
        return self._renderers[key]

    @property
    def ids(self) -> list[int]:
        t = self.trajectory
        return [] if t is None else t.prompt_ids + t.completion_ids

    def prepare(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The ids the engine samples from for this request (see the module docstring); the
        trajectory is brought up to them. ContextFull when no token is left for a reply."""
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages: expected a non-empty list")
        msgs = [normalize(m, i) for i, m in enumerate(messages)]
        chat = self._chat = self.renderer(tools)
        if self.trajectory is None:
            self.trajectory = Trajectory(self.instance_id, prompt_ids=chat.prompt_ids(msgs), messages=msgs)
            self._checked_upto = len(self.trajectory.prompt_ids)
        elif self._continues(msgs):
            new = msgs[len(self.messages):]
            history = msgs[: len(self.messages)]
            self.trajectory.append_observation(chat.observation_ids(history, new, self._ended_eos))
            # would a fresh rendering have given other ids? (a difference first seen in what the
            # last reply and these messages added: one before it was counted when it was new)
            first_diff = common_prefix(chat.prompt_ids(msgs), self.ids)
            if self._checked_upto <= first_diff < len(self.ids):
                self.repaired_turns += 1
            self._checked_upto = len(self.ids)
        else:
            self._depart(chat.prompt_ids(msgs))
        self.messages = msgs
        if len(self.ids) >= self.max_tokens:
            self.context_full = True
            raise ContextFull(len(self.ids), self.max_tokens)
        return self.ids

    def _continues(self, msgs: list[dict]) -> bool:
        """The request repeats every recorded message, unchanged, and adds at least one."""
        n = len(self.messages)
        return len(msgs) > n and all(same(a, b) for a, b in zip(msgs, self.messages)) \
            and msgs[n]["role"] != "assistant"

    def _depart(self, fresh: list[int]) -> None:
        """The request is not the record continued: keep the recorded ids up to the first that
        differs, the rest of the fresh rendering as observation; count the sampled turns lost."""
        t = self.trajectory
        k = common_prefix(fresh, self.ids)
        prompt = len(t.prompt_ids)
        keep = max(k - prompt, 0)
        lost = _sampled_runs(t.loss_mask, keep)
        self.retokenized_turns += lost
        if k < prompt:  # the first prompt itself changed: all of it is the fresh rendering's
            t.prompt_ids = list(fresh)
            t.completion_ids, t.loss_mask, t.logprobs, t.policy_version = [], [], [], []
        else:
            del t.completion_ids[keep:], t.loss_mask[keep:], t.logprobs[keep:], t.policy_version[keep:]
            t.append_observation(fresh[k:])
        t.info["departures"] = t.info.get("departures", 0) + 1
        self._checked_upto = len(self.ids)

    def sampling(self, requested_max: int | None, stop_id: int) -> SamplingParams:
        """This turn's sampling: the rollout's temperature and top-p (the learner's logprobs
        assume them, whatever a request asks), at most `max_new_tokens` and the context's room."""
        room = self.max_tokens - len(self.ids)
        n = min(self.max_new_tokens, room, requested_max or self.max_new_tokens)
        seed = None if self.seed is None else self.seed + self.requests
        return SamplingParams(max(n, 1), self.temperature, self.top_p, (stop_id,), seed)

    def record(self, completion: Completion, version: int, stop_id: int) -> tuple[dict, str]:
        """Add the sampled ids; the assistant message for the client (tool calls parsed by the
        project's parser for the model's family) and OpenAI's finish reason."""
        t = self.trajectory
        t.append_sampled(completion.token_ids, completion.logprobs, completion.versions or version)
        self.requests += 1
        t.turns = self.requests
        ids = completion.token_ids
        self._ended_eos = bool(ids) and ids[-1] == stop_id
        chat = self._chat
        text = chat.decode(ids[:-1] if self._ended_eos else ids)
        parsed = chat.parse(text)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        finish = "stop" if self._ended_eos else "length"
        if parsed.calls and parsed.error is None:
            message["content"] = parsed.content or None
            message["tool_calls"] = [
                {"id": f"call_{self.requests}_{i}", "type": "function",
                 "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                for i, c in enumerate(parsed.calls)]
            finish = "tool_calls" if self._ended_eos else "length"
        self.messages = self.messages + [normalize(message, len(self.messages))]
        return message, finish

    def finish(self) -> Trajectory:
        """The trajectory as recorded (an empty one if no request came), with the counts."""
        t = self.trajectory or Trajectory(self.instance_id, prompt_ids=[])
        t.info.update(requests=self.requests, repaired_turns=self.repaired_turns,
                      retokenized_turns=self.retokenized_turns)
        t.messages = [{k: v for k, v in m.items() if k != "tool_call_id"} for m in self.messages] or t.messages
        t.timings["generate"] = self.generate_s
        t.timings["endpoint"] = self.serve_s
        return t


def _sampled_runs(mask: list[int], start: int) -> int:
    """Sampled turns (runs of mask 1) with a token at or after `start`."""
    runs, i, n = 0, 0, len(mask)
    while i < n:
        if not mask[i]:
            i += 1
            continue
        end = i
        while end < n and mask[end]:
            end += 1
        runs += end > start
        i = end
    return runs
