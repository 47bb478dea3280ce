"""Weights by collective, the transport: every learner rank sends its share straight to the
engines' workers, over process groups of their own.

vLLM's own `nccl` weight-transfer backend has one sender (trainer rank 0) broadcast every
tensor, so a sharded learner must first gather the whole model on that rank. Here each learner
rank opens one process group per engine replica: {that rank, every worker of the replica}. Each
rank packs the tensors it is assigned into buckets and broadcasts them in its own group; each
worker receives every bucket, in a plan both sides share. The groups are torch's own
`ProcessGroupGloo` (bytes on the CPU) and `ProcessGroupNCCL` (bytes on the GPU), over a
TCPStore each learner rank hosts: the same code, only the backend differs.

The plan (`make_plan`) is made from the learner's stream of (HF name, tensor) — the same on
every rank, one tensor at a time, as the torch learner reads its state dict and the Megatron
learner's bridge exports it — and assigns each tensor to the rank with the fewest bytes so far,
so each rank sends about 1/ranks of the model and holds one bucket at a time. Buckets are
listed in the order the stream completes them (ties by rank), and each rank sends its own in
that order, so a worker receiving in plan order never waits on a rank that waits on it.

This module is torch only (the learner's side imports it); the engine's side, a vLLM
weight-transfer backend, is `agent/engines/vllm_collective.py`.
"""

from __future__ import annotations

import datetime
from typing import Any, Iterable

import torch
import torch.distributed as dist

DEFAULT_BUCKET_BYTES = 256 << 20
TRANSPORTS = ("gloo", "nccl")  # gloo: a bucket's bytes on the CPU; nccl: on the GPU


def default_transport() -> str:
    """NCCL between GPUs, gloo on CPU. (Colocated, a learner rank and an engine worker share a
    GPU, which one NCCL group cannot hold: runtime=ray says gloo, through the host, then.)"""
    return "nccl" if torch.cuda.is_available() else "gloo"


def device_of(transport: str) -> str:
    """Where a bucket's bytes are for this transport."""
    if transport not in TRANSPORTS:
        raise ValueError(f"weights by collective go by gloo or nccl, not {transport!r}")
    return "cuda" if transport == "nccl" else "cpu"


def open_group(host: str, port: int, prefix: str, rank: int, size: int, timeout_s: float,
               store: dist.Store | None = None, transport: str | None = None, local_host: str | None = None):
    """A process group of its own, beside whatever default group this process has (a learner's
    ranks, vLLM's tensor-parallel workers): gloo or NCCL (by default: NCCL where there are GPUs).
    Every member calls this at once; it returns when all have joined. The rendezvous is the
    learner rank's TCPStore at `host`:`port` (`store`: that rank's own, for itself); gloo binds
    this process's end to `local_host`, its node's address in the cluster (default `host`)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if store is None:
        store = dist.TCPStore(host, port, is_master=False, timeout=timeout, wait_for_workers=False)
    prefixed = dist.PrefixStore(prefix, store)
    if device_of(transport or default_transport()) == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(prefixed, rank, size, options)
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timeout
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=local_host or host)]
    return dist.ProcessGroupGloo(prefixed, rank, size, options)


def broadcast(group, tensor: torch.Tensor) -> None:
    """`tensor` from the group's rank 0 (the learner rank) to all its members, in place."""
    options = dist.BroadcastOptions()
    options.rootRank = 0
    group.broadcast([tensor], options).wait()


def make_plan(metas: Iterable[tuple[str, str, list[int]]], ranks: int,
              bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[dict[str, Any]]:
    """The buckets of one sync, in the order the stream completes them (ties by rank): each
    {sender, names, dtype_names, shapes, nbytes}. `metas`: the stream's (name, dtype name,
    shape), in its order. Each tensor goes to the rank with the fewest bytes so far (the lowest
    such rank on a tie); a rank's bucket closes once it holds `bucket_bytes` or more."""
    if ranks < 1:
        raise ValueError(f"a plan needs at least one sending rank, not {ranks}")
    assigned = [0] * ranks
    open_buckets: list[dict[str, Any]] = [_empty(r) for r in range(ranks)]
    plan: list[dict[str, Any]] = []
    for name, dtype_name, shape in metas:
        nbytes = torch.Size(shape).numel() * getattr(torch, dtype_name).itemsize
        r = min(range(ranks), key=lambda k: (assigned[k], k))
        assigned[r] += nbytes
        b = open_buckets[r]
        b["names"].append(name)
        b["dtype_names"].append(dtype_name)
        b["shapes"].append(list(shape))
        b["nbytes"] += nbytes
        if b["nbytes"] >= bucket_bytes:
            plan.append(b)
            open_buckets[r] = _empty(r)
    plan += [b for b in open_buckets if b["names"]]
    return plan


def _empty(sender: int) -> dict[str, Any]:
    return {"sender": sender, "names": [], "dtype_names": [], "shapes": [], "nbytes": 0}


def meta_of(name: str, tensor: torch.Tensor) -> tuple[str, str, list[int]]:
    return name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape)


