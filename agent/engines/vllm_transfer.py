"""vLLM weight transfer where there is no NCCL and no CUDA IPC: the `inline` backend.

vLLM's weight-transfer API (`WeightTransferConfig`, `init_weight_transfer_engine`,
`start_weight_update` / `update_weights` / `finish_weight_update`) moves a trainer's weights
into running engines in buckets, through a pluggable backend: `nccl` between GPUs, `ipc`
between processes on one GPU. On a CPU machine neither works, so this backend carries each
bucket's bytes in the update request itself, over vLLM's own engine-core messaging; everything
around it (the bucket protocol, the layerwise reload, the weight version each token records)
is vLLM's. Both halves follow vLLM's interfaces: the worker side (`InlineWeightTransferEngine`)
and the trainer side (`InlineTrainerWeightTransferEngine`, driven by
`WeightTransferTrainerFactory.trainer_init` like vLLM's own).

vLLM builds the worker side inside its engine-core process, so the backend is registered by a
`vllm.general_plugins` entry point (pyproject.toml), which vLLM runs in every process it starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Iterable, Iterator

import torch
from vllm.distributed.weight_transfer.base import (
    ParamMeta,
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightSource,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from agent.engines.vllm_reload import LayerwiseReload

BACKEND = "inline"
DEFAULT_BUCKET_BYTES = 256 << 20


@dataclass
class InlineInitInfo(WeightTransferInitInfo):
    """Nothing to rendezvous: the bytes ride the update requests."""


@dataclass
class InlineTrainerInitInfo(TrainerInitInfo):
    backend: ClassVar[str] = BACKEND
    bucket_bytes: int = DEFAULT_BUCKET_BYTES


@dataclass
class InlineUpdateInfo(WeightTransferUpdateInfo):
    """One bucket: the tensors' names, dtypes and shapes, and their bytes end to end."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    buffer: bytes

    def __post_init__(self):
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(f"a bucket needs one dtype and one shape per name: {len(self.names)} names, "
                             f"{len(self.dtype_names)} dtypes, {len(self.shapes)} shapes")


def pack(bucket: list[tuple[str, torch.Tensor]]) -> dict[str, Any]:
    """A bucket of named tensors as an `InlineUpdateInfo` dict (bytes as raw as they are held)."""
    flat = [t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8) for _, t in bucket]
    return {"names": [n for n, _ in bucket], "dtype_names": [str(t.dtype).removeprefix("torch.") for _, t in bucket],
            "shapes": [list(t.shape) for _, t in bucket], "buffer": torch.cat(flat).numpy().tobytes() if flat else b""}


def unpack(info: InlineUpdateInfo) -> list[tuple[str, torch.Tensor]]:
    flat = torch.frombuffer(bytearray(info.buffer), dtype=torch.uint8) if info.buffer else torch.empty(0, dtype=torch.uint8)
    out, offset = [], 0
    for name, dtype_name, shape in zip(info.names, info.dtype_names, info.shapes):
        dtype = getattr(torch, dtype_name)
        size = torch.Size(shape).numel() * dtype.itemsize
        out.append((name, flat[offset: offset + size].view(dtype).view(shape)))
        offset += size
    if offset != len(flat):
        raise ValueError(f"bucket of {len(info.names)} tensors: {offset} bytes named, {len(flat)} sent")
    return out


class InlineWeightTransferEngine(LayerwiseReload, WeightTransferEngine[InlineInitInfo, InlineUpdateInfo]):
    """Worker side: each bucket is loaded through the model's `load_weights` inside vLLM's
    layerwise reload (started and finished around the buckets, as vLLM's IPC backend does)."""

    init_info_cls = InlineInitInfo
    update_info_cls = InlineUpdateInfo

    def init_transfer_engine(self, init_info: InlineInitInfo) -> None:
        pass

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # the base class ends with torch.accelerator.synchronize(), which a CPU build lacks;
        # loading here is synchronous, so there is nothing to wait for
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: InlineUpdateInfo) -> None:
        self.model.load_weights(unpack(update_info))

    def shutdown(self) -> None:
        pass


class InlineTrainerWeightTransferEngine(TrainerWeightTransferEngine[InlineTrainerInitInfo]):
    """Trainer side: the source's tensors in buckets of `bucket_bytes`, one request each."""

    init_info_cls = InlineTrainerInitInfo

    def __init__(self, *, client, source: WeightSource, is_sender: bool = True,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES):
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.bucket_bytes = bucket_bytes
        self.last_bytes = 0
        self.last_buckets = 0

    @classmethod
    def trainer_init(cls, init_info: InlineTrainerInitInfo, *, client, source: WeightSource | None = None):
        if source is None:
            raise ValueError("inline weight transfer needs a WeightSource")
        engine = cls(client=client, source=source, is_sender=init_info.is_sender, bucket_bytes=init_info.bucket_bytes)
        if engine.is_sender:
            engine.client.init_weight_transfer_engine({})
        return engine

    def send_weights(self) -> None:
        if not self.is_sender:
            for _ in self.source:  # stay in step with the ranks that gather
                pass
            return
        self.client.start_weight_update()
        sent = buckets = 0
        bucket: list[tuple[str, torch.Tensor]] = []
        size = 0
        for name, tensor in self.source:
            bucket.append((name, tensor))
            size += tensor.numel() * tensor.element_size()
            if size >= self.bucket_bytes:
                self.client.update_weights(pack(bucket))
                sent, buckets, bucket, size = sent + size, buckets + 1, [], 0
        if bucket:
            self.client.update_weights(pack(bucket))
            sent, buckets = sent + size, buckets + 1
        self.client.finish_weight_update()
        self.last_bytes, self.last_buckets = sent, buckets


