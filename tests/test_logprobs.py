"""Chunked, checkpointed token logprobs against the naive full-logits computation."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from training.logprobs import token_logprobs

V, H = 50, 8


def naive(hidden, weight, targets, temperature=1.0):
    """The reference: the full [..., T, V] logits at once."""
    logits = (hidden @ weight.T).float() / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1), entropy


def inputs(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(*shape, H, generator=g).to(dtype).requires_grad_()
    weight = torch.randn(V, H, generator=g).to(dtype).requires_grad_()
    targets = torch.randint(0, V, shape, generator=g)
    return hidden, weight, targets


def grads(out, hidden, weight, seed=1):
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    return torch.autograd.grad(out, (hidden, weight), upstream)


def test_uniform_logits_by_hand():
    # W = 0 -> every logit is 0 -> softmax uniform over V -> logprob -log V, entropy log V
    hidden, weight, targets = torch.randn(3, H), torch.zeros(V, H), torch.tensor([0, 7, 49])
    logp, entropy = token_logprobs(hidden, weight, targets, chunk_size=2, return_entropy=True)
    torch.testing.assert_close(logp, torch.full((3,), -math.log(V)))
    torch.testing.assert_close(entropy, torch.full((3,), math.log(V)))


@pytest.mark.parametrize("shape", [(10,), (3, 10)], ids=["T", "BxT"])
@pytest.mark.parametrize("chunk_size", [1, 3, 7, 10, 1024])  # 3 and 7 do not divide 10 (or 30)
def test_values_and_gradients_match_naive(shape, chunk_size):
    hidden, weight, targets = inputs(shape)
    out = token_logprobs(hidden, weight, targets, chunk_size=chunk_size)
    ref, _ = naive(hidden, weight, targets)
    assert out.shape == targets.shape and out.dtype == torch.float32
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for got, want in zip(grads(out, hidden, weight), grads(ref, hidden, weight)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_temperature_and_entropy_match_naive_with_gradients():
    hidden, weight, targets = inputs((2, 9))
    logp, entropy = token_logprobs(hidden, weight, targets, chunk_size=4, temperature=0.7, return_entropy=True)
    ref_logp, ref_entropy = naive(hidden, weight, targets, temperature=0.7)
    torch.testing.assert_close(logp, ref_logp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy, ref_entropy, atol=1e-5, rtol=1e-5)
    for got, want in zip(grads(entropy, hidden, weight), grads(ref_entropy, hidden, weight)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_gradcheck_float64():
    hidden, weight, targets = inputs((2, 5), dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda h, w: token_logprobs(h, w, targets, chunk_size=3), (hidden, weight))


def test_bf16_inputs():
    # the matmul runs in bf16, the softmax in fp32: equal to the naive bf16 recipe up to fp32
    # rounding, and close to the fp32 computation up to bf16 rounding of the logits
    hidden, weight, targets = inputs((2, 12), dtype=torch.bfloat16)
    out = token_logprobs(hidden, weight, targets, chunk_size=5)
    assert out.dtype == torch.float32
    ref, _ = naive(hidden, weight, targets)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    h32, w32 = hidden.detach().float().requires_grad_(), weight.detach().float().requires_grad_()
    full, _ = naive(h32, w32, targets)
    torch.testing.assert_close(out, full, atol=0.1, rtol=0.02)
    g_hidden, g_weight = grads(out, hidden, weight)
    assert g_hidden.dtype == g_weight.dtype == torch.bfloat16
    # gradients: within bf16 rounding (1% of the largest entry) of the fp32 gradients; the
    # weight gradient is summed over chunks in bf16, so it is not bit-equal to one bf16 matmul
    for got, want in zip((g_hidden, g_weight), grads(full, h32, w32)):
        torch.testing.assert_close(got.float(), want, atol=0.01 * want.abs().max().item(), rtol=0)


class LargestOutput(TorchDispatchMode):
    """Records the largest tensor any op produces (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_no_op_ever_holds_the_full_logits():
    # T = 64 tokens, chunk 16: a chunk's logits are 16 x 50 = 800 values; the full logits
    # would be 64 x 50 = 3200. Other tensors are smaller: W is 50 x 8 = 400, hidden 64 x 8 = 512.
    hidden, weight, targets = inputs((64,))
    with LargestOutput() as mode:
        out = token_logprobs(hidden, weight, targets, chunk_size=16)
        out.sum().backward()
    assert mode.largest == 16 * V
    with LargestOutput() as mode:  # the check can see a full-logits tensor when there is one
        naive(hidden, weight, targets)[0].sum().backward()
    assert mode.largest == 64 * V


def test_backward_keeps_no_chunk_logits_alive():
    # without checkpointing, autograd would save every chunk's [16, V] softmax for backward:
    # 4 chunks x 800 = the full 3200 logits. With it, only the chunk inputs are saved
    # (views of hidden, W itself, targets) and nothing with a vocabulary axis.
    hidden, weight, targets = inputs((64,))
    saved = []

    def pack(t):
        saved.append(t.numel() if t.dim() and t.shape[-1] == V else 0)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = token_logprobs(hidden, weight, targets, chunk_size=16)
    assert sum(saved) == 0
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        naive(hidden, weight, targets)  # the check sees what the naive version saves
    assert sum(saved) >= 64 * V
    out.sum().backward()  # and the checkpointed graph still backpropagates


def test_shape_mismatch_is_refused():
    hidden, weight, targets = inputs((4,))
    with pytest.raises(AssertionError, match="targets"):
        token_logprobs(hidden, weight, targets[:3])
