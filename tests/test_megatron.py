"""The Megatron learner on CPU (gloo, fp32, megatron's CUDA calls redirected: training/learners/mcore/cpu.py).

- HF -> Megatron -> HF is exact and logits agree with transformers' at TP=2 and at PP=2;
- one SAO and one GRPO step equal the torch learner's (metrics, updated HF weights) at TP=1
  (two data-parallel ranks), TP=2 and (SAO) PP=2; a learner loaded from a distributed checkpoint takes
  the saver's next step; a checkpoint of another layout is refused;
- `torchrun --nproc-per-node 2 -m training.run learner=megatron learner.tensor_parallel=2`
  trains on the embedded default's tasks, is killed, and resumes from its distributed checkpoint;
- layouts that do not fit the model, and architectures the bridge cannot convert, are named.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.megatron_batch import ALGOS, BATCH, GROUPS, make_algo, make_tiny

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("megatron_worker.py")
pytest.importorskip("megatron.core")
pytest.importorskip("mbridge")


def torchrun(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(29700 + os.getpid() % 200), *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def children(pid: int) -> list[int]:
    """The ids of `pid`'s child processes (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def state_of(pid: int) -> str:
    try:
        return (Path(f"/proc/{pid}") / "status").read_text().split("State:")[1].split("\n")[0]
    except (OSError, IndexError):
        return "zombie"  # gone


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("mcore")
    return {t: str(make_tiny(root / t, t)) for t in ("qwen2", "qwen3")}


def test_hf_megatron_hf_round_trip_and_logits_at_tp2_and_pp2(tiny, tmp_path):
    out = tmp_path / "roundtrip.json"
    torchrun(str(WORKER), "roundtrip", str(out), tiny["qwen2"], tiny["qwen3"])
    rows = json.loads(out.read_text())
    assert {(r["model"], r["tp"], r["pp"]) for r in rows} == {(m, tp, pp) for m in ("qwen2", "qwen3") for tp, pp in ((2, 1), (1, 2))}
    for r in rows:
        assert r["names_equal"] and r["max_weight_diff"] == 0.0, r  # bit-exact, every HF name back
        assert r["max_logit_diff"] < 1e-4, r


def test_one_step_equals_the_torch_learner(tiny, tmp_path):
    from training.learners.torch import TorchLearner

    model = tiny["qwen2"]
    critic = tmp_path / "critic"  # one value head for both learners (a fresh one is random in torch's)
    start = TorchLearner(model, make_algo("sao"))
    start.critic.save_pretrained(critic)
    start.tokenizer.save_pretrained(critic)
    reference = {}
    for name in ALGOS:
        learner = TorchLearner(model, make_algo(name), value_checkpoint=str(critic))
        before = {k: v.clone() for k, v in learner.state_dict_for_engine()}
        metrics = learner.step(BATCH, GROUPS)
        reference[name] = {"metrics": metrics, "weights": dict(learner.state_dict_for_engine()), "start": before}
    torch.save(reference, tmp_path / "reference.pt")
    out = tmp_path / "step.json"
    torchrun(str(WORKER), "step", str(out), model, str(critic), str(tmp_path / "reference.pt"), str(tmp_path / "ckpt"))
    result = json.loads(out.read_text())
    assert {(r["algo"], r["tp"], r["pp"]) for r in result["steps"]} == \
        {("sao", 1, 1), ("sao", 2, 1), ("sao", 1, 2), ("grpo", 1, 1), ("grpo", 2, 1), ("sao_seq_after", 1, 1),
         ("sao_seq_after", 2, 1), ("grpo_seq_unbiased", 1, 1)}
    seq = next(r for r in result["steps"] if r["algo"] == "sao_seq_after")
    assert "value/explained_var_after" in seq["metrics"]
    assert seq["ref_metrics"]["sao/loss"] != pytest.approx(  # the options change the step
        next(r for r in result["steps"] if r["algo"] == "sao")["ref_metrics"]["sao/loss"], rel=1e-3)
    for r in result["steps"]:
        mine, ref = r["metrics"], r["ref_metrics"]
        assert set(ref) <= set(mine), set(ref) - set(mine)
        for k, v in ref.items():  # fp32, summed in another order: 1e-4 relative (times aside)
            if not k.startswith("time/"):
                assert abs(mine[k] - v) <= 1e-4 * max(1.0, abs(v)), (r["algo"], r["tp"], r["pp"], k, mine[k], v)
        # one Adam step at lr 1e-3 moves weights by up to ~1e-3; the two learners agree to 1e-4
        assert r["moved"] > 5e-4 and r["max_weight_diff"] < 1e-4, r
    after, resumed = result["after_save"], result["resumed"]
    assert after["learner/version"] == resumed["learner/version"] == 2
    assert all(abs(after[k] - resumed[k]) <= 1e-6 * max(1.0, abs(after[k])) for k in after if not k.startswith("time/")), \
        (after, resumed)
    assert "tensor_parallel=2" in result["refused"] and "learner.tensor_parallel=1" in result["refused"]