def receive(groups: list, plan: list[dict[str, Any]], device: str):
    """An engine worker's side of one sync: every bucket of `plan`, in its order, from its
    sender's group (`groups[k]`: this worker's group with learner rank k); yields each bucket and
    its tensors (views into the bucket's buffer)."""
    for b in plan:
        buffer = torch.empty(int(b["nbytes"]), dtype=torch.uint8, device=device)
        broadcast(groups[int(b["sender"])], buffer)
        yield b, split(buffer, b)


def split(buffer: torch.Tensor, bucket: dict[str, Any]) -> list[tuple[str, torch.Tensor]]:
    """A received bucket's tensors: views into its buffer, by the plan's names, dtypes, shapes."""
    out, offset = [], 0
    for name, dtype_name, shape in zip(bucket["names"], bucket["dtype_names"], bucket["shapes"]):
        dtype = getattr(torch, dtype_name)
        size = torch.Size(shape).numel() * dtype.itemsize
        piece = buffer[offset: offset + size]
        if offset % dtype.itemsize:  # after a tensor of an odd byte count: a view needs its own alignment
            piece = piece.clone()
        out.append((name, piece.view(dtype).view(shape)))
        offset += size
    if offset != buffer.numel():
        raise ValueError(f"bucket of {len(bucket['names'])} tensors: {offset} bytes named, {buffer.numel()} received")
    return out


class BucketSender:
    """Learner side, one per rank: hosts the rank's store, opens its group with each replica,
    and sends the rank's buckets of a plan as the stream reaches them."""

    def __init__(self, rank: int, host: str, timeout_s: float = 600.0, transport: str | None = None):
        self.rank, self.host, self.timeout_s = rank, host, timeout_s
        self.transport = transport or default_transport()
        self.store = dist.TCPStore(host, 0, is_master=True, timeout=datetime.timedelta(seconds=timeout_s),
                                   wait_for_workers=False)
        self.groups: dict[int, Any] = {}  # replica -> its group with this rank

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.store.port

    def open(self, replica: int, prefix: str, workers: int) -> None:
        self.groups[replica] = open_group(self.host, self.store.port, prefix, 0, 1 + workers, self.timeout_s,
                                          store=self.store, transport=self.transport)

    def close(self, replica: int) -> None:
        self.groups.pop(replica, None)

    def send(self, stream: Iterable[tuple[str, torch.Tensor]], plan: list[dict[str, Any]],
             replicas: list[int]) -> dict[str, Any]:
        """Walks the whole stream (it may be a collective the other ranks walk too), packs this
        rank's tensors into their buckets and broadcasts each bucket to each replica once full.
        A replica whose broadcast fails is passed over for the rest (returned in `failed`).
        Returns bytes sent (to all replicas), the largest bucket held, and the failures."""
        mine = {name: i for i, b in enumerate(plan) if b["sender"] == self.rank for name in b["names"]}
        planned = {name for b in plan for name in b["names"]}
        filling: dict[int, dict[str, torch.Tensor]] = {}
        live = [r for r in replicas if r in self.groups]
        failed: dict[int, str] = {r: "no group opened" for r in replicas if r not in self.groups}
        sent = held = buckets = 0
        seen: set[str] = set()
        for name, tensor in stream:
            seen.add(name)
            if name not in planned:
                raise ValueError(f"the learner's weights hold {name!r}, which the plan lacks: the plan was made "
                                 "for another model")
            i = mine.get(name)
            if i is None:
                continue
            b = plan[i]
            k = b["names"].index(name)
            if [str(tensor.dtype).removeprefix("torch."), list(tensor.shape)] != [b["dtype_names"][k], b["shapes"][k]]:
                raise ValueError(f"{name}: {tensor.dtype} {list(tensor.shape)} in the learner, "
                                 f"{b['dtype_names'][k]} {b['shapes'][k]} in the plan")
            filling.setdefault(i, {})[name] = tensor
            if len(filling[i]) == len(b["names"]):
                buffer = self._pack(b, filling.pop(i), device_of(self.transport))
                held, buckets = max(held, buffer.numel()), buckets + 1
                for r in list(live):
                    try:
                        broadcast(self.groups[r], buffer)
                        sent += buffer.numel()
                    except Exception as e:  # that replica died or hung: the others go on
                        live.remove(r)
                        failed[r] = f"{type(e).__name__}: {e}"
                        self.groups.pop(r, None)
                del buffer
        if buckets != sum(b["sender"] == self.rank for b in plan):
            missing = sorted(set(mine) - seen)
            raise ValueError(f"the learner's weights lack {', '.join(missing[:5])} (in the plan)")
        return {"sent_bytes": sent, "held_bytes": held, "failed": failed}

    @staticmethod
    def _pack(bucket: dict[str, Any], tensors: dict[str, torch.Tensor], device: str) -> torch.Tensor:
        flat = [tensors[n].detach().to(device).contiguous().reshape(-1).view(torch.uint8) for n in bucket["names"]]
        return torch.cat(flat) if flat else torch.empty(0, dtype=torch.uint8, device=device)
