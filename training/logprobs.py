"""Per-token logprobs (and entropy) from final hidden states, without materialising the logits.

A [T, V] fp32 logits tensor for a 32k-token trajectory and a 150k vocabulary is ~19 GB, and
autograd would keep it (and its softmax) for the backward pass. Instead the tokens are cut
into chunks; each chunk's logits are computed, upcast to fp32, reduced to one number per token
and freed, under `torch.utils.checkpoint`, so the backward pass recomputes one chunk at a time.
Peak memory is about chunk_size x V fp32 values, forward and backward.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint


def _chunk_logprobs(
    hidden: torch.Tensor,  # [C, H] one chunk of tokens
    weight: torch.Tensor,  # [V, H] lm head
    targets: torch.Tensor,  # [C] long
    temperature: float,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor]:  # ([C], [C]) fp32 (fp64 for fp64 inputs)
    logits = hidden @ weight.T  # [C, V], the only V-sized tensor
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature  # bf16 -> fp32
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return logp, torch.zeros_like(logp)
    entropy = -(logp_all.exp() * logp_all).sum(dim=-1)
    return logp, entropy


def token_logprobs(
    hidden: torch.Tensor,  # [T, H] or [B, T, H] final hidden states (after the last norm)
    lm_head_weight: torch.Tensor,  # [V, H]
    targets: torch.Tensor,  # [T] or [B, T] long, in [0, V): the token each position predicts
    chunk_size: int = 1024,
    temperature: float = 1.0,
    return_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """log_softmax(hidden @ W.T / temperature)[targets], shape [T] or [B, T], fp32 (fp64 inputs stay fp64).

    Equal to the naive full computation (values and gradients w.r.t. hidden and W) up to
    float rounding. The matmul runs in the inputs' dtype (bf16 inputs: bf16 matmul with the
    backend's accumulation), then each chunk's logits are upcast to fp32 before the softmax.
    Leading dimensions are flattened, so a chunk is `chunk_size` tokens in total across the
    batch, and peak logits memory is chunk_size x V whatever B is; the last chunk may be short.
    The weight gradient is a sum over chunks in W's dtype (bf16 W: bf16 partial sums), so it
    differs from the one-matmul gradient by bf16 rounding, not by more.
    With `return_entropy`, also returns the per-token entropy of the tempered distribution
    (nats, fp32, same shape), which is differentiable too.
    """
    assert chunk_size >= 1, f"chunk_size must be positive, got {chunk_size}"
    assert hidden.shape[:-1] == targets.shape, f"hidden {tuple(hidden.shape)} vs targets {tuple(targets.shape)}"
    assert hidden.shape[-1] == lm_head_weight.shape[-1], "hidden size differs from the lm head's"
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])  # [N, H]
    flat_targets = targets.reshape(-1)  # [N]
    logps, entropies = [], []
    for start in range(0, flat_hidden.shape[0], chunk_size):
        stop = start + chunk_size
        logp, entropy = checkpoint(
            _chunk_logprobs,
            flat_hidden[start:stop],
            lm_head_weight,
            flat_targets[start:stop],
            temperature,
            return_entropy,
            use_reentrant=False,
        )
        logps.append(logp)
        entropies.append(entropy)
    if not logps:  # zero tokens
        empty = flat_hidden.new_zeros(0, dtype=torch.float32)
        logps, entropies = [empty], [empty]
    logp = torch.cat(logps).reshape(targets.shape)
    if not return_entropy:
        return logp
    return logp, torch.cat(entropies).reshape(targets.shape)
