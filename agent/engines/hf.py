"""A transformers engine for CPU (or one GPU): KV-cached sampling with temperature and top-p,
returning each sampled token's logprob under the exact distribution it was drawn from."""

from __future__ import annotations

import inspect
from typing import Iterable

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from agent.engines.base import Completion, SamplingParams, resolve_device, resolve_dtype


def processed_logprobs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Log-probabilities after temperature and top-p (nucleus) filtering. logits: [V] -> [V]."""
    logits = logits.float()
    if temperature > 0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    if 0 < top_p < 1:
        sorted_logp, order = logp.sort(descending=True)
        cum = sorted_logp.exp().cumsum(-1)
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        drop_sorted = (cum - sorted_logp.exp()) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logp = torch.log_softmax(logp.masked_fill(drop, float("-inf")), dim=-1)
    return logp


class HFEngine:
    """`generate` one sequence at a time; `update_weights` copies tensors in place."""

    def __init__(self, model_path: str, device: str = "cpu", dtype: str = "float32"):
        """`device`: cpu, cuda, cuda:N or auto; `dtype`: float32, bfloat16, float16 or auto
        (agent.engines.resolve_device / resolve_dtype)."""
        device, dtype = resolve_device(device), resolve_dtype(dtype)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype)).to(device)
        self.model.eval()
        self.device = device
        self.version = 0
        # transformers renamed `past_key_values` to `cache` (5.2x); an unknown name is ignored
        # silently, which would sample without the cache's context, so pick the one it has
        params = inspect.signature(self.model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = tuple(eos if isinstance(eos, list) else [eos] if eos is not None else [])

    @torch.no_grad()
    def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        gen = torch.Generator(device=self.device)
        gen.manual_seed(sampling.seed if sampling.seed is not None else torch.seed())
        stop = set(sampling.stop_token_ids) | set(self.eos_ids)
        input_ids = torch.tensor([prompt_ids], device=self.device)
        cache = DynamicCache(config=self.model.config)
        tokens: list[int] = []
        logprobs: list[float] = []
        finish = "length"
        for _ in range(sampling.max_new_tokens):
            out = self.model(input_ids=input_ids, use_cache=True, **{self._cache_kwarg: cache})
            logp = processed_logprobs(out.logits[0, -1], sampling.temperature, sampling.top_p)
            if sampling.temperature <= 0:
                token = int(logp.argmax())
            else:
                token = int(torch.multinomial(logp.exp(), 1, generator=gen))
            tokens.append(token)
            logprobs.append(float(logp[token]))
            if token in stop:
                finish = "stop"
                break
            input_ids = torch.tensor([[token]], device=self.device)
        return Completion(tokens, logprobs, finish)

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        params = dict(self.model.named_parameters())
        params.update(dict(self.model.named_buffers()))
        for name, tensor in named_tensors:
            if name not in params:
                if name == "lm_head.weight" and self.model.config.tie_word_embeddings:
                    continue  # tied to the embedding, which arrives under its own name
                raise KeyError(f"update_weights: the engine's model has no parameter {name!r}")
            params[name].copy_(tensor.to(params[name].device, params[name].dtype))
        self.version = version
