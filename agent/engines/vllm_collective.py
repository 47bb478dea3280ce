"""The engine's side of weights by collective (agent/engines/collective.py): a vLLM
weight-transfer backend, `collective`, registered by the project's vLLM plugin as `inline` is.
In each of a replica's workers it joins a group per learner rank (`init_weight_transfer_engine`)
and, at each sync, receives every bucket of the plan from its sender and loads it through the
model's `load_weights` inside vLLM's layerwise reload. The plan travels in the update request
through vLLM's engine-core messaging (names, dtypes, shapes); the bytes by the collective only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from agent.engines.collective import default_transport, device_of, open_group, receive
from agent.engines.vllm_reload import LayerwiseReload

BACKEND = "collective"


@dataclass
class CollectiveInitInfo(WeightTransferInitInfo):
    """One replica's workers join a group per learner rank: `senders[k]` is rank k's store
    (host, port); `prefix` names this round of groups (a replica started anew joins new ones)."""

    senders: list[list[Any]]
    prefix: str
    workers: int
    timeout_s: float = 600.0
    transport: str = ""  # gloo | nccl; empty: NCCL where there are GPUs
    host: str = ""  # this replica's node address, where gloo binds (empty: the sender's, one machine)


@dataclass
class CollectiveUpdateInfo(WeightTransferUpdateInfo):
    """One sync's buckets (`make_plan`), received in order."""

    buckets: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self):
        for i, b in enumerate(self.buckets):
            missing = {"sender", "names", "dtype_names", "shapes", "nbytes"} - set(b)
            if missing:
                raise ValueError(f"bucket {i} of the plan lacks {', '.join(sorted(missing))}")
            if not len(b["names"]) == len(b["dtype_names"]) == len(b["shapes"]):
                raise ValueError(f"bucket {i}: {len(b['names'])} names, {len(b['dtype_names'])} dtypes, "
                                 f"{len(b['shapes'])} shapes")


class CollectiveWeightTransferEngine(LayerwiseReload,
                                     WeightTransferEngine[CollectiveInitInfo, CollectiveUpdateInfo]):
    """Worker side: joins a group per learner rank, receives every bucket of the plan from its
    sender, loads it (vLLM's layerwise reload around the whole sync, as its NCCL backend)."""

    init_info_cls = CollectiveInitInfo
    update_info_cls = CollectiveUpdateInfo

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.groups: list = []
        self.transport = default_transport()
        self.received_bytes = 0

    def init_transfer_engine(self, init_info: CollectiveInitInfo) -> None:
        parallel = self.vllm_config.parallel_config
        rank = 1 + parallel.rank  # the learner rank is 0 in each group; this replica's workers follow
        if parallel.world_size != init_info.workers:
            raise ValueError(f"the plan says {init_info.workers} worker(s) a replica; this engine has {parallel.world_size}")
        self.transport = init_info.transport or default_transport()
        self.groups = [open_group(host, int(port), init_info.prefix, rank, 1 + init_info.workers, init_info.timeout_s,
                                  transport=self.transport, local_host=init_info.host or None)
                       for host, port in init_info.senders]

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # the base class ends with torch.accelerator.synchronize(), which a CPU build lacks;
        # each bucket's broadcast is waited for before it is loaded
        self.receive_weights(self.parse_update_info(update_info))
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # (the loads into the model's GPU tensors)

    def receive_weights(self, update_info: CollectiveUpdateInfo) -> None:
        if not self.groups:
            raise RuntimeError("weights by collective before the groups were opened (init_weight_transfer_engine)")
        tied = bool(getattr(self.model_config.hf_config, "tie_word_embeddings", False))
        names = {n for b in update_info.buckets for n in b["names"]}
        alias_head = tied and "lm_head.weight" not in names  # vLLM keeps its own copy of a tied head
        self.received_bytes = 0
        for b, tensors in receive(self.groups, update_info.buckets, device_of(self.transport)):
            if alias_head:
                tensors += [("lm_head.weight", t) for n, t in tensors if n == "model.embed_tokens.weight"]
            self.model.load_weights(tensors)
            self.received_bytes += int(b["nbytes"])

    def shutdown(self) -> None:
        self.groups = []
