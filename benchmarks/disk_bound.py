"""How far past its disk limit a sandbox gets: one `dd` writing more than `Limits.disk_mb` into
the workspace, on the engine DOCKER_HOST names, under the bound in force there (a quota, or the
watch; see sandbox/docker.py).

    python -m benchmarks.disk_bound [--quick] [--disk-mb 4096] [--write-mb 6144] [--repeats 3]
                                    [--output FILE]

Each repeat is a fresh sandbox that runs `dd if=/dev/zero of=/testbed/fill bs=1M count=WRITE`;
what it wrote is the file's size (`stat`; dd reports nothing when the watch kills it) and its
blocks (`du`), beside the container's writable layer as the engine measures it (SizeRw).
`overshoot_mb` is the file's size less the limit (negative: it was stopped short of it; a
quota on btrfs also counts the image's metadata, see sandbox/docker.py `_quota_size_mb`). The
machine's load (`/proc/loadavg`) is taken before and after. Prints a table and adds the result,
under its bound ("quota" or "watch"), to the JSON `--output` (benchmarks/results/disk_bound.json),
so the two engines' runs sit side by side. `--quick`: 1,024 MB under 256 MB, one repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import time
import uuid
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sandbox.base import Limits
from sandbox.docker import DockerSandbox, client

RESULTS = Path(__file__).resolve().parent / "results" / "disk_bound.json"


def load() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def one(dc, disk_mb: int, write_mb: int, run_id: str) -> dict:
    """One sandbox, one dd of `write_mb` under `disk_mb`: what got written."""
    with DockerSandbox(limits=Limits(disk_mb=disk_mb), run_id=run_id, docker_client=dc) as sb:
        load_before = load()
        t0 = time.monotonic()
        r = sb.exec(f"dd if=/dev/zero of=/testbed/fill bs=1M count={write_mb}; echo dd_exit=$?", timeout=1800)
        seconds = time.monotonic() - t0
        load_after = load()
        size = sb.exec("stat -c %s /testbed/fill; du -k /testbed/fill | cut -f1", timeout=120).output.split()
        api = dc.api
        info = api._result(api._get(api._url("/containers/{0}/json", sb.id), params={"size": 1}), True)
        dd_said = re.search(r"^(\d+) bytes", r.output, re.M)
        return {
            "bound": sb.disk_bound,
            "quota_fs": sb.quota_fs or None,
            "written_mb": int(size[0]) / 2**20,
            "blocks_mb": int(size[1]) / 1024,
            "layer_mb": (info.get("SizeRw") or 0) / 2**20,
            "dd_reported_mb": int(dd_said.group(1)) / 2**20 if dd_said else None,  # None: killed before it said
            "overshoot_mb": int(size[0]) / 2**20 - disk_mb,
            "seconds": seconds,
            "disk_full_mb": r.disk_full_mb,
            "said": r.describe(),
            "dd_output_tail": r.output[-300:],
            "load_before": load_before,
            "load_after": load_after,
        }


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.disk_bound", description=__doc__.split("\n\n")[0])
    p.add_argument("--disk-mb", type=int, default=4096, help="the sandbox's disk limit (Limits.disk_mb)")
    p.add_argument("--write-mb", type=int, default=6144, help="what dd tries to write")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="1,024 MB under 256 MB, once (for a test)")
    p.add_argument("--output", type=Path, default=RESULTS)
    args = p.parse_args()
    if args.quick:
        args.disk_mb, args.write_mb, args.repeats = 256, 1024, 1
    dc = client()
    engine = dc.info()
    run_id = f"bench-disk-{uuid.uuid4().hex[:6]}"
    runs = [one(dc, args.disk_mb, args.write_mb, run_id) for _ in range(args.repeats)]
    bound = runs[0]["bound"]
    result = {
        "bound": bound,
        "quota_fs": runs[0]["quota_fs"],
        "disk_mb": args.disk_mb,
        "write_mb": args.write_mb,
        "command": f"dd if=/dev/zero of=/testbed/fill bs=1M count={args.write_mb}",
        "overshoot_mb_max": max(r["overshoot_mb"] for r in runs),
        "overshoot_mb_mean": sum(r["overshoot_mb"] for r in runs) / len(runs),
        "runs": runs,
        "engine": {"host": os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock"), "driver": engine.get("Driver"),
                   "driver_status": engine.get("DriverStatus"), "version": engine.get("ServerVersion")},
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                    "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)},
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    table = Table(title=f"dd of {args.write_mb} MB under a {args.disk_mb} MB limit: bound {bound}"
                        + (f" ({result['quota_fs']})" if result["quota_fs"] else ""))
    for col in ("run", "written MB", "overshoot MB", "layer MB", "seconds", "load before", "said"):
        table.add_column(col)
    for i, r in enumerate(runs):
        table.add_row(str(i), f"{r['written_mb']:.0f}", f"{r['overshoot_mb']:+.0f}", f"{r['layer_mb']:.0f}",
                      f"{r['seconds']:.1f}", " ".join(f"{x:.2f}" for x in r["load_before"]),
                      "disk full" if r["disk_full_mb"] else r["said"])
    Console().print(table)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        saved = json.loads(args.output.read_text()) if args.output.exists() else {}
        saved[bound + ("-quick" if args.quick else "")] = result
        args.output.write_text(json.dumps(saved, indent=1))
        print(f"written to {args.output} under {bound + ('-quick' if args.quick else '')!r}")


if __name__ == "__main__":
    main()
