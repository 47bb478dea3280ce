"""Per-token logprobs from the policy's final hidden states and its vocab-parallel output
weight, a chunk of tokens at a time (as `training/logprobs.py` does for one device).

The policy's output layer is set to hand back its (gathered) input instead of logits; the
loss then computes each chunk's [chunk, V / tp] logits, upcasts them to fp32, takes megatron's
`vocab_parallel_cross_entropy` and frees them, under `torch.utils.checkpoint`, so the backward
pass recomputes one chunk at a time. No rank ever holds more than chunk x V / tp logits.
"""

from __future__ import annotations

import types

import torch
from torch.utils.checkpoint import checkpoint


def hidden_out(model, pre_process, post_process, config, hf_config):
    """mbridge post-creation callback for the policy: its output layer returns its input (the
    final hidden states, gathered over the sequence under sequence parallel, as the layer
    itself would) and keeps the weight it was given (the embedding's, when tied) for the loss."""
    if not post_process:
        return
    from megatron.core import tensor_parallel

    head = model.output_layer

    def forward(self, hidden, weight=None, runtime_gather_output=None):
        # a plain attribute, not a registered parameter: as one it gave the weight a second name
        # in the optimizer's checkpoint, which a fresh learner (no forward yet) could not load
        self.__dict__["loss_weight"] = weight if weight is not None else self.weight
        if self.sequence_parallel:  # each rank's slice of the sequence -> the whole (grad: summed back)
            return tensor_parallel.gather_from_sequence_parallel_region(hidden), None
        return tensor_parallel.copy_to_tensor_model_parallel_region(hidden), None  # grad: summed over TP

    head.forward = types.MethodType(forward, head)


def _chunk(hidden, weight, targets, temperature):
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    logits = (hidden.to(weight.dtype) @ weight.t()).float() / temperature  # [C, V/tp], the only V-sized tensor
    return -vocab_parallel_cross_entropy(logits, targets)


def vocab_parallel_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                            temperature: float = 1.0, chunk_size: int = 1024) -> torch.Tensor:
    """[T] fp32 log softmax(hidden @ W.T / temperature)[targets] over the whole vocabulary, W
    being this rank's [V / tp, H] shard; hidden [T, H], targets [T]. Differentiable (hidden, W).
    Every tensor-parallel rank gets the same values (the softmax's sums are all-reduced)."""
    out = []
    for start in range(0, hidden.shape[0], chunk_size):
        stop = start + chunk_size
        out.append(checkpoint(_chunk, hidden[start:stop], weight, targets[start:stop], temperature, use_reentrant=False))
    return torch.cat(out) if out else hidden.new_zeros(0, dtype=torch.float32)