class TensorsSource(WeightSource):
    """A `WeightSource` over a fresh list of (HF name, tensor) each round: the learner's
    `state_dict_for_engine()`, which a torch learner reads off its model and a Megatron
    learner gathers from its shards. `update(tensors)` sets the next round's."""

    def __init__(self, tensors: Iterable[tuple[str, torch.Tensor]] = ()):
        self.tensors = list(tensors)

    def update(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.tensors = list(tensors)

    def metadata(self) -> list[ParamMeta]:
        return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in self.tensors]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.tensors)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for _, t in self.tensors)


def ipc_trainer_class():
    """vLLM's IPC trainer for this project's one IPC case: the engine lives in the process of
    the learner's rank 0, which alone sends, holding every weight (gathered from the other ranks
    or from the CPU first). vLLM's trainer assumes every rank of the default process group sends
    its own copy (colocated FSDP): it all-gathers the handles and meets at a barrier on that
    group, which rank 0 would enter alone while the others wait for its next command. So here
    the handles are this process's alone and a send ends with `ipc_collect` only. The transfer is
    always packed: the weights go through one staging buffer on this GPU, which also carries
    CPU-held tensors (a Megatron gather, the `engine_lag` snapshots), for which `reduce_tensor`
    gives no CUDA handle."""
    import torch
    from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerWeightTransferEngine

    class OneSenderIPCTrainer(IPCTrainerWeightTransferEngine):
        def _all_gather_and_merge_handles(self, handles):
            return handles

        @staticmethod
        def _post_send_sync() -> None:
            torch.cuda.ipc_collect()

    return OneSenderIPCTrainer


def ipc_buffer_bytes(bucket_bytes: int, tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
    """The staging buffer: a bucket, or the largest tensor where one is larger (vLLM refuses a
    tensor over the buffer; Qwen3-8B's embedding is 1.2 GB in bfloat16)."""
    largest = max((t.numel() * t.element_size() for _, t in tensors), default=0)
    return max(bucket_bytes, largest)


def make_trainer(backend: str, client, source: "TensorsSource", bucket_bytes: int):
    """The trainer side of a backend, as vLLM's factory would make it, for one sender."""
    if backend == "ipc":
        info = trainer_init_info("ipc", rank=0, packed=True,
                                 packed_buffer_size_bytes=ipc_buffer_bytes(bucket_bytes, source))
        return ipc_trainer_class().trainer_init(info, client=client, source=source)
    if backend == BACKEND:
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        info = trainer_init_info(BACKEND, rank=0, bucket_bytes=bucket_bytes)
        return WeightTransferTrainerFactory.trainer_init(info, client=client, source=source)
    raise ValueError(f"weight_transfer {backend!r}: an engine in the learner's process sends by inline or ipc; "
                     "nccl joins learner and engine GPUs in one NCCL group, set up by runtime=ray")


def wire_update_info(update_info):
    """An update as vLLM's engine-core messaging can carry it. IPC handles are tuples holding
    tensor and storage classes and dtypes, which its msgpack encoder refuses (vllm/v1/serial_utils.py:
    a TypeError unless VLLM_ALLOW_INSECURE_SERIALIZATION=1); vLLM's HTTP client pickles them into
    `ipc_handles_pickled`, which the worker unpickles when that variable is set in its process
    (the engine is started with it under ipc). Other backends' updates pass unchanged."""
    from vllm.distributed.weight_transfer.clients import _json_safe_update_payload

    return _json_safe_update_payload(update_info)


def register() -> None:
    """vLLM's plugin hook (run in each of its processes; safe to run again). It also quiets
    vLLM's known noise there: the async engine's core and workers are processes of their own,
    and the rotary embedding's "Failed to load weights" at every sync is printed by the one that
    holds the model (a worker, or the engine core itself), not by the learner's."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory

    from agent.engines.vllm import _quiet_known_noise, apply_spin_sleep

    _quiet_known_noise()
    apply_spin_sleep()  # engine.options.spin_sleep_s, set by the engine before it started this process

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, InlineWeightTransferEngine)
    if BACKEND not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(BACKEND, InlineTrainerWeightTransferEngine)
    from agent.engines import vllm_collective  # weights by collective (runtime=ray); its sender is the learner's

    if vllm_collective.BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(vllm_collective.BACKEND, vllm_collective.CollectiveWeightTransferEngine)


def trainer_init_info(backend: str, **options) -> TrainerInitInfo:
    """The trainer-side init info of a backend by name (`inline`, `ipc`, `nccl`)."""
    register()
    if backend == BACKEND:
        return InlineTrainerInitInfo(**options)
    if backend == "ipc":
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

        return IPCTrainerInitInfo(**options)
    if backend == "nccl":
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        return NCCLTrainerInitInfo(**options)
    raise ValueError(f"engine.weight_transfer {backend!r}: choose auto, inline, ipc or nccl")

