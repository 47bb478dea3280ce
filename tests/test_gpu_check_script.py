"""The GPU check script's own paths, run on CPU at a tiny shape (fp32, gloo): a script that only
a lent GPU runs must not meet its first bug there. The figures it prints are for a GPU; here
only that every check runs and agrees is asserted."""

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def check_agrees(res: dict, saved_steps: int) -> None:
    assert res["logprob_max_abs_diff"] < 1e-3  # fp32 on both sides
    assert res["export_missing"] == res["export_unexpected"] == 0 and res["export_logprob_max_abs_diff"] < 1e-3
    assert res["adam_step_saved"] == res["adam_step_loaded"] == saved_steps
    assert res["load_logprob_max_abs_diff"] < 1e-5
    assert all(v < 1e-5 for k, v in res.items() if k.startswith("step_after_load_")), res


def test_the_learner_gpu_check_runs_on_cpu_at_a_tiny_shape(tmp_path):
    from scripts.gpu_check import TINY_QWEN3, VERDICTS, run

    args = argparse.Namespace(tp=1, seq_len=96, batch=2, steps=1, micro_batch_tokens=256, model_dir=None,
                              ckpt_dir=tmp_path, seed=0)
    res = run(args, shape=TINY_QWEN3, device="cpu")
    check_agrees(res, saved_steps=2)  # the warm-up and the timed step
    assert "plan_learner_gib" in res, res.get("plan_error")
    tp1 = [ok for what, name, ok in VERDICTS if name == "tp1" and "memory plan" not in what]
    assert all(ok(res) for ok in tp1)


def test_the_tensor_parallel_gpu_check_runs_under_torchrun_on_cpu(tmp_path):
    """TP 2 with sequence parallel, as `--all` runs it on two GPUs: the model built once for both
    ranks, export gathered to rank 0, save and load into one shared folder."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "tp2.json"
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                        "127.0.0.1", "--master-port", str(port), "-m", "scripts.gpu_check", "--device", "cpu",
                        "--shape", "tiny", "--tp", "2", "--seq-len", "96", "--batch", "2", "--steps", "1",
                        "--micro-batch-tokens", "256", "--out", str(out),
                        "--model-dir", str(tmp_path / "model"), "--ckpt-dir", str(tmp_path / "ckpt")],
                       cwd=ROOT, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-4000:]
    res = json.loads(out.read_text())
    assert res["tensor_parallel"] == 2 and res["sequence_parallel"]
    check_agrees(res, saved_steps=2)
