"""The Sandbox protocol: one isolated workspace per rollout, always closed."""

from __future__ import annotations

import re

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

WORKDIR = "/testbed"
TRUNCATION_MARK = "\n[... {n} bytes cut from the middle of this output ...]\n"


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandbox; units are in the field names."""

    memory_mb: int = 2048
    cpus: float = 1.0
    pids: int = 512
    nofile: int = 4096  # open files per process
    # commands of the model run as this uid[:gid] (numeric: images need no account for it) once
    # the workspace is prepared, which is then handed to it; None: as root (images' default)
    user: str | None = None
    nproc: int = 4096  # processes of `user` (the kernel counts them host-wide per uid; root is exempt)
    disk_mb: int = 4096  # what a sandbox may write (its writable layer: the workspace, /tmp, installs)
    output_bytes: int = 64_000  # per exec, head and tail kept
    default_timeout_s: float = 120.0


def valid_user(user) -> bool:
    """Whether `Limits.user` can be used: a numeric uid or uid:gid other than 0 (images need no
    account for a number), or None for root."""
    return user is None or re.fullmatch(r"[1-9][0-9]*(:[0-9]+)?", str(user)) is not None


@dataclass
class ExecResult:
    """What one command did. `output` is stdout and stderr interleaved, capped."""

    exit_code: int
    output: str
    timed_out: bool = False
    truncated: bool = False
    oom_killed: bool = False
    duration_s: float = 0.0
    disk_full_mb: int = 0  # the disk limit, when the command was stopped for passing it (or left it passed)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.disk_full_mb

    def describe(self) -> str:
        """One line a person (or a model) can read about how the command ended."""
        if self.timed_out:
            return f"timed out after {self.duration_s:.1f}s and was killed"
        if self.disk_full_mb:
            return (f"stopped: the sandbox's disk limit ({self.disk_full_mb} MB written) was passed; "
                    "delete what was written to go on")
        if self.oom_killed:
            return "killed: out of memory (the sandbox's memory limit was reached)"
        return f"exit code {self.exit_code}"


class SandboxError(RuntimeError):
    """An infrastructure fault (engine down, container gone), not a failing command."""


class SandboxKilled(SandboxError):
    """The sandbox's container stopped during a command while the engine is fine: the command
    killed it (its keep-alive process). The policy's doing, not the infrastructure's."""


@runtime_checkable
class Sandbox(Protocol):
    workdir: str

    def exec(self, cmd: str, timeout: float | None = None, workdir: str | None = None) -> ExecResult: ...

    def read_file(self, path: str) -> str: ...

    def write_file(self, path: str, content: str) -> None: ...

    def diff(self, base: str = "HEAD") -> str: ...

    def close(self) -> None: ...


@dataclass
class OutputCap:
    """Keeps the head and the tail of a stream within `limit` bytes and counts the cut."""

    limit: int
    head: bytearray = field(default_factory=bytearray)
    tail: bytearray = field(default_factory=bytearray)
    cut: int = 0

    def feed(self, chunk: bytes) -> None:
        half = self.limit // 2
        room = half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if not chunk:
            return
        self.tail += chunk
        excess = len(self.tail) - (self.limit - half)
        if excess > 0:
            del self.tail[:excess]
            self.cut += excess

    def text(self) -> tuple[str, bool]:
        head = self.head.decode("utf-8", errors="replace")
        tail = self.tail.decode("utf-8", errors="replace")
        if not self.cut:
            return head + tail, False
        return head + TRUNCATION_MARK.format(n=self.cut) + tail, True


def cap_text(text: str, limit: int) -> tuple[str, bool]:
    """Cap a string the way exec output is capped (head and tail kept, the cut marked)."""
    cap = OutputCap(limit)
    cap.feed(text.encode("utf-8"))
    return cap.text()
