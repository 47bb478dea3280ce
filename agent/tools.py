"""The agent's tools (bash, str_replace_editor, submit), each run against a Sandbox, never the host.

Contract: `ToolBox(sandbox).run(name, arguments)` always returns a `ToolResult`. Anything the
model can get wrong (an unknown tool, missing or mistyped arguments, a path outside the
workspace, an edit that does not apply) becomes an observation with `error=True`, never an
exception. Only infrastructure faults (`SandboxError`: the engine or container is gone)
propagate, because then the rollout cannot go on and the caller decides whether to retry.

The descriptions and JSON schemas the model sees live in `tools.yaml`; the same schemas are
used here to check each call, so the two cannot drift apart.
"""

from __future__ import annotations

import functools
import json
import posixpath
import re
import shlex
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from envs.base import ANSWER_FILE
from sandbox.base import ExecResult, Sandbox, cap_text

SPEC_FILE = Path(__file__).with_name("tools.yaml")
ENV_SPEC_FILE = Path(__file__).with_name("env_tools.yaml")  # envs' own tools, outside the tiny tokenizer's corpus
DEFAULT_TOOLS = ("bash", "str_replace_editor", "submit")
ENDING_TOOLS = ("submit", "answer")  # a call of one of these ends the episode
SNIPPET_CONTEXT = 4  # lines shown around an edit, so the model can check it without a `view`


@dataclass(frozen=True)
class ToolResult:
    """One observation. `submitted`: the episode is over. `error`: the call did not do its job."""

    output: str
    submitted: bool = False
    error: bool = False


class ToolError(Exception):
    """A mistake the model made; its message becomes the observation (with error=True)."""


@functools.lru_cache(maxsize=32)
def _specs(path: str, mtime_ns: int) -> list[dict]:
    """A spec file's tools, parsed once per version of the file: every rollout makes a ToolBox,
    and PyYAML's pure-Python parser held the GIL for 39% of the samples a profile of the peer
    benchmark took in the GIL (BENCHMARKS.md). Callers get the parsed objects read-only
    (`filled` below builds new ones)."""
    return yaml.safe_load(Path(path).read_text())