def test_training_run_under_torchrun_tp2_is_killed_and_resumes(tiny, tmp_path):
    out = tmp_path / "run"
    args = ["-m", "training.run", "learner=megatron", "learner.tensor_parallel=2", "+debug=tiny",
            "engine=hf", f"model.path={tiny['qwen2']}", f"output_dir={out}", "run_id=mcore-tp2",
            "trainer.max_steps=3"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(29900 + os.getpid() % 90), *args]
    first = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 600
    while not (out / "checkpoints" / "step_1" / "run_state.json").exists() and first.poll() is None:
        assert time.monotonic() < deadline, "no checkpoint after 10 minutes"
        time.sleep(0.5)
    # the whole run, every rank, mid-training: torchrun starts each rank in a session of its own
    # (torch's SubprocessHandler), so killing torchrun's group alone left the ranks running on
    # to the end of the run beside the resumed one
    ranks = children(first.pid)
    assert ranks, "torchrun has no rank processes"
    os.killpg(first.pid, signal.SIGKILL)
    for rank in ranks:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(rank, signal.SIGKILL)
    first.wait()
    for rank in ranks:  # gone before the resumed run starts
        while Path(f"/proc/{rank}").exists() and "zombie" not in state_of(rank):
            assert time.monotonic() < deadline, f"rank process {rank} still alive after SIGKILL"
            time.sleep(0.1)
    second = torchrun(*args[:-1], "trainer.max_steps=3")
    text = second.stdout + second.stderr
    assert "resumed from" in text and "learner: 2 ranks, tensor 2 x pipeline 1 x data 1" in text
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]  # each step logged once, across the kill
    final = out / "checkpoints" / "step_3"
    assert json.loads((final / "layout.json").read_text())["tensor_parallel"] == 2
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    AutoModelForCausalLM.from_pretrained(str(final / "policy"))  # the HF exports load as they are
    assert AutoModelForTokenClassification.from_pretrained(str(final / "critic")).config.num_labels == 1


def test_layouts_and_architectures_that_do_not_fit_are_named(tiny):
    from transformers import AutoConfig, GPT2Config

    from training.learners.mcore.model import HAVE_TE, Layout, LayoutError, check_layout, make_bridge

    config = AutoConfig.from_pretrained(tiny["qwen2"])  # 2 heads, 2 key-value heads, 2 layers
    check_layout(Layout(tensor_parallel=2), config, world=2)
    with pytest.raises(LayoutError, match="tensor_parallel=4 does not divide the model's 2 attention heads"):
        check_layout(Layout(tensor_parallel=4), config, world=4)
    with pytest.raises(LayoutError, match="pipeline_parallel=4 does not divide the model's 2 layers"):
        check_layout(Layout(pipeline_parallel=4), config, world=4)
    with pytest.raises(LayoutError, match="= 2 does not divide the 3 ranks"):
        check_layout(Layout(tensor_parallel=2), config, world=3)
    with pytest.raises(LayoutError, match="expert_parallel=2: the model .qwen2. has no experts"):
        check_layout(Layout(expert_parallel=2), config, world=2)
    moe = AutoConfig.for_model("qwen3_moe", num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, num_experts=6)
    with pytest.raises(LayoutError, match="expert_parallel=4 does not divide the model's 6 experts"):
        check_layout(Layout(expert_parallel=4), moe, world=4)
    moe8 = AutoConfig.for_model("qwen3_moe", num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=2, num_experts=8)
    check_layout(Layout(tensor_parallel=4, expert_parallel=2), moe8, world=8)  # experts over 2 data-parallel ranks
    with pytest.raises(LayoutError, match="expert_parallel=4 does not divide the 2 data-parallel ranks"):
        check_layout(Layout(tensor_parallel=4, expert_parallel=4), moe8, world=8)
    with pytest.raises(LayoutError, match="architecture 'gpt2'.*cannot be converted by mbridge; it converts .*qwen3"):
        make_bridge(GPT2Config(), torch.float32, Layout())
    if not HAVE_TE:  # experts are laid out as TE's grouped MLP: without TE, dense models only
        with pytest.raises(LayoutError, match="qwen3_moe is a mixture of experts.*Transformer Engine is not installed"):
            make_bridge(moe, torch.float32, Layout())
