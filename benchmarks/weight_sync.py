"""Weight sync by the object store against by collective, for synthetic models, side by side.

    python -m benchmarks.weight_sync --sizes 0.5 2 8 --output benchmarks/results/weight_sync.json

Each size is a model of that many GB (float32 tensors of 64 MB, and a few small ones) sharded
over two learner ranks (Ray actors) as pipeline stages hold it: each tensor on one rank. One
actor stands for an engine replica's worker. A sync walks the model as the Megatron bridge's
export does (each tensor passed from its holder to every rank, over the ranks' gloo group), and
then, by the path:
- `object_store` (ray.weight_sync=object_store): rank 0 keeps every tensor, puts the list in Ray's
  object store, the engine's actor fetches it;
- `collective` (ray.weight_sync=collective, the default): each rank packs its share of the plan
  into buckets and broadcasts them to the engine's worker (agent/engines/collective.py,
  the code a run uses).
The engine side drops each tensor once it has it, as a worker's `load_weights` copies it into
its own weights. Measured: seconds a sync (two syncs, the second reported: the first opens the
groups), and how far learner rank 0's resident memory rose during it above where it stood
(sampled every 5 ms in the rank). The shards are zero-filled tensors the
kernel maps lazily, so the machine holds what each path allocates and copies, not the model
twice over; each path writes every byte it moves.
"""

from __future__ import annotations

import argparse
import os
import socket
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from benchmarks.common import write_result

TENSOR_BYTES = 64 << 20
SMALL = [(f"model.norm{i}.weight", (4096,)) for i in range(4)]  # the small ones a model also has


def shapes(gb: float) -> list[tuple[str, tuple[int, ...]]]:
    """Tensors of 64 MB (of an eighth of the model, where that is less), and the small ones."""
    size = min(TENSOR_BYTES, int(gb * (1 << 30) / 8))
    rows = max(1, size // 4 // 4096)
    n = max(1, round(gb * (1 << 30) / (rows * 4096 * 4)))
    return [(f"model.layers.{i}.weight", (rows, 4096)) for i in range(n)] + SMALL


class PeakRSS:
    """The most this process's resident set grew above its size at entry, sampled every 5 ms."""

    def __enter__(self):
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.start = self.peak = self._rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def _sample(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self._rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())

    @property
    def grew(self) -> int:
        return self.peak - self.start


class Rank:
    """One learner rank: its stage's tensors (every `world`-th), the export walk, both paths."""

    def __init__(self, rank: int, world: int, master: tuple[str, int], gb: float):
        os.environ.update(MASTER_ADDR=master[0], MASTER_PORT=str(master[1]))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        self.rank, self.world = rank, world
        self.shapes = shapes(gb)
        self.held = {name: torch.zeros(shape) for i, (name, shape) in enumerate(self.shapes) if i % world == rank}
        self.sender = None

    def walk(self):
        """Every tensor on every rank, one at a time, from its holder (the bridge's pipeline broadcast)."""
        for i, (name, shape) in enumerate(self.shapes):
            tensor = self.held[name] if i % self.world == self.rank else torch.empty(shape)
            dist.broadcast(tensor, src=i % self.world)
            yield name, tensor

    def object_store(self):
        import ray

        with PeakRSS() as rss:
            kept = [(n, t.clone() if self.rank == 0 else None) for n, t in self.walk()]
            ref = ray.put(kept) if self.rank == 0 else None
            del kept
        return [ref] if ref is not None else None, rss.grew

    def sender_address(self):
        from agent.engines.collective import BucketSender

        self.sender = BucketSender(self.rank, "127.0.0.1", 600)
        return self.sender.address

    def open(self, prefix: str):
        self.sender.open(0, prefix, 1)

    def plan(self, bucket_bytes: int):
        from agent.engines.collective import make_plan

        return make_plan([(n, "float32", list(s)) for n, s in self.shapes], self.world, bucket_bytes)

    def collective(self, plan):
        with PeakRSS() as rss:
            out = self.sender.send(self.walk(), plan, [0])
        return out, rss.grew


class Engine:
    """An engine replica's worker: takes every tensor of a sync, drops it once it has it."""

    def object_store(self, box) -> int:
        import ray

        tensors = ray.get(box[0])
        n = sum(t.numel() * t.element_size() for _, t in tensors)
        del tensors
        return n

    def open(self, senders, prefix: str):
        from agent.engines.collective import open_group

        self.groups = [open_group(h, p, prefix, 1, 2, 600) for h, p in senders]

    def collective(self, plan) -> int:
        from agent.engines.collective import receive

        return sum(t.numel() * t.element_size() for _, tensors in receive(self.groups, plan, "cpu") for _, t in tensors)


def available_bytes() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))