def load_definitions(spec_file: Path = SPEC_FILE, names=DEFAULT_TOOLS, **fill: Any) -> list[dict]:
    """OpenAI-style tool definitions for `names`, in that order, read from `spec_file`.

    `{key}` in any description is replaced by `fill[key]` (plain replacement, so other braces
    in the text are left alone). Raises ValueError naming the file for an unknown tool name.
    """
    files = [spec_file, ENV_SPEC_FILE] if Path(spec_file) == SPEC_FILE else [spec_file]
    specs = {s["name"]: s for f in files for s in _specs(str(f), Path(f).stat().st_mtime_ns)}
    unknown = [n for n in names if n not in specs]
    if unknown:
        raise ValueError(f"{spec_file}: no tool named {unknown}; it defines {sorted(specs)}")

    def filled(obj):
        if isinstance(obj, str):
            for key, value in fill.items():
                obj = obj.replace("{" + key + "}", f"{value:g}" if isinstance(value, float) else str(value))
            return obj.strip()
        if isinstance(obj, dict):
            return {k: filled(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [filled(v) for v in obj]
        return obj

    return [
        {"type": "function", "function": filled({k: specs[n][k] for k in ("name", "description", "parameters")})}
        for n in names
    ]


# -- argument checking against the JSON schema (the subset tools.yaml uses) ----------------------
def check_arguments(schema: dict, args: Any) -> dict:
    """`args` checked against an object schema; returns a copy with mild coercions applied.

    A null value counts as an absent argument (models often send every optional key). Numbers
    and arrays sent as strings (`"30"`, `"[1, 10]"`) are decoded, because that slip says nothing
    about whether the model understood the tool. Raises ToolError with a message for the model.
    """
    if not isinstance(args, dict):
        raise ToolError(f"the arguments must be a JSON object, not {type(args).__name__}")
    props = schema.get("properties", {})
    unknown = sorted(set(args) - set(props))
    if unknown and schema.get("additionalProperties", True) is False:
        takes = f"it takes {sorted(props)}" if props else "it takes no arguments"
        raise ToolError(f"unknown argument(s) {unknown}; {takes}")
    present = {k: v for k, v in args.items() if v is not None}
    missing = [k for k in schema.get("required", []) if k not in present]
    if missing:
        raise ToolError(f"missing required argument(s) {missing}")
    return {k: _check_value(k, props.get(k, {}), v) for k, v in present.items()}


def _check_value(name: str, schema: dict, value: Any) -> Any:
    kind = schema.get("type")
    shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
    bad = ToolError(f"argument `{name}` must be {_A.get(kind, kind)}, got {type(value).__name__} {shown}")
    if kind == "string":
        if not isinstance(value, str):
            raise bad
    elif kind in ("integer", "number"):
        if isinstance(value, str):
            try:
                value = json.loads(value.strip())
            except ValueError:
                raise bad from None
        if isinstance(value, float) and kind == "integer" and value.is_integer():
            value = int(value)
        ok = (int,) if kind == "integer" else (int, float)
        if isinstance(value, bool) or not isinstance(value, ok):
            raise bad
    elif kind == "array":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise bad from None
        if not isinstance(value, list):
            raise bad
        lo, hi = schema.get("minItems", 0), schema.get("maxItems", len(value))
        if not lo <= len(value) <= hi:
            count = f"exactly {lo}" if lo == hi else f"{lo} to {hi}"
            raise ToolError(f"argument `{name}` must have {count} items, got {len(value)}")
        value = [_check_value(f"{name}[{i}]", schema.get("items", {}), v) for i, v in enumerate(value)]
    elif kind == "object" and not isinstance(value, dict):
        raise bad
    if "enum" in schema and value not in schema["enum"]:
        raise ToolError(f"argument `{name}` must be one of {schema['enum']}, got {shown}")
    return value


_A = {"string": "a string", "integer": "an integer", "number": "a number", "array": "an array",
      "object": "an object"}


# -- text helpers ---------------------------------------------------------------------------------
def split_lines(text: str) -> list[str]:
    """Lines with their "\\n" kept; only "\\n" ends a line (as for `cat -n`, unlike str.splitlines)."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def numbered(lines: list[str], first: int) -> str:
    """`cat -n` style: the line number right-aligned in 6 columns, a tab, the line."""
    return "\n".join(f"{i:6}\t{line.removesuffix(chr(10))}" for i, line in enumerate(lines, first))


def describe_exec(result: ExecResult, timeout_s: float) -> str:
    """What the model sees of a command: its output, then how it ended unless it simply succeeded."""
    if result.timed_out:
        status = f"the command timed out: killed after {timeout_s:g}s"
    elif result.oom_killed or result.disk_full_mb:
        status = result.describe()
    else:
        status = f"exit code {result.exit_code}"
    body = result.output.rstrip("\n")
    if not body.strip():
        return f"(no output; {status})"
    return body if result.ok else f"{body}\n({status})"


class ToolBox:
    """The tools of one rollout, bound to its sandbox; keeps the per-file undo history."""

    def __init__(
        self,
        sandbox: Sandbox,
        *,
        tools: tuple[str, ...] = DEFAULT_TOOLS,
        default_timeout_s: float = 60.0,
        max_timeout_s: float = 600.0,
        max_output_bytes: int = 16_000,
        spec_file: Path = SPEC_FILE,
        handlers: dict[str, Any] | None = None,
    ):
        self.sandbox = sandbox
        self.default_timeout_s = float(default_timeout_s)
        self.max_timeout_s = float(max_timeout_s)
        self.max_output_bytes = max_output_bytes
        self.definitions = load_definitions(
            spec_file, tools, default_timeout_s=self.default_timeout_s, max_timeout_s=self.max_timeout_s
        )
        self._schemas = {d["function"]["name"]: d["function"]["parameters"] for d in self.definitions}
        self._handlers = {"bash": self._bash, "str_replace_editor": self._editor, "submit": self._submit,
                          "answer": self._answer}
        # an env's own tools (schemas in tools.yaml too): name -> fn(**arguments) returning the
        # observation text, or (text, True) to end the episode; a ValueError is the model's mistake
        self._env_tools = set(handlers or {})
        self._handlers.update(handlers or {})
        # path -> contents before each edit, newest last; None: the edit created the file
        self._history: dict[str, list[str | None]] = defaultdict(list)

    def run(self, name: str, arguments: Any) -> ToolResult:
        """Run one tool call; the observation is capped to `max_output_bytes` (head and tail kept)."""
        if name not in self._schemas:
            return self._error(f"there is no tool named {name!r}; the tools are {sorted(self._schemas)}")
        try:
            args = check_arguments(self._schemas[name], arguments)
            output = self._handlers[name](**args)
        except ToolError as e:
            return self._error(str(e))
        except ValueError as e:
            if name not in self._env_tools:
                raise
            return self._error(str(e))
        ended = name in ENDING_TOOLS
        if isinstance(output, tuple):  # an env's tool: (text, whether the episode is over)
            output, ended = output
        return ToolResult(cap_text(output, self.max_output_bytes)[0], submitted=bool(ended))

    def _error(self, message: str) -> ToolResult:
        return ToolResult(cap_text(f"Error: {message}", self.max_output_bytes)[0], error=True)

    # -- bash / submit ----------------------------------------------------------------------------
    def _bash(self, command: str, timeout: float | None = None) -> str:
        if not command.strip():
            raise ToolError("`command` is empty")
        timeout_s = self.default_timeout_s if timeout is None else float(timeout)
        if not timeout_s > 0:  # NaN too
            raise ToolError(f"`timeout` must be a positive number of seconds, got {timeout}")
        timeout_s = min(timeout_s, self.max_timeout_s)
        return describe_exec(self.sandbox.exec(command, timeout=timeout_s), timeout_s)

    def _submit(self) -> str:
        return "Submitted. The episode is over; the workspace as it is now will be graded."

    def _answer(self, value: str) -> str:
        self.sandbox.write_file(ANSWER_FILE, value)
        return "Answer recorded. The episode is over."

    # -- str_replace_editor -----------------------------------------------------------------------
    def _editor(self, command: str, path: str, view_range=None, file_text=None, old_str=None,
                new_str=None, insert_line=None) -> str:
        path = self._resolve(path)
        if command == "view":
            return self._view(path, view_range)
        if command == "create":
            return self._create(path, _need(file_text, "file_text", command))
        if command == "str_replace":
            return self._str_replace(path, _need(old_str, "old_str", command), new_str or "")
        if command == "insert":
            return self._insert(path, _need(insert_line, "insert_line", command), _need(new_str, "new_str", command))
        return self._undo(path)  # the schema's enum leaves only undo_edit

    def _resolve(self, path: str) -> str:
        """An absolute, normalised path inside the workspace, or a ToolError saying why not."""
        root = posixpath.normpath(self.sandbox.workdir)
        raw = path.strip()
        if not raw:
            raise ToolError("`path` is empty")
        full = posixpath.normpath(raw if raw.startswith("/") else posixpath.join(root, raw))
        full = "/" + full.lstrip("/")  # normpath keeps a leading "//"
        if full != root and not full.startswith(root + "/"):
            raise ToolError(
                f"{path!r} is outside the workspace (it resolves to {full}); "
                f"use a path under {root}, absolute or relative to {root}"
            )
        # and through links: a symlink in the workspace may point anywhere
        # (the workspace itself may be a link: SWE-Next's /testbed is /workspace)
        out = self.sandbox.exec(f"realpath -m -- {shlex.quote(root)} {shlex.quote(full)}", timeout=30).output.split("\n")
        real_root, real = (out[0].strip(), out[1].strip()) if len(out) > 1 else (root, full)
        if real != real_root and not real.startswith(real_root.rstrip("/") + "/"):
            raise ToolError(f"{path!r} leads out of the workspace through a symbolic link (to {real}); "
                            f"use a path under {root}")
        return full

    def _kind(self, path: str) -> str:
        q = shlex.quote(path)
        r = self.sandbox.exec(f"if [ -d {q} ]; then echo dir; elif [ -f {q} ]; then echo file; "
                              f"elif [ -e {q} ]; then echo other; else echo missing; fi", timeout=30)
        return r.output.strip()

    def _read(self, path: str) -> str:
        try:
            text = self.sandbox.read_file(path)
        except FileNotFoundError:
            raise ToolError(f"{path} does not exist") from None
        except IsADirectoryError:
            raise ToolError(f"{path} is a directory, not a file") from None
        if "\x00" in text:  # editing a decoded binary would corrupt it
            raise ToolError(f"{path} looks like a binary file; the editor only handles text")
        return text

    def _write(self, path: str, old: str | None, new: str) -> None:
        self.sandbox.write_file(path, new)
        self._history[path].append(old)

    def _view(self, path: str, view_range: list[int] | None) -> str:
        kind = self._kind(path)
        if kind == "missing":
            raise ToolError(f"{path} does not exist")
        if kind == "dir":
            if view_range is not None:
                raise ToolError(f"`view_range` only applies to files; {path} is a directory")
            q = shlex.quote(path)
            r = self.sandbox.exec(f"find {q} -mindepth 1 -maxdepth 2 -name '.*' -prune -o "
                                  f"-type d -printf '%p/\\n' -o -print | LC_ALL=C sort", timeout=60)
            if r.exit_code != 0:
                raise ToolError(f"could not list {path}: {describe_exec(r, 60)}")
            listing = r.output.rstrip("\n") or "(empty directory)"
            return f"Here are the files and directories up to 2 levels deep in {path}, hidden items excluded:\n{listing}"
        lines = split_lines(self._read(path))
        n = len(lines)
        if n == 0:
            return f"{path} is empty."
        start, end = 1, n
        if view_range is not None:
            start, end = view_range
            if not 1 <= start <= n:
                raise ToolError(f"`view_range` start {start} is out of range: {path} has {n} lines (1 to {n})")
            if end != -1 and end < start:
                raise ToolError(f"`view_range` end {end} is before its start {start}; use -1 for the end of the file")
            end = n if end == -1 else min(end, n)  # past the end: show what there is
        part = f" (lines {start}-{end} of {n})" if (start, end) != (1, n) else ""
        return f"Here's the result of running `cat -n` on {path}{part}:\n{numbered(lines[start - 1:end], start)}"

    def _create(self, path: str, file_text: str) -> str:
        kind = self._kind(path)
        if kind != "missing":
            what = "a directory" if kind == "dir" else "a file"
            raise ToolError(f"{path} already exists ({what}); `create` does not overwrite. "
                            "Use `str_replace` or `insert` to change a file, `view` to read it")
        parent = posixpath.dirname(path)
        r = self.sandbox.exec(f"mkdir -p {shlex.quote(parent)}", timeout=30)
        if r.exit_code != 0:
            raise ToolError(f"could not make the directory {parent}: {r.output.strip()}")
        self._write(path, None, file_text)
        return f"File created successfully at {path}."

    def _str_replace(self, path: str, old_str: str, new_str: str) -> str:
        if not old_str:
            raise ToolError("`old_str` is empty; give the exact text to replace (use `insert` to add text)")
        if old_str == new_str:
            raise ToolError("`new_str` is the same as `old_str`; nothing would change")
        text = self._read(path)
        starts = [m.start() for m in re.finditer(f"(?={re.escape(old_str)})", text)]  # overlapping too
        if len(starts) != 1:
            where = ""
            if starts:
                lines = sorted({text.count("\n", 0, i) + 1 for i in starts})
                where = f", starting on line(s) {lines}. Include more surrounding lines so that it matches once"
            else:
                where = "; check its whitespace and indentation against `view`"
            raise ToolError(f"no replacement was made: `old_str` occurs {len(starts)} times in {path}{where}")
        i = starts[0]
        new_text = text[:i] + new_str + text[i + len(old_str):]
        self._write(path, text, new_text)
        first = text.count("\n", 0, i) + 1
        return self._edited(path, new_text, first, first + new_str.count("\n"))

    def _insert(self, path: str, insert_line: int, new_str: str) -> str:
        text = self._read(path)
        lines = split_lines(text)
        if not 0 <= insert_line <= len(lines):
            raise ToolError(f"`insert_line` {insert_line} is out of range: {path} has {len(lines)} lines "
                            f"(0 to {len(lines)}; 0 inserts at the top)")
        block = new_str if new_str.endswith("\n") else new_str + "\n"
        if insert_line == len(lines) and lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"  # appending after a last line that had no newline
        new_text = "".join(lines[:insert_line]) + block + "".join(lines[insert_line:])
        self._write(path, text, new_text)
        return self._edited(path, new_text, insert_line + 1, insert_line + block.count("\n"))

    def _edited(self, path: str, new_text: str, first: int, last: int) -> str:
        lines = split_lines(new_text)
        lo, hi = max(1, first - SNIPPET_CONTEXT), min(len(lines), last + SNIPPET_CONTEXT)
        return (f"The file {path} has been edited. Here's the result of running `cat -n` on a snippet of it:\n"
                f"{numbered(lines[lo - 1:hi], lo)}\n"
                "Review the changes and make sure they are as expected; edit the file again if necessary.")

    def _undo(self, path: str) -> str:
        stack = self._history.get(path)
        if not stack:
            raise ToolError(f"there is no edit of {path} to undo (changes made with bash cannot be undone here)")
        previous = stack.pop()
        if previous is None:
            self.sandbox.exec(f"rm -f {shlex.quote(path)}", timeout=30)
            return f"Undid the creation of {path}; the file has been removed."
        self.sandbox.write_file(path, previous)
        shown = numbered(split_lines(previous), 1) or "(the file is now empty)"
        return f"Undid the last edit of {path}. Here's the result of running `cat -n` on it:\n{shown}"


def _need(value, name: str, command: str):
    if value is None:
        raise ToolError(f"`{command}` needs the `{name}` argument")
    return value
