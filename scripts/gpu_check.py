"""GPU check of the Megatron learner: a Qwen3-architecture model of Qwen3-1.7B's shape built from
a config (random weights, nothing downloaded), bf16, with Transformer Engine where installed.
Prints HF-vs-Megatron logprob agreement, one SAO learner step's tokens/s, MFU and peak memory,
then the paths issue 28 found untried: the weights exported for the engine (their logprobs in
transformers against the learner's), a save and a load into a fresh learner (TE's FusedAdam
state: the next step's losses and Adam's step count must match), and the memory plan's figure
for this learner beside torch's peak.

    python scripts/gpu_check.py [--tp 1] [--seq-len 2048] [--batch 16] [--steps 3] [--out gpu_check.json]
    torchrun --nproc-per-node 2 scripts/gpu_check.py --tp 2      # tensor + sequence parallel
    python scripts/gpu_check.py --all [--out-dir gpu_checks/]    # every GPU check, one command

`--all` runs this check at TP 1, at TP 2 with sequence parallel where there are two GPUs, and
scripts/gpu_engine_check.py (IPC syncs, a failed sync, sleep and wake), each in its own process,
and prints one verdict per finding. Without CUDA it exits with status 2. A stand-alone check:
nothing else in the project depends on it.
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
TINY_QWEN3 = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=16, vocab_size=4224, tie_word_embeddings=True, rope_theta=1e6, max_position_embeddings=4096,
                  rms_norm_eps=1e-6)  # --shape tiny --device cpu: this script's own paths, checked on CPU by its tests
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
    import gc

    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from training.algos import SAO
    from training.learners.megatron import MegatronLearner, _adam_step
    from training.learners.mcore import model as mm

    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    dtype = torch.bfloat16 if cuda else torch.float32  # the learner's "auto": bf16 on CUDA
    if args.tp > 1 and not dist.is_initialized():
        from training.collectives import init_from_env

        init_from_env(timeout_s=1800)  # torchrun's ranks (it sets each rank's GPU)
    rank = dist.get_rank() if dist.is_initialized() else 0
    res: dict = {"device": torch.cuda.get_device_name() if cuda else "cpu", "transformer_engine": mm.HAVE_TE,
                 "tensor_parallel": args.tp, "sequence_parallel": args.tp > 1, "seq_len": args.seq_len,
                 "batch": args.batch}
    with tempfile.TemporaryDirectory() as tmp:
        path = args.model_dir or build_model(Path(tmp) / "qwen3", shape, args.seed, device, dtype)
        g = torch.Generator().manual_seed(args.seed + 1)
        seqs = torch.randint(0, shape["vocab_size"], (4, 512), generator=g)
        ref = hf_logprobs(path, seqs, device, dtype)
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        # without Transformer Engine attention is local with a [T, T] mask: one sequence per micro-batch
        mbt = args.micro_batch_tokens or (8192 if mm.HAVE_TE else args.seq_len)
        algo = SAO(critic_warmup_steps=0)

        def make():
            return MegatronLearner(str(path), algo, tensor_parallel=args.tp, sequence_parallel=args.tp > 1,
                                   micro_batch_tokens=mbt, seed=args.seed)

        learner = make()
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
        flops = step_flops(learner.hf_config, algo, learner, lengths) / args.tp
        res.update(tokens_per_step=sum(lengths), seconds_per_step=seconds, tokens_per_s=sum(lengths) / seconds,
                   tflops_per_s_per_gpu=flops / seconds / 1e12, mfu=flops / seconds / H200_BF16_PEAK,
                   peak_memory_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan"),
                   **{k: metrics[k] for k in ("sao/loss", "value/loss", "sao/logprob_mismatch_pre") if k in metrics})
        res.update(memory_plan(args, path, mbt, res["peak_memory_gib"]))

        # the engine's weights: gathered across ranks by the bridge, by HF name (rank 0 keeps them)
        exported = dict(learner.state_dict_for_engine())
        after = megatron_logprobs(learner, seqs)
        if rank == 0:
            hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
            missing, unexpected = hf.load_state_dict(exported, strict=False)
            res["export_missing"] = len([k for k in missing if k != "lm_head.weight" or not hf.config.tie_word_embeddings])
            res["export_unexpected"] = len(unexpected)
            hf.save_pretrained(Path(tmp) / "exported")
            _save_tokenizer(path, Path(tmp) / "exported")
            del hf
            res["export_logprob_max_abs_diff"] = (hf_logprobs(Path(tmp) / "exported", seqs, device, dtype) - after).abs().max().item()
        del exported

        # save, one more step, then a fresh learner loads the save and takes the same step
        ckpt = Path(args.ckpt_dir or tmp) / "ckpt"
        learner.save(ckpt)
        res["adam_step_saved"] = _adam_step(learner.policy.optimizer)
        next_step = learner.step(trajs)
        del learner
        gc.collect()
        torch.cuda.empty_cache() if cuda else None
        loaded = make()
        loaded.load(ckpt)
        res["adam_step_loaded"] = _adam_step(loaded.policy.optimizer)
        res["load_logprob_max_abs_diff"] = (megatron_logprobs(loaded, seqs) - after).abs().max().item()
        again = loaded.step(trajs)
        for k in ("sao/loss", "value/loss"):
            if k in next_step:
                res[f"step_after_load_{k.replace('/', '_')}_diff"] = abs(next_step[k] - again[k])
        del loaded
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return res


def _save_tokenizer(src, dst: Path) -> None:
    """The exported folder loads as a model does: with its tokenizer."""
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(src).save_pretrained(dst)


def memory_plan(args, path, micro_batch_tokens: int, peak_gib: float) -> dict:
    """The memory plan's bytes for this learner rank (training.plan), beside torch's peak."""
    try:
        from training.plan import learner_rank_bytes
    except ImportError as e:  # the plan is issue 28's; say so rather than fail the other checks
        return {"plan_error": str(e)}
    planned = learner_rank_bytes(str(path), tensor_parallel=args.tp, micro_batch_tokens=micro_batch_tokens,
                                 recompute=False, critic=True, distributed_optimizer=True, data_parallel=1)
    return {"plan_learner_gib": planned / 2**30, "plan_over_peak": planned / 2**30 / peak_gib if peak_gib == peak_gib else float("nan")}


# what each finding's check must read to pass (bf16 on both sides; a random model's logprobs)
VERDICTS = [
    ("learner logprobs = transformers' (TP 1)", "tp1", lambda r: r["logprob_max_abs_diff"] < 0.1),
    ("5: save and load under TE (Adam's step, next step's losses)", "tp1",
     lambda r: r["adam_step_loaded"] == r["adam_step_saved"] and r["load_logprob_max_abs_diff"] < 1e-3
     and all(v < 1e-3 for k, v in r.items() if k.startswith("step_after_load_"))),
    ("export: the engine's weights by HF name", "tp1",
     lambda r: r["export_missing"] == r["export_unexpected"] == 0 and r["export_logprob_max_abs_diff"] < 0.1),
    ("7: the memory plan within 0.8-1.5x of torch's peak", "tp1", lambda r: 0.8 <= r.get("plan_over_peak", 0) <= 1.5),
    ("TP 2 + sequence parallel logprobs, export, save/load", "tp2",
     lambda r: r["logprob_max_abs_diff"] < 0.1 and r["export_logprob_max_abs_diff"] < 0.1
     and r["adam_step_loaded"] == r["adam_step_saved"]),
    ("1: an IPC sync on bf16/CUDA-graph defaults", "engine",
     lambda r: r["transfer"] == "ipc" and r["cuda_graphs"] and r["logprob_gap_after_sync_max"] < 0.1),
    ("2: an IPC sync from CPU-held weights", "engine", lambda r: r["logprob_gap_after_cpu_sync"] < 0.1),
    ("1: a failed sync restarts the engine", "engine",
     lambda r: r["engine_restarts"] == 1 and r["logprob_gap_after_restart"] < 0.1),
    ("8: sleep frees memory, wake serves the same weights", "engine",
     lambda r: r["freed_by_sleep_gb"] > 1 and r["logprob_gap_after_wake"] < 0.1),
]


def run_all(out_dir: Path, args) -> int:
    """Each check in its own process (a fresh GPU each), then one verdict per finding."""
    import subprocess

    import torch

    out_dir.mkdir(parents=True, exist_ok=True)
    small = ["--batch", str(args.batch), "--steps", str(args.steps), "--seq-len", str(args.seq_len)]
    runs = {"tp1": [sys.executable, "-m", "scripts.gpu_check", *small, "--out", str(out_dir / "tp1.json")],
            "engine": [sys.executable, "-m", "scripts.gpu_engine_check", "--out", str(out_dir / "engine.json")]}
    if torch.cuda.device_count() >= 2:
        runs["tp2"] = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "scripts.gpu_check",
                       "--tp", "2", *small, "--out", str(out_dir / "tp2.json")]
    results, codes = {}, {}
    for name, cmd in runs.items():
        t0 = time.monotonic()
        print(f"== {name}: {' '.join(cmd)}", flush=True)
        codes[name] = subprocess.run(cmd, cwd=ROOT).returncode
        print(f"== {name}: exit {codes[name]} in {time.monotonic() - t0:.0f} s", flush=True)
        f = out_dir / f"{name}.json"
        results[name] = json.loads(f.read_text()) if f.exists() else None
    failed = 0
    for what, name, ok in VERDICTS:
        r = results.get(name)
        if name not in runs:
            verdict = "not run (one GPU)"
        elif r is None:
            verdict, failed = f"FAILED (exit {codes[name]}, no result)", failed + 1
        else:
            try:
                passed = bool(ok(r))
            except KeyError as e:
                passed = False
                what += f" (missing {e})"
            verdict = "ok" if passed else "FAILED"
            failed += not passed
        print(f"{verdict:>28}  {what}")
    (out_dir / "summary.json").write_text(json.dumps({"results": results, "exit_codes": codes}, indent=2) + "\n")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/gpu_check.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--all", action="store_true", help="every GPU check, each in its own process, with verdicts")
    p.add_argument("--out-dir", type=Path, default=Path("gpu_checks"), help="--all: where each check's JSON goes")
    p.add_argument("--tp", type=int, default=1, help="tensor parallel (with sequence parallel above 1; under torchrun)")
    p.add_argument("--seq-len", type=int, default=2048, help="tokens per trajectory")
    p.add_argument("--batch", type=int, default=16, help="trajectories per learner step")
    p.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up step)")
    p.add_argument("--micro-batch-tokens", type=int, default=None, help="default 8192 (seq-len without TE)")
    p.add_argument("--model-dir", type=Path, default=None, help="a model folder to use instead of building one")
    p.add_argument("--ckpt-dir", type=Path, default=None, help="where the save/load check writes (default: a temp folder)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="also write the numbers as JSON here")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: this script's own test (fp32, gloo)")
    p.add_argument("--shape", choices=("qwen3-1.7b", "tiny"), default="qwen3-1.7b")
    args = p.parse_args(argv)
    import torch

    shape = TINY_QWEN3 if args.shape == "tiny" else QWEN3_1_7B
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: needs a CUDA GPU; torch.cuda.is_available() is False here", file=sys.stderr)
        return 2
    if args.all:
        return run_all(args.out_dir, args)
    import os

    job = f"{args.shape}_tp{args.tp}_{os.getppid()}"  # torchrun's agent: the one parent of this job's ranks
    if args.tp > 1 and args.ckpt_dir is None:  # every rank saves into one folder: a shared one
        args.ckpt_dir = Path(tempfile.gettempdir()) / f"gpu_check_ckpt_{job}"
    if args.tp > 1 and args.model_dir is None:  # the same random weights on every rank, built once
        args.model_dir = Path(tempfile.gettempdir()) / f"gpu_check_model_{job}"
    if args.tp > 1:  # rank 0 builds the model (the tokenizer is written last); the others wait for it
        if int(os.environ.get("RANK", "0")) == 0 and not (args.model_dir / "tokenizer_config.json").exists():
            build_model(args.model_dir, shape, args.seed, args.device,
                        torch.bfloat16 if args.device == "cuda" else torch.float32)
        while not (args.model_dir / "tokenizer_config.json").exists():
            time.sleep(1)
    res = run(args, shape, args.device)
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    width = max(map(len, res))
    print(f"{f'Megatron learner GPU check (Qwen3-1.7B shape, random weights, TP={args.tp}, bf16)':^{width + 24}}")
    for k, v in res.items():
        print(f"{k:<{width}}  {v:>20.6g}" if isinstance(v, float) else f"{k:<{width}}  {str(v):>20}")
    print(json.dumps(res))
    if args.out:
        args.out.write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
