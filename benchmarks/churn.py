"""Sandboxes made, used and removed one after another, a thousand and more, on the engine
DOCKER_HOST names: whether creating and removing stay flat as the count grows, what the
machine's kernel spends meanwhile and after, and whether the disk bound is still exact at the end.

    python -m benchmarks.sandbox --churn 1000 [--concurrency 4] [--after 60]
                                 [--disk-mb 4096] [--write-mb 6144] [--output FILE]

(`benchmarks.sandbox --churn` runs `main` here.) `--concurrency` threads each make a
`DockerSandbox` with the default limits (as a rollout does), run two commands in it (fifty small
files and 2 MB written into the workspace, then read back), and remove it, back to back, until
`--churn` sandboxes have been made: the main job's pattern (a sandbox per rollout and one per
grade, removed at the end of each) at the rate the engine allows. For every hundred sandboxes
it reports create and remove p50/p95 and the machine's system CPU share (from /proc/stat) while
they ran; then the system CPU over the `--after` seconds after the last removal (on btrfs with
qgroups a backlog of deleted subvolumes keeps the kernel busy long after); then one sandbox
limited to `--disk-mb` writes `--write-mb` with dd (benchmarks/disk_bound.py's `one`): what it
leaves is the bound's exactness after the churn. The result goes into the JSON `--output`
(benchmarks/results/sandbox_churn.json) under the engine's label (its storage driver and
bound), so the engines sit side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks.disk_bound import one as disk_write
from benchmarks.common import percentile
from sandbox.base import Limits
from sandbox.docker import DockerSandbox, client, no_quota_why, quota_fs

RESULTS = Path(__file__).resolve().parent / "results" / "sandbox_churn.json"
USE = ("for i in $(seq 1 50); do echo $i > f$i; done; head -c 2M /dev/urandom > blob", "cat f* | wc -l; ls -l blob")


class SysCPU:
    """The machine's CPU split sampled from /proc/stat every `every` seconds in a thread:
    `share(t0, t1)` is the fraction of all CPU time in [t0, t1] spent in the kernel (system, irq,
    softirq), `busy(t0, t1)` the fraction not idle (nor iowait)."""

    def __init__(self, every: float = 1.0):
        self.every, self.samples, self._stop = every, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def read() -> tuple[float, int, int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        _user, _nice, system, idle, iowait, irq, softirq = fields[:7]
        return time.monotonic(), sum(fields[:8]), system + irq + softirq, idle + iowait

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.read())
            self._stop.wait(self.every)

    def __enter__(self) -> "SysCPU":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(self.read())

    def _span(self, t0: float, t1: float):
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        if len(inside) < 2:
            before = [s for s in self.samples if s[0] <= t0][-1:] or self.samples[:1]
            after = [s for s in self.samples if s[0] >= t1][:1] or self.samples[-1:]
            inside = before + after
        return inside[0], inside[-1]

    def share(self, t0: float, t1: float) -> float:
        a, b = self._span(t0, t1)
        return (b[2] - a[2]) / max(1, b[1] - a[1])

    def busy(self, t0: float, t1: float) -> float:
        a, b = self._span(t0, t1)
        return 1 - (b[3] - a[3]) / max(1, b[1] - a[1])


def churn(n: int, concurrency: int, dc, run_id: str, console: Console) -> list[dict]:
    """`n` sandbox lifecycles in `concurrency` threads; one row per sandbox, in the order made."""
    rows: list[dict] = []
    lock = threading.Lock()
    counter = iter(range(n))

    def worker() -> None:
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            t0 = time.monotonic()
            sb = DockerSandbox(limits=Limits(), run_id=run_id, docker_client=dc)
            t1 = time.monotonic()
            try:
                for cmd in USE:
                    r = sb.exec(cmd, timeout=120)
                    if not r.ok:
                        raise RuntimeError(f"sandbox {i}: `{cmd}` failed: {r.describe()}: {r.output[-300:]}")
            finally:
                t2 = time.monotonic()
                sb.close()
                t3 = time.monotonic()
            with lock:
                rows.append({"i": i, "start": t0, "end": t3, "create_s": t1 - t0, "use_s": t2 - t1, "remove_s": t3 - t2})
                if len(rows) % 100 == 0:
                    console.print(f"{len(rows)} of {n} sandboxes: last hundred create p50 "
                                  f"{statistics.median(x['create_s'] for x in rows[-100:]):.2f} s, remove p50 "
                                  f"{statistics.median(x['remove_s'] for x in rows[-100:]):.2f} s")

    with ThreadPoolExecutor(concurrency) as ex:
        for f in [ex.submit(worker) for _ in range(concurrency)]:
            f.result()
    return sorted(rows, key=lambda x: x["i"])


def engine_label(dc) -> str:
    info = dc.info()
    fs = quota_fs(dc)
    return f"{info.get('Driver')}, " + (f"quota ({fs})" if fs else "watch")


def measure(n: int, concurrency: int, after_s: float, disk_mb: int, write_mb: int, console: Console) -> dict:
    dc = client()
    label = engine_label(dc)
    run_id = f"bench-churn-{uuid.uuid4().hex[:6]}"
    console.print(f"engine: {label}; {n} sandboxes, {concurrency} at a time")
    with SysCPU() as cpu:
        t_start = time.monotonic()
        rows = churn(n, concurrency, dc, run_id, console)
        t_end = time.monotonic()
        console.print(f"churn done in {t_end - t_start:.0f} s; sampling the machine {after_s:g} s more")
        time.sleep(after_s)
        t_after = time.monotonic()
    hundreds = []
    for k in range(0, n, 100):
        part = rows[k:k + 100]
        t0, t1 = min(x["start"] for x in part), max(x["end"] for x in part)
        hundreds.append({
            "sandboxes": f"{k + 1}-{k + len(part)}",
            "create_p50_s": percentile([x["create_s"] for x in part], 50),
            "create_p95_s": percentile([x["create_s"] for x in part], 95),
            "remove_p50_s": percentile([x["remove_s"] for x in part], 50),
            "remove_p95_s": percentile([x["remove_s"] for x in part], 95),
            "use_p50_s": percentile([x["use_s"] for x in part], 50),
            "sys_cpu": cpu.share(t0, t1), "busy_cpu": cpu.busy(t0, t1), "seconds": t1 - t0})
    leak = disk_write(dc, disk_mb, write_mb, run_id)
    return {
        "engine": label, "sandboxes": n, "concurrency": concurrency, "wall_s": t_end - t_start,
        "sandboxes_per_s": n / (t_end - t_start), "no_quota_why": no_quota_why(dc) or None,
        "hundreds": hundreds,
        "sys_cpu_during": cpu.share(t_start, t_end), "sys_cpu_after": cpu.share(t_end, t_after),
        "busy_cpu_after": cpu.busy(t_end, t_after), "after_s": after_s,
        "disk": {"disk_mb": disk_mb, "write_mb": write_mb, "written_mb": leak["written_mb"],
                 "overshoot_mb": leak["overshoot_mb"], "bound": leak["bound"], "said": leak["said"],
                 "seconds": leak["seconds"]},
        "load_end": [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]],
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release()},
        "engine_version": dc.version().get("Version"),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "rows": [{k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()} for r in rows],
    }


def table(result: dict) -> Table:
    t = Table("sandboxes", "create p50 s", "create p95 s", "remove p50 s", "remove p95 s", "system CPU", "busy CPU",
              title=f"{result['sandboxes']} sandboxes on {result['engine']}, {result['concurrency']} at a time: "
                    f"{result['sandboxes_per_s']:.2f} a second")
    for h in result["hundreds"]:
        t.add_row(h["sandboxes"], f"{h['create_p50_s']:.2f}", f"{h['create_p95_s']:.2f}", f"{h['remove_p50_s']:.2f}",
                  f"{h['remove_p95_s']:.2f}", f"{h['sys_cpu']:.0%}", f"{h['busy_cpu']:.0%}")
    t.add_row(f"{result['after_s']:g} s after", "", "", "", "", f"{result['sys_cpu_after']:.0%}",
              f"{result['busy_cpu_after']:.0%}")
    return t


def main(argv: list[str] | None = None, prog: str = "python -m benchmarks.sandbox --churn") -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("--churn", type=int, required=True, help="sandboxes to make, use and remove (1000)")
    p.add_argument("--concurrency", type=int, default=4, help="threads making sandboxes at once")
    p.add_argument("--after", type=float, default=60.0, help="seconds the machine is watched after the last removal")
    p.add_argument("--disk-mb", type=int, default=4096, help="the final write's sandbox limit")
    p.add_argument("--write-mb", type=int, default=6144, help="what the final write tries to write")
    p.add_argument("--output", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.churn < 1 or args.concurrency < 1 or args.after < 0:
        p.error(f"--churn and --concurrency must be at least 1 and --after >= 0, got {args.churn}, "
                f"{args.concurrency}, {args.after}")
    if args.write_mb <= args.disk_mb:
        p.error(f"--write-mb ({args.write_mb}) must pass --disk-mb ({args.disk_mb}) to try the bound")
    console = Console(stderr=True)
    result = measure(args.churn, args.concurrency, args.after, args.disk_mb, args.write_mb, console)
    Console(width=120).print(table(result))
    d = result["disk"]
    Console().print(f"then {d['write_mb']} MB written under {d['disk_mb']} MB ({d['bound']}): {d['written_mb']:.0f} MB "
                    f"stayed ({d['overshoot_mb']:+.0f} MB), {d['said']}")
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        saved = json.loads(args.output.read_text()) if args.output.exists() else {}
        saved[result["engine"]] = result
        args.output.write_text(json.dumps(saved, indent=1))
        Console(stderr=True).print(f"written to {args.output} under {result['engine']!r}")
    return 0
