"""The collectives the learners use over torch.distributed (NCCL on GPUs, gloo on CPU): this
process's rank, joining the group, the split of a batch's rows over ranks, and sums of
gradients and metrics. In one process each is a no-op.

Gradients are summed over ranks before clipping; since every loss is already divided by the
*whole* batch's sampled token count, the sum is exactly the one-process gradient, and all
data-parallel replicas stay identical (`replica_spread` checks it). How ranks are started and
driven is the runtime's (training/runtime/).
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from dataclasses import dataclass

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)
BUCKET_ELEMENTS = 1 << 24  # gradients are summed in flat buckets of this many elements


@dataclass(frozen=True)
class Rank:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def current() -> Rank:
    """This process's place in the group (rank 0 of 1 when torch.distributed is not running)."""
    if dist.is_available() and dist.is_initialized():
        return Rank(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))
    return Rank()


def init_from_env(timeout_s: float | None = None) -> Rank:
    """Join the process group torchrun describes (WORLD_SIZE > 1); otherwise one process.
    `timeout_s`: how long a collective may wait (None: torch's default, 10 minutes for NCCL)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        timeout = {"timeout": timedelta(seconds=timeout_s)} if timeout_s else {}
        dist.init_process_group(backend, **timeout)
        log.info("rank %d of %d (%s)", dist.get_rank(), world, backend)
    return current()


def broadcast_object(obj):
    """Rank 0's `obj` on every rank."""
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def shard_rows(lengths: list[int], rank: int, world: int) -> list[int]:
    """The rows (by index) this rank trains on: longest first, each to the rank with the fewest
    tokens so far (ties to the lower rank), so every rank gets a like share of the work.
    Deterministic: every rank computes the same split."""
    load = [0] * world
    owner = [0] * len(lengths)
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        r = min(range(world), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += lengths[i]
    return [i for i in range(len(lengths)) if owner[i] == rank]


def sum_(t: torch.Tensor) -> torch.Tensor:
    """All-reduce (sum) in place; a no-op in one process."""
    if current().world > 1:
        dist.all_reduce(t)
    return t


def sum_gradients(module: torch.nn.Module) -> None:
    """Sum every trainable parameter's gradient over ranks, in flat buckets. A rank with no
    rows this step has no gradients yet: it contributes zeros."""
    if current().world == 1:
        return
    params = [p for p in module.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    bucket: list[torch.Tensor] = []
    size = 0
    for p in params + [None]:
        if p is not None:
            bucket.append(p.grad)
            size += p.grad.numel()
        if bucket and (p is None or size >= BUCKET_ELEMENTS):
            flat = torch.cat([g.reshape(-1) for g in bucket])
            dist.all_reduce(flat)
            offset = 0
            for g in bucket:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()
            bucket, size = [], 0


def sum_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Per-rank partial sums (token-weighted by the whole batch) summed over ranks; a key a
    rank lacks counts 0 there."""
    if current().world == 1:
        return metrics
    parts: list[dict[str, float]] = [{} for _ in range(current().world)]
    dist.all_gather_object(parts, dict(metrics))
    keys = sorted({k for p in parts for k in p})
    return {k: sum(p.get(k, 0.0) for p in parts) for k in keys}


def replica_spread(learner) -> float:
    """How far the replicas' weights are apart: the spread over ranks of a per-rank fingerprint
    (the sum of every weight, in float64). 0 when every rank holds the same model, as it must;
    a replica that missed a load or an update shows here."""
    modules = [m for m in (learner.policy, getattr(learner, "critic", None)) if m is not None]
    device = next(modules[0].parameters()).device
    mine = torch.tensor([sum(p.detach().double().sum().item() for p in m.parameters()) for m in modules],
                        dtype=torch.float64, device=device)
    every = [torch.zeros_like(mine) for _ in range(current().world)]
    dist.all_gather(every, mine)
    stacked = torch.stack(every)
    return float((stacked.max(0).values - stacked.min(0).values).max())
