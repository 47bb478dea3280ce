"""GPU check of the Megatron learner on ONE NVIDIA H200: a Qwen3-architecture model of Qwen3-1.7B's
shape built from a config (random weights, nothing downloaded), TP=1, bf16. Prints a table of
HF-vs-Megatron logprob agreement, one SAO learner step's tokens/s, MFU and peak memory.

    python scripts/gpu_check.py [--seq-len 2048] [--batch 16] [--steps 3] [--out gpu_check.json]

Without CUDA it exits with status 2. A stand-alone check: nothing else in the project depends on it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `python scripts/gpu_check.py` from anywhere

H200_BF16_PEAK = 989e12  # dense bf16 FLOP/s (no sparsity)
QWEN3_1_7B = dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True,
                  rope_theta=1e6, max_position_embeddings=40960, rms_norm_eps=1e-6)


def build_model(out: Path, shape: dict, seed: int, device: str, dtype) -> Path:
    """Random Qwen3 weights saved as safetensors, with the project's tiny tokenizer (ids < 4100)."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from agent.tiny_model import build_tiny_model

    tok = AutoTokenizer.from_pretrained(build_tiny_model())
    config = Qwen3Config(**shape, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(dtype)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    del model
    return out


def hf_logprobs(path: Path, seqs, device: str, dtype):
    """[B, L-1] log p(next token) from transformers' model, fp32 log-softmax of its logits."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    with torch.no_grad():
        logits = model(seqs.to(device)).logits[:, :-1].float()
        out = torch.log_softmax(logits, -1).gather(-1, seqs[:, 1:, None].to(device))[..., 0].cpu()
    del model, logits
    return out


def megatron_logprobs(learner, seqs):
    """The same through the learner's policy: packed rows, the chunk's forward, `_logprobs`."""
    import torch

    from agent.trajectory import Trajectory
    from training.batch import pack
    from training.learners.mcore import model as mm
    from training.learners.mcore.packing import pack_rows

    batch = pack([Trajectory(f"check{i}", prompt_ids=s.tolist()) for i, s in enumerate(seqs)], learner.pad_id)
    p = pack_rows(batch, list(range(len(seqs))), 1, thd=mm.HAVE_TE, device=learner.device)
    with torch.no_grad():
        logits = learner.policy.chunks[0](p.input_ids, p.position_ids, p.attention_mask,
                                          packed_seq_params=p.packed_seq_params)
        return learner._logprobs(p, logits)[:, : seqs.shape[1] - 1].float().cpu()


def trajectories(n: int, seq_len: int, vocab: int, seed: int):
    """Agent-like rollouts of exactly seq_len tokens: a prompt, then sampled turns (384) and tool
    output (128) in turn; rewards 0/1. Behaviour logprobs -log(V): a random model's are near it,
    so SAO's band keeps most tokens and the policy update has work to do."""
    import torch

    from agent.trajectory import Trajectory

    g = torch.Generator().manual_seed(seed)
    ids = lambda k: torch.randint(0, vocab, (k,), generator=g).tolist()  # noqa: E731
    out = []
    for i in range(n):
        t = Trajectory(f"t{i}", prompt_ids=ids(min(128, seq_len - 1)), reward=float(i % 2))
        sampled = True
        while t.num_tokens < seq_len:
            k = min(384 if sampled else 128, seq_len - t.num_tokens)
            if sampled:
                t.append_sampled(ids(k), [-math.log(vocab)] * k, 0)
            else:
                t.append_observation(ids(k))
            sampled = not sampled
        out.append(t)
    return out


def step_flops(hf, algo, learner, lengths: list[int]) -> float:
    """Model FLOPs of one SAO step. Per model, per token: 2*N forward, 6*N forward+backward (N the
    matmul parameters: non-embedding ones plus the vocab head; the policy's tied embedding is its
    head, the critic's head is [1, H]); attention scores add 4*layers*heads*head_dim*n forward and
    12*layers*heads*head_dim*n forward+backward for a sequence of n tokens (PaLM's convention, no
    causal discount). A frozen weight (the critic's attention) skips its weight gradient: 4*N.
    The step = policy forward + critic forward + K critic updates + one policy update."""
    T, sq = sum(lengths), sum(n * n for n in lengths)
    attn = hf.num_hidden_layers * hf.num_attention_heads * hf.head_dim
    head = hf.vocab_size * hf.hidden_size

    def matmul_params(model, skip_embedding: bool) -> tuple[int, int]:
        total = frozen = 0
        for name, p in model.chunks[0].named_parameters():
            if skip_embedding and "embedding" in name:
                continue
            total += p.numel()
            frozen += 0 if p.requires_grad else p.numel()
        return total, frozen

    n_p, _ = matmul_params(learner.policy, skip_embedding=False)  # tied: the embedding is the head
    if not hf.tie_word_embeddings:
        n_p -= head  # untied: the embedding is a lookup, output_layer is counted
    flops = (2 * n_p * T + 4 * attn * sq) + (6 * n_p * T + 12 * attn * sq)
    if learner.critic is not None:
        n_c, frozen = matmul_params(learner.critic, skip_embedding=True)
        flops += (2 * n_c * T + 4 * attn * sq) + algo.critic_steps * ((6 * n_c - 2 * frozen) * T + 12 * attn * sq)
    return float(flops)


def run(args, shape: dict = QWEN3_1_7B, device: str = "cuda") -> dict:
    import torch
    import torch.distributed as dist

    from training.algos import SAO
    from training.learners.megatron import MegatronLearner
    from training.learners.mcore import model as mm

    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    dtype = torch.bfloat16 if cuda else torch.float32  # the learner's "auto": bf16 on CUDA
    res: dict = {"device": torch.cuda.get_device_name() if cuda else "cpu", "transformer_engine": mm.HAVE_TE,
                 "seq_len": args.seq_len, "batch": args.batch}
    with tempfile.TemporaryDirectory() as tmp:
        path = build_model(Path(tmp) / "qwen3", shape, args.seed, device, dtype)
        g = torch.Generator().manual_seed(args.seed + 1)
        seqs = torch.randint(0, shape["vocab_size"], (4, 512), generator=g)
        ref = hf_logprobs(path, seqs, device, dtype)
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        # without Transformer Engine attention is local with a [T, T] mask: one sequence per micro-batch
        mbt = args.micro_batch_tokens or (8192 if mm.HAVE_TE else args.seq_len)
        algo = SAO(critic_warmup_steps=0)
        learner = MegatronLearner(str(path), algo, tensor_parallel=1, micro_batch_tokens=mbt, seed=args.seed)
        diff = (megatron_logprobs(learner, seqs) - ref).abs()
        res.update(params=sum(p.numel() for p in learner.policy.chunks[0].parameters()), micro_batch_tokens=mbt,
                   logprob_max_abs_diff=diff.max().item(), logprob_mean_abs_diff=diff.mean().item())
        trajs = trajectories(args.batch, args.seq_len, shape["vocab_size"], args.seed + 2)
        lengths = [t.num_tokens for t in trajs]
        learner.step(trajs)  # warm-up: optimizer states, kernels, allocator
        sync()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            metrics = learner.step(trajs)
        sync()
        seconds = (time.perf_counter() - t0) / args.steps
        flops = step_flops(learner.hf_config, algo, learner, lengths)
        res.update(tokens_per_step=sum(lengths), seconds_per_step=seconds, tokens_per_s=sum(lengths) / seconds,
                   tflops_per_s=flops / seconds / 1e12, mfu=flops / seconds / H200_BF16_PEAK,
                   peak_memory_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan"),
                   **{k: metrics[k] for k in ("sao/loss", "value/loss", "sao/logprob_mismatch_pre") if k in metrics})
    if dist.is_initialized():
        dist.destroy_process_group()
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/gpu_check.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--seq-len", type=int, default=2048, help="tokens per trajectory")
    p.add_argument("--batch", type=int, default=16, help="trajectories per learner step")
    p.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up step)")
    p.add_argument("--micro-batch-tokens", type=int, default=None, help="default 8192 (seq-len without TE)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="also write the numbers as JSON here")
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: needs a CUDA GPU (one H200); torch.cuda.is_available() is False here", file=sys.stderr)
        return 2
    res = run(args)
    width = max(map(len, res))
    print(f"{'Megatron learner GPU check (Qwen3-1.7B shape, random weights, TP=1, bf16)':^{width + 24}}")
    for k, v in res.items():
        print(f"{k:<{width}}  {v:>20.6g}" if isinstance(v, float) else f"{k:<{width}}  {str(v):>20}")
    print(json.dumps(res))
    if args.out:
        args.out.write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
