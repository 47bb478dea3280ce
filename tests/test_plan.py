"""The memory plan (training/plan.py): its arithmetic against what torch and vLLM really
allocate for the tiny model, parameter counts against transformers' own Qwen3 models, the
layouts the configs and docs give (accepted) and the impossible ones (refused, with fields),
the run's check, and `python -m training.plan`'s exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from agent.tiny_model import DEFAULT_DIR, build_tiny_model
from training import plan as P

ROOT = Path(__file__).resolve().parents[1]
H100, H200 = 79 * P.GiB, 139 * P.GiB  # about what torch reports for an 80 GB H100 and a 141 GB H200
SWE = ["+experiment=swe_verified"]
QWEN3_8B_RAY_2 = SWE + ["runtime=ray", "engine.replicas=4", "ray.learner_ranks=12", "learner.tensor_parallel=4"]
# docs/cluster.md's layouts, as its commands give them
QWEN3_30B_1 = SWE + ["model.path=Qwen/Qwen3-30B-A3B", "learner.tensor_parallel=1", "learner.expert_parallel=8"]
QWEN3_30B_RAY_2 = SWE + ["model.path=Qwen/Qwen3-30B-A3B", "runtime=ray", "engine.replicas=2",
                         "+engine.options.tensor_parallel_size=2", "engine.options.gpu_memory_utilization=0.9",
                         "ray.learner_ranks=12", "learner.tensor_parallel=1", "learner.pipeline_parallel=3",
                         "learner.expert_parallel=4"]
QWEN3_30B_RAY_4 = SWE + ["model.path=Qwen/Qwen3-30B-A3B", "runtime=ray", "engine.replicas=4",
                         "+engine.options.tensor_parallel_size=2", "ray.learner_ranks=24", "learner.tensor_parallel=1",
                         "learner.pipeline_parallel=3", "learner.expert_parallel=8", "learner.logprob_chunk=2048"]


@pytest.fixture(scope="module")
def tiny() -> Path:
    return build_tiny_model(DEFAULT_DIR)


def arch_of(path) -> P.Arch:
    return P.model_arch(OmegaConf.create({"path": str(path)}))


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


# -- (a) the arithmetic against torch ----------------------------------------------------------
def test_parameter_gradient_and_adam_bytes_are_what_torch_allocates_for_the_tiny_model(tiny):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

    arch = arch_of(tiny)
    policy = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    config = AutoConfig.from_pretrained(tiny, num_labels=1)
    critic = AutoModelForTokenClassification.from_pretrained(tiny, config=config, dtype=torch.float32)
    for name, p in critic.named_parameters():  # the SAO critic's frozen attention (torch learner's rule)
        if "self_attn" in name:
            p.requires_grad_(False)
    frozen = arch.layers * arch.attention
    assert arch.policy_params() == sum(p.numel() for p in policy.parameters())  # tied: the embedding once
    assert arch.critic_params() == sum(p.numel() for p in critic.parameters())
    assert frozen == sum(p.numel() for p in critic.parameters() if not p.requires_grad)

    # one AdamW step each, as the torch learner takes them: gradients and Adam's moments as allocated
    ids = torch.randint(0, arch.vocab, (1, 16))
    optimizers = {}
    for label, model in (("policy", policy), ("critic", critic)):
        out = model(input_ids=ids)
        out.logits.float().pow(2).mean().backward()
        optimizers[label] = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        optimizers[label].step()
    rows = P.torch_rows(arch, 4, tokens=16, chunk=16, critic=True, frozen=frozen)
    for label, model in (("policy", policy), ("critic", critic)):
        assert rows[f"{label} weights"] == nbytes(model.parameters())
        assert rows[f"{label} gradients"] == nbytes(p.grad for p in model.parameters() if p.grad is not None)
        moments = [s[k] for s in optimizers[label].state.values() for k in ("exp_avg", "exp_avg_sq")]
        assert rows[f"{label} optimizer"] == nbytes(moments)


def test_megatron_bytes_a_parameter_and_their_sharding(tiny):
    arch = arch_of(tiny)
    n, c = arch.policy_params(), arch.critic_params()
    one = P.megatron_rows(arch, critic=True, frozen=0)
    assert (one["policy weights"], one["policy gradients"], one["policy optimizer"]) == (2 * n, 4 * n, 12 * n)
    assert (one["critic weights"], one["critic optimizer"]) == (2 * c, 12 * c)
    # the distributed optimizer shards the 12 bytes over data parallel, nothing else
    four = P.megatron_rows(arch, dp=4, critic=False)
    assert four["policy optimizer"] == 12 * n // 4 and four["policy weights"] == 2 * n
    assert P.megatron_rows(arch, dp=4, distributed_optimizer=False, critic=False)["policy optimizer"] == 12 * n
    # tensor parallel splits the weights (norms aside), pipeline parallel the layers
    a8b = P.KNOWN["qwen3-8b"]
    full = P.megatron_rows(a8b, critic=False)["policy weights"]
    assert abs(P.megatron_rows(a8b, tp=8, critic=False)["policy weights"] - full / 8) < 1e-4 * full
    assert P.megatron_rows(a8b, pp=2, critic=False)["policy weights"] < 0.6 * full
    # recompute keeps a layer's input instead of its whole set
    kept = P.megatron_rows(a8b, tokens=40960, critic=False)["activations"]
    assert P.megatron_rows(a8b, tokens=40960, recompute=True, critic=False)["activations (recompute)"] < kept / 10


@pytest.mark.parametrize("name", sorted(P.KNOWN))
def test_the_table_counts_what_transformers_builds(name):
    """Each known architecture's count equals a transformers model of that config (on the meta
    device: no memory), MoE included."""
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3MoeConfig

    a = P.KNOWN[name]
    kw = dict(hidden_size=a.hidden, num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
              head_dim=a.head_dim, intermediate_size=a.intermediate, vocab_size=a.vocab, tie_word_embeddings=a.tied,
              max_position_embeddings=a.max_positions)
    config = (Qwen3MoeConfig(**kw, num_experts=a.experts, num_experts_per_tok=a.top_k,
                             moe_intermediate_size=a.moe_intermediate) if a.experts else Qwen3Config(**kw))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert a.policy_params() == sum(p.numel() for p in model.parameters())
    assert P.Arch.from_config(config.to_dict(), a.name).policy_params() == a.policy_params()


# -- (b) the KV cache against vLLM's CPU engine --------------------------------------------------
def test_kv_bytes_a_token_are_what_vllms_engine_allocates(tiny, tmp_path):
    """vLLM's CPU engine with VLLM_CPU_KVCACHE_SPACE=1 GiB makes as many blocks as 1 GiB holds at
    the plan's bytes a token (fp32, the tiny model's dtype on CPU)."""
    pytest.importorskip("vllm")
    script = tmp_path / "kv.py"
    script.write_text(textwrap.dedent(f"""
        import json
        def main():
            from vllm import LLM
            llm = LLM(model={str(tiny)!r}, dtype="float32", max_model_len=4096, enforce_eager=True,
                      enable_chunked_prefill=False, max_num_batched_tokens=4096)
            cache = llm.llm_engine.vllm_config.cache_config
            print("KV", json.dumps({{"blocks": cache.num_gpu_blocks, "block_size": cache.block_size}}))
        if __name__ == "__main__":
            main()
    """))
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600)
    line = next((x for x in out.stdout.splitlines() if x.startswith("KV ")), None)
    assert line, out.stdout[-2000:] + out.stderr[-4000:]
    got = json.loads(line[3:])
    per_token = arch_of(tiny).kv_bytes_per_token(1, 4)
    assert per_token == 2 * 1 * 64 * 4 * 2  # K and V, 1 key-value head of 64, fp32, 2 layers
    assert got["blocks"] == P.GiB // (per_token * got["block_size"])


# -- (c) layouts refused and accepted -------------------------------------------------------------
def plan_of(overrides: list[str], gpu: int, per_node: int = 8, nodes: int = 1) -> P.Plan:
    return P.plan(P.compose(overrides), P.Hardware(gpu, per_node, nodes))


def test_qwen3_30b_a3b_on_one_gpu_is_refused_with_the_fields_to_change():
    p = plan_of(SWE + ["model.path=Qwen/Qwen3-30B-A3B", "learner.tensor_parallel=1"], 80 * P.GiB, per_node=1)
    assert not p.fits
    said = " ".join(p.problems)
    for name in ("learner.tensor_parallel", "learner.pipeline_parallel", "learner.expert_parallel",
                 "engine.options.gpu_memory_utilization", "engine.options.max_model_len"):
        assert name in said
    # vLLM's weights alone are more than the share the learner leaves it
    assert p.engine.weights > p.engine.budget
    assert "does not fit" in p.table()


@pytest.mark.parametrize("overrides,gpu,nodes", [
    (SWE, H100, 1), (SWE, H200, 1),  # conf/experiment/swe_verified.yaml as it is
    (QWEN3_8B_RAY_2, H100, 2), (QWEN3_8B_RAY_2, H200, 2),  # docs/cluster.md
    (QWEN3_30B_RAY_2, H200, 2), (QWEN3_30B_RAY_4, H100, 4),
    (SWE + ["learner.tensor_parallel=4"], H100, 1),  # the old layout at the plan's share
], ids=["8b-1xH100", "8b-1xH200", "8b-ray-2xH100", "8b-ray-2xH200", "30b-ray-2xH200", "30b-ray-4xH100", "8b-tp4-1xH100"])
def test_the_layouts_the_configs_and_docs_give_fit(overrides, gpu, nodes):
    p = plan_of(overrides, gpu, nodes=nodes)
    assert p.fits, p.table()
    assert p.engine.full_sequences >= 1 and all(g.total <= gpu for g in p.gpus)


@pytest.mark.parametrize("overrides,gpu,nodes", [
    (QWEN3_30B_1, H100, 1), (QWEN3_30B_1, H200, 1),  # docs/cluster.md: no 30B-A3B layout on one node
    (QWEN3_30B_RAY_2, H100, 2),
    (SWE + ["learner.tensor_parallel=4", "engine.options.gpu_memory_utilization=0.45"], H100, 1),  # the old layout
], ids=["30b-1xH100", "30b-1xH200", "30b-ray-2xH100", "8b-tp4-share0.45-1xH100"])
def test_the_layouts_the_docs_call_too_big_are_refused(overrides, gpu, nodes):
    assert not plan_of(overrides, gpu, nodes=nodes).fits


def test_colocated_under_ray_each_gpu_holds_a_learner_rank_and_a_sleeping_engine_worker():
    """ray.colocate: Qwen3-8B on one 8 x H200 node, 4 replicas of TP 2 on the 8 learner ranks'
    GPUs; the plan computes the engine's share beside a rank and counts the step's transient
    memory beyond what the sleeping engine frees. A count that does not match is named."""
    colocated = SWE + ["runtime=ray", "ray.colocate=true", "engine.replicas=4", "+engine.options.tensor_parallel_size=2",
                       "ray.learner_ranks=8", "learner.tensor_parallel=4"]
    p = plan_of(colocated, H200)
    assert p.fits, p.table()
    (gpu,) = p.gpus
    assert gpu.title == "engine worker + learner rank" and gpu.count == 8
    assert "learner step beyond the sleeping engine" in gpu.rows and "ray.colocate" in p.table()
    assert 0 < p.engine.share < P.DEDICATED_SHARE
    wrong = plan_of([o.replace("engine.replicas=4", "engine.replicas=3") for o in colocated], H200)
    assert not wrong.fits and "engine.replicas 3 x engine.options.tensor_parallel_size 2 must equal ray.learner_ranks 8" \
        in " ".join(wrong.problems)


def test_a_layout_that_does_not_divide_the_model_is_named():
    p = plan_of(SWE + ["learner.tensor_parallel=3"], H200)
    assert not p.fits and "learner.tensor_parallel=3" in p.problems[0]


def test_the_engine_share_is_the_plans(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    cfg = P.compose(SWE)
    share = P.engine_share(cfg, H100)
    # the figures conf/experiment/swe_verified.yaml, docs/cluster.md and the README give
    assert (share, P.engine_share(cfg, H200)) == (0.48, 0.68)
    p = plan_of(SWE, H100)
    assert p.engine.share == share  # unset in the config: the plan plans with the same share
    assert p.gpus[0].total <= H100 * (1 - P.SPARE) + 0.01 * H100
    assert P.engine_share(P.compose(QWEN3_8B_RAY_2), H100) == P.DEDICATED_SHARE


# -- the run's check ---------------------------------------------------------------------------------
def test_check_layout_does_nothing_on_cpu_and_stops_the_run_with_cuda(monkeypatch, capsys):
    from training import run as run_module

    too_big = P.compose(SWE + ["model.path=Qwen/Qwen3-30B-A3B", "learner.tensor_parallel=1"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    P.check_layout(too_big)  # CPU: nothing to place
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: type("Props", (), {"total_memory": 80 * P.GiB}))
    with pytest.raises(P.MemoryPlanError, match="learner.expert_parallel"):
        P.check_layout(too_big)
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    P.check_layout(P.compose(SWE))  # one 8-GPU node of 80 GiB: fits
    # training.run says it and exits 2 before any model is loaded
    monkeypatch.setattr(run_module, "start_runtime", lambda cfg: pytest.fail("started despite the plan"))
    capsys.readouterr()
    assert run_module.run(too_big) == 2
    assert "the memory plan does not fit" in capsys.readouterr().err


# -- (d) the command ------------------------------------------------------------------------------
def run_plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "training.plan", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_the_command_exits_0_when_it_fits_and_1_naming_fields_when_not():
    ok = run_plan(*SWE, "gpu_gib=79", "gpus_per_node=8", "nodes=1")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "GPU 0: engine + learner rank" in ok.stdout and "learner rank (x7)" in ok.stdout and "fits" in ok.stdout
    bad = run_plan(*SWE, "model.path=Qwen/Qwen3-30B-A3B", "learner.tensor_parallel=1", "gpu_gib=80", "gpus_per_node=1")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "does not fit" in bad.stdout and "learner.expert_parallel" in bad.stdout


def test_the_command_without_gpus_has_nothing_to_place_and_an_unknown_model_exits_2(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert P.main(SWE) == 0
    assert "nothing to place" in capsys.readouterr().out
    assert P.main(["model.path=someone/unknown-model", "gpu_gib=80"]) == 2
    assert "model.path=someone/unknown-model" in capsys.readouterr().out
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mystery"}))
    assert P.main([f"model.path={tmp_path}", "gpu_gib=80"]) == 2
    assert "'mystery'" in capsys.readouterr().out
    # the default run (torch learner on the CPU) with a GPU asked: the engine alone on GPU 0
    assert P.main(["gpu_gib=80", "gpus_per_node=1"]) == 0
    assert "on GPU 0, share 0.90, the learner on the CPU" in capsys.readouterr().out
