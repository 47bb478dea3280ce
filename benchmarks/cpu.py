"""Where a machine's CPU seconds go while a run works: a sampler of /proc (Linux) that sums
each live process's CPU time into a few groups, with a progress value read at each sample so
that a window (say from the end of the first training step to the end of the last) can be cut
out of the series afterwards.

Groups, by process:
- `trainer`: the run's own process (every thread: rollouts, learner, the engine's client side);
- `engine`: the run's other descendants (vLLM's engine-core process);
- `docker`: the Docker daemons (dockerd, containerd);
- `containers`: containerd's shims and everything under them (runc, the containers' processes);
- `other`: the rest of the machine;
- `unsampled`: the machine's busy time (/proc/stat) that no sampled process accounts for:
  processes that lived less than a sampling interval (runc calls, Docker's short-lived helpers).

A process's CPU time is read whole at each sample; one that exits between two samples loses at
most an interval's worth, which the `unsampled` share picks up.
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from typing import Callable

GROUPS = ("trainer", "engine", "docker", "containers", "other", "unsampled")
TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[str, int, float] | None:
    """(comm, ppid, CPU seconds) of a live process, None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
    except OSError:
        return None
    # comm sits in parentheses and may hold spaces: split after the last ')'
    comm = raw[raw.index("(") + 1: raw.rindex(")")]
    rest = raw[raw.rindex(")") + 2:].split()
    return comm, int(rest[1]), (int(rest[11]) + int(rest[12])) / TICK


def machine_busy_s() -> float:
    """The machine's busy CPU seconds since boot, all cores (/proc/stat, idle and iowait left out)."""
    with open("/proc/stat") as f:
        cpu = [int(x) for x in f.readline().split()[1:]]
    return (sum(cpu[:8]) - cpu[3] - cpu[4]) / TICK


class CpuAccount:
    """Sample every `interval_s` in a thread, from `start()` to `stop()`; `root` is the run's
    process id (its descendants are the `engine` group), `progress` any cheap callable (the
    steps a run has logged, say) recorded with each sample."""

    def __init__(self, root: int, progress: Callable[[], float] = lambda: 0.0, interval_s: float = 0.25):
        self.root, self.progress, self.interval_s = root, progress, interval_s
        self.samples: list[dict] = []  # {"t", "progress", group: cumulative CPU seconds since start}
        self._group: dict[int, str] = {}  # pid -> group, fixed when first seen
        self._first: dict[int, float] = {}  # pid -> CPU seconds when first seen (counted from there)
        self._last: dict[int, float] = {}
        self._done: dict[str, float] = defaultdict(float)  # CPU of processes seen and gone
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cpu-account", daemon=True)

    def start(self) -> "CpuAccount":
        self._busy0 = machine_busy_s()
        self._sample(first=True)
        self._thread.start()
        return self

    def stop(self) -> list[dict]:
        self._stop.set()
        self._thread.join()
        self._sample()
        return self.samples

    def _classify(self, pid: int, comm: str, ppid: int, table: dict[int, tuple[str, int, float]]) -> str:
        if pid == self.root:
            return "trainer"
        if comm in ("dockerd", "containerd"):
            return "docker"
        seen, p = set(), ppid
        while p > 1 and p not in seen:  # walk up: under the run, or under a container shim
            seen.add(p)
            if p == self.root:
                return "engine"
            parent = table.get(p)
            if parent is None:
                break
            if parent[0].startswith("containerd-shim"):
                return "containers"
            p = parent[1]
        if comm.startswith(("containerd-shim", "runc", "docker-init")):
            return "containers"
        return "other"

    def _sample(self, first: bool = False) -> None:
        table = {}
        for name in os.listdir("/proc"):
            if name.isdigit() and (s := _stat(int(name))) is not None:
                table[int(name)] = s
        for pid, (comm, ppid, cpu) in table.items():
            if pid not in self._group:
                self._group[pid] = self._classify(pid, comm, ppid, table)
                # a process alive at the start counts from there; one born since, from its birth
                self._first[pid] = cpu if first else 0.0
            self._last[pid] = cpu
        for pid in [p for p in self._last if p not in table]:  # gone: keep what it had used
            self._done[self._group[pid]] += self._last.pop(pid) - self._first[pid]
        row = defaultdict(float, self._done)
        for pid, cpu in self._last.items():
            row[self._group[pid]] += cpu - self._first[pid]
        busy = machine_busy_s() - self._busy0
        row["unsampled"] = max(0.0, busy - sum(row[g] for g in GROUPS if g != "unsampled"))
        self.samples.append({"t": time.monotonic(), "progress": float(self.progress()), "busy": busy,
                             **{g: row[g] for g in GROUPS}})

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()


def window(samples: list[dict], start: float, end: float) -> dict[str, float] | None:
    """CPU seconds by group (and `busy`, `wall_s`) between the first sample whose progress
    reached `start` and the first that reached `end`; None if the series never got there."""
    a = next((s for s in samples if s["progress"] >= start), None)
    b = next((s for s in samples if s["progress"] >= end), None)
    if a is None or b is None or b["t"] <= a["t"]:
        return None
    out = {g: b[g] - a[g] for g in (*GROUPS, "busy")}
    out["wall_s"] = b["t"] - a["t"]
    return out


def count_lines(path) -> Callable[[], float]:
    """A progress callable: the lines a growing file (metrics.jsonl) has now."""
    def lines() -> float:
        try:
            with open(path, "rb") as f:
                return float(f.read().count(b"\n"))
        except OSError:
            return 0.0
    return lines