def measure(gb: float, bucket_mb: int, done: list[dict], syncs: int = 2) -> dict:
    import ray

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        master = ("127.0.0.1", s.getsockname()[1])
    ranks = [ray.remote(Rank).options(num_cpus=0).remote(k, 2, master, gb) for k in range(2)]
    engine = ray.remote(Engine).options(num_cpus=0).remote()
    model = sum(torch.Size(s).numel() * 4 for _, s in shapes(gb))
    out = {"model_gb": model / (1 << 30), "tensors": len(shapes(gb))}
    available = available_bytes()
    try:
        # by the object store: skipped where rank 0's growth, ~3x the model at the smaller sizes
        # (the kept copy, its serialization, the store's pages), would not fit in what is free
        ratio = max((r["object_store"]["rank0_peak_gb"] / r["model_gb"] for r in done if "sync_s" in r["object_store"]),
                    default=3.0)
        if ratio * model > available:
            out["object_store"] = {"skipped": f"rank 0 would grow by about {ratio * model / (1 << 30):.1f} GB "
                                              f"({ratio:.1f}x the model, as measured at the smaller sizes); "
                                              f"{available / (1 << 30):.1f} GB were free"}
        for _ in range(syncs if "skipped" not in out.get("object_store", {}) else 0):
            results = None  # the last sync's object goes from the store first
            t0 = time.monotonic()
            results = ray.get([r.object_store.remote() for r in ranks])
            got = ray.get(engine.object_store.remote(results[0][0]))
            seconds = time.monotonic() - t0
            assert got == model, (got, model)
            out["object_store"] = {"sync_s": seconds, "rank0_peak_gb": results[0][1] / (1 << 30),
                                   "rank0_sent_gb": model / (1 << 30), "rank1_sent_gb": 0.0}
        # by collective
        senders = ray.get([r.sender_address.remote() for r in ranks])
        ray.get([engine.open.remote(senders, "bench"), *[r.open.remote("bench") for r in ranks]])
        plan = ray.get(ranks[0].plan.remote(bucket_mb << 20))
        for _ in range(syncs):
            t0 = time.monotonic()
            receiving = engine.collective.remote(plan)
            results = ray.get([r.collective.remote(plan) for r in ranks])
            got = ray.get(receiving)
            seconds = time.monotonic() - t0
            assert got == model, (got, model)
        out["collective"] = {"sync_s": seconds, "rank0_peak_gb": results[0][1] / (1 << 30),
                             "rank0_sent_gb": results[0][0]["sent_bytes"] / (1 << 30),
                             "rank1_sent_gb": results[1][0]["sent_bytes"] / (1 << 30),
                             "rank0_held_bucket_gb": results[0][0]["held_bytes"] / (1 << 30), "buckets": len(plan)}
    finally:
        for a in [*ranks, engine]:
            ray.kill(a)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=float, nargs="+", default=[0.5, 2, 8], help="model sizes, GB")
    p.add_argument("--bucket-mb", type=int, default=256, help="bucket size (engine.options.bucket_mb)")
    p.add_argument("--output", type=Path, help="where the JSON result goes")
    p.add_argument("--address", help="a running Ray cluster's (default: a Ray instance of its own)")
    p.add_argument("--node-ip-address", help="this machine's address in that cluster (127.0.0.1 in tests)")
    args = p.parse_args(argv)
    import ray

    own = {"num_cpus": 4, "include_dashboard": False} if args.address is None else {}
    ray.init(address=args.address or "local", log_to_driver=True, namespace="weight-sync-benchmark",
             runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}},
             **({"_node_ip_address": args.node_ip_address} if args.node_ip_address else {}), **own)
    try:
        rows = []
        for gb in args.sizes:
            row = measure(gb, args.bucket_mb, rows)
            o, c = row["object_store"], row["collective"]
            said = (f"object store {o['sync_s']:.2f} s, rank 0 +{o['rank0_peak_gb']:.2f} GB" if "sync_s" in o
                    else f"object store not run: {o['skipped']}")
            print(f"{row['model_gb']:.2f} GB: {said}; collective {c['sync_s']:.2f} s, rank 0 +{c['rank0_peak_gb']:.2f} GB",
                  flush=True)
            rows.append(row)
    finally:
        ray.shutdown()
    write_result({"benchmark": "weight_sync", "bucket_mb": args.bucket_mb, "cpus": os.cpu_count(),
                  "load_1min_at_end": os.getloadavg()[0], "rows": rows}, args.output)


if __name__ == "__main__":
    main()
