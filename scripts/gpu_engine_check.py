"""GPU check of the async vLLM engine on ONE NVIDIA GPU, beside a learner-sized model on the same
GPU, with the engine's GPU defaults (bf16, CUDA graphs): weights by CUDA IPC (vLLM's `ipc`
backend, packed through one staging buffer) from the GPU and from CPU-held tensors (a Megatron
gather, the engine_lag snapshots), a sync in mid-request (tokens split between versions, each
with its own weights' logprobs), a sync that fails in mid-update (the engine is started anew,
not resumed half loaded), and sleep mode around a learner step. Issue 28's findings 1, 2 and 8.
A Qwen3-architecture model of Qwen3-1.7B's shape from a config (random weights, nothing
downloaded), bf16. Prints a table and JSON.

    python scripts/gpu_engine_check.py [--out gpu_engine_check.json]

Without CUDA it exits with status 2. A stand-alone check: nothing else in the project depends on it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `python scripts/gpu_engine_check.py` from anywhere


def hf_logprobs(model, prompt: list[int], tokens: list[int]):
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens], device=model.device)).logits[0].float()
    logp = torch.log_softmax(logits, -1)[len(prompt) - 1: -1]
    return logp.gather(1, torch.tensor(tokens, device=model.device)[:, None])[:, 0].cpu()


def run(out_dir: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from agent.engines.base import SamplingParams
    from agent.engines.vllm_async import AsyncVLLMEngine
    from scripts.gpu_check import QWEN3_1_7B, build_model

    path = build_model(out_dir / "model", QWEN3_1_7B, seed=0, device="cuda", dtype=torch.bfloat16)
    learner = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda()  # the "learner", same GPU
    engine = AsyncVLLMEngine(str(path), max_model_len=4096, gpu_memory_utilization=0.3,
                             weight_transfer="auto", bucket_mb=256, sleep_during_step=True)
    res: dict = {"device": torch.cuda.get_device_name(), "transfer": engine.transfer,
                 "dtype": engine._args["dtype"], "cuda_graphs": not engine._args["enforce_eager"]}
    try:
        prompt = list(range(10, 42))
        c = engine.generate(prompt, SamplingParams(max_new_tokens=64, seed=1))
        res["logprob_gap_before"] = float((hf_logprobs(learner, prompt, c.token_ids) - torch.tensor(c.logprobs)).abs().max())

        with torch.no_grad():  # a "step": new weights on the learner's GPU copy
            for p in learner.parameters():
                p.add_(torch.randn_like(p) * 1e-2)
        box = {}
        t = threading.Thread(target=lambda: box.update(c=engine.generate(prompt, SamplingParams(max_new_tokens=1024, seed=2))))
        t.start()
        while engine.outstanding == 0:
            time.sleep(0.01)
        time.sleep(0.2)
        engine.update_weights(learner.state_dict().items(), version=1)  # ipc, continue mode
        t.join()
        res.update(engine.last_sync)
        c = box["c"]
        cut = c.versions.index(1) if 1 in c.versions else len(c.versions)
        res["tokens_before_sync"], res["tokens_after_sync"] = cut, len(c.versions) - cut
        if cut < len(c.versions):
            gap = (hf_logprobs(learner, prompt, c.token_ids)[cut:] - torch.tensor(c.logprobs[cut:])).abs()
            res["logprob_gap_after_sync_max"], res["logprob_gap_after_sync_mean"] = float(gap.max()), float(gap.mean())

        # CPU-held weights (finding 2): copied through the GPU staging buffer
        with torch.no_grad():
            for p in learner.parameters():
                p.add_(torch.randn_like(p) * 1e-2)
        engine.update_weights([(k, v.cpu()) for k, v in learner.state_dict().items()], version=2)
        c = engine.generate(prompt, SamplingParams(max_new_tokens=64, seed=4))
        res["logprob_gap_after_cpu_sync"] = float((hf_logprobs(learner, prompt, c.token_ids) - torch.tensor(c.logprobs)).abs().max())

        # a sync that fails in its second bucket (finding 1): restarted, given the weights, never resumed
        from agent.engines import vllm_async

        real, calls = vllm_async._SyncClient.update_weights, []

        def fails_once(client, update_info):
            calls.append(1)
            if len(calls) == 2:
                raise RuntimeError("injected: bucket lost in transit")
            return real(client, update_info)

        vllm_async._SyncClient.update_weights = fails_once
        engine.bucket_bytes = 64 << 20  # several chunks, so the second one fails after the first loaded
        engine._trainer = None
        try:
            with torch.no_grad():
                for p in learner.parameters():
                    p.add_(torch.randn_like(p) * 1e-2)
            t0 = time.monotonic()
            engine.update_weights(learner.state_dict().items(), version=3)
            res["failed_sync_recovered_s"] = time.monotonic() - t0
        finally:
            vllm_async._SyncClient.update_weights = real
        res["engine_restarts"] = engine.restarts
        c = engine.generate(prompt, SamplingParams(max_new_tokens=64, seed=5))
        res["logprob_gap_after_restart"] = float((hf_logprobs(learner, prompt, c.token_ids) - torch.tensor(c.logprobs)).abs().max())

        free0 = torch.cuda.mem_get_info()[0]
        t0 = time.monotonic()
        engine.sleep()
        res["sleep_s"] = time.monotonic() - t0
        res["freed_by_sleep_gb"] = (torch.cuda.mem_get_info()[0] - free0) / 2**30
        t0 = time.monotonic()
        engine.wake_up()
        res["wake_s"] = time.monotonic() - t0
        c = engine.generate(prompt, SamplingParams(max_new_tokens=32, seed=3))
        res["logprob_gap_after_wake"] = float((hf_logprobs(learner, prompt, c.token_ids) - torch.tensor(c.logprobs)).abs().max())
    finally:
        engine.close()
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/gpu_engine_check.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("error: this check needs a CUDA GPU (the CPU path is tests/test_vllm_engine.py)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        res = run(Path(tmp))
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"async vLLM engine on {res['device']}")
    table.add_column("what")
    table.add_column("value", justify="right")
    for k, v in res.items():
        table.add_row(k, f"{v:.4g}" if isinstance(v, float) else str(v))
    Console().print(table)
    if args.out:
        args.out.write_text(json.dumps(res, indent=2))
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
