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
    # recompute keeps a layer's input instead of its whole set (one layer's set and its backward on top)
    kept = P.megatron_rows(a8b, tokens=40960, critic=False)["activations"]
    assert P.megatron_rows(a8b, tokens=40960, recompute=True, critic=False)["activations (recompute)"] < kept / 8


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


def meta_model(a: P.Arch, layers: int | None = None):
    """transformers' model of a known architecture on the meta device (no memory), bf16."""
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3MoeConfig

    kw = dict(hidden_size=a.hidden, num_hidden_layers=layers or a.layers, num_attention_heads=a.heads,
              num_key_value_heads=a.kv_heads, head_dim=a.head_dim, intermediate_size=a.intermediate,
              vocab_size=a.vocab, tie_word_embeddings=a.tied, max_position_embeddings=a.max_positions)
    config = (Qwen3MoeConfig(**kw, num_experts=a.experts, num_experts_per_tok=a.top_k,
                             moe_intermediate_size=a.moe_intermediate) if a.experts else Qwen3Config(**kw))
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config).to(torch.bfloat16)


def test_the_weight_syncs_chunk_is_the_sync_codes():
    """The chunk a sync lands on the engine's GPU, as the project's sync code sizes it: the IPC
    staging buffer (vllm_transfer.ipc_buffer_bytes, which vLLM's consumer clones) under
    torchrun, the largest bucket collective.make_plan makes by NCCL under Ray, nothing through
    the host (colocated: gloo). Qwen3-8B's own tensors, on the meta device."""
    pytest.importorskip("vllm")
    from agent.engines import collective, vllm_transfer

    a = P.KNOWN["qwen3-8b"]
    tensors = list(meta_model(a).state_dict().items())
    B = collective.DEFAULT_BUCKET_BYTES
    assert B == vllm_transfer.DEFAULT_BUCKET_BYTES == P.compose(SWE).engine.options.bucket_mb << 20
    W = max(nbytes([t]) for _, t in tensors)
    assert a.largest_tensor() * 2 == W  # the embedding (and the untied head), 1.2 GB in bf16

    ipc = P.sync_costs(P.compose(SWE), a)
    assert ipc.transport == "ipc" and ipc.chunk == ipc.send == vllm_transfer.ipc_buffer_bytes(B, tensors)
    nccl = P.sync_costs(P.compose(QWEN3_8B_RAY_2), a)
    buckets = collective.make_plan([collective.meta_of(n, t) for n, t in tensors], 12, B)
    assert nccl.transport == "nccl" and max(b["nbytes"] for b in buckets) <= nccl.chunk == B + W
    colocated = P.sync_costs(P.compose(QWEN3_8B_RAY_2 + ["ray.colocate=true"]), a)
    assert colocated.transport == "gloo" and colocated.chunk == colocated.send == 0
    # the Megatron learner gathers W, by collective a bucket of such tensors, before it sends
    assert ipc.learner_side("megatron") == W + ipc.send and nccl.learner_side("megatron") == 2 * (B + W)
    assert ipc.learner_side("torch") == ipc.send  # the torch learner sends its own tensors


@pytest.mark.parametrize("name", ["qwen3-8b", "qwen3-30b-a3b"])
def test_the_rebuilt_layer_is_the_largest_module(name):
    """vLLM's layerwise reload rebuilds one module at a time, its own parameters (vllm
    model_executor/model_loader/reload/utils.get_layer_params_buffers, recurse=False): the
    largest is the embedding, or an MoE layer's experts, one module in vLLM as in transformers."""
    a = P.KNOWN[name]
    model = meta_model(a, layers=2)
    own = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    assert a.engine_module(1) == own
    assert a.engine_module(2) == own // 2  # vocabulary or experts' intermediate over tensor parallel
    sync = P.sync_costs(P.compose(SWE + [f"model.path=Qwen/{P.KNOWN[name].name.split('/')[-1]}"]), a)
    assert sync.reload == own * 2 + sync.chunk  # bf16


def test_one_layers_backward_is_what_megatron_allocates(tmp_path):
    """The backward through a layer holds, beyond the layer's kept set, what megatron-core's own
    code makes on CPU: a column-parallel linear under sequence parallel (tensor parallel 2, the
    all-gather done by hand) gathers its input into megatron's buffer, [T, h]; SwiGLU's
    backward makes the gradients of the fc1 output and of the activation, 3 f / tp a token."""
    script = tmp_path / "backward.py"
    script.write_text(textwrap.dedent("""
        import json
        import torch
        from training.learners.mcore import cpu
        cpu.enable()
        from megatron.core import parallel_state as ps
        from megatron.core.fusions.fused_bias_swiglu import bias_swiglu_impl
        from megatron.core.tensor_parallel import layers

        T_LOCAL, TP, H, F = 8, 2, 16, 24
        class Done:
            def wait(self):
                pass
        class Group:  # a tensor-parallel group of 2, this rank's shard standing for both
            def size(self):
                return TP
        def all_gather(out, shard, group=None, async_op=False):
            out.copy_(torch.cat([shard] * TP))
            return Done() if async_op else None
        def reduce_scatter(out, full, group=None, async_op=False):
            out.copy_(full.view(TP, -1, full.shape[-1]).sum(0))
            return Done() if async_op else None
        layers.dist_all_gather_func, layers.dist_reduce_scatter_func = all_gather, reduce_scatter
        ps._set_global_memory_buffer()
        bf16 = dict(dtype=torch.bfloat16, requires_grad=True)
        x = torch.randn(T_LOCAL, H, **bf16)  # this rank's shard of the sequence
        fc1 = layers.LinearWithGradAccumulationAndAsyncCommunication.apply(
            x, torch.randn(2 * F // TP, H, **bf16), None, False, False, True, None, 0, Group())
        grads = []
        fc1.register_hook(grads.append)
        act = bias_swiglu_impl(fc1, None)
        act.register_hook(grads.append)
        (act @ torch.randn(H, F // TP, **bf16).t()).float().pow(2).sum().backward()
        buffer = ps.get_global_memory_buffer().buffer[("mpu", torch.bfloat16)]
        print("BYTES", json.dumps({"tokens": T_LOCAL * TP, "gathered": buffer.numel() * buffer.element_size(),
                                   "grads": sum(g.numel() * g.element_size() for g in grads),
                                   "shapes": [list(g.shape) for g in grads]}))
    """))
    out = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    line = next((x for x in out.stdout.splitlines() if x.startswith("BYTES ")), None)
    assert line, out.stdout[-2000:] + out.stderr[-4000:]
    got = json.loads(line[6:])
    assert got["shapes"] == [[16, 12], [16, 24]]  # the activation's [T, f/tp], then fc1's [T, 2f/tp]
    arch = P.Arch(name="t", hidden=16, layers=1, heads=2, kv_heads=1, head_dim=8, intermediate=24, vocab=32,
                  tied=True, max_positions=64)
    extra = P.layer_backward_extra(arch, got["tokens"], 2, tp=2, sequence_parallel=True)
    assert extra == {"gathered input": got["gathered"], "MLP intermediate gradient": got["grads"]}
    assert P.layer_backward_extra(arch, got["tokens"], 2, tp=2)["gathered input"] == 0  # no sequence parallel
    # at Qwen3-8B's 40,960 tokens (tensor 8) it more than doubles the one layer recompute rebuilds
    a8b = P.KNOWN["qwen3-8b"]
    rows = P.megatron_rows(a8b, tp=8, tokens=40960, recompute=True, critic=False)
    kept = a8b.layers * 40960 * a8b.hidden * 2 / 8
    rebuilt = rows["activations (recompute)"] - kept - sum(P.layer_backward_extra(a8b, 40960, 2, 8, True).values())
    assert sum(P.layer_backward_extra(a8b, 40960, 2, 8, True).values()) > rebuilt > 0


def test_each_engine_worker_opens_a_communicator_per_learner_rank(monkeypatch):
    """The engine's side of weights by collective opens one group per learner rank
    (agent/engines/vllm_collective.py); the plan counts each as NCCL_BUFFSIZE (NCCL's 4 MiB
    default) x NCCL_CHANNELS on every engine GPU, and one per replica on every learner rank."""
    pytest.importorskip("vllm")
    from types import SimpleNamespace

    from agent.engines import vllm_collective

    opened = []
    monkeypatch.setattr(vllm_collective, "open_group", lambda *args, **kwargs: opened.append(args) or object())
    worker = vllm_collective.CollectiveWeightTransferEngine.__new__(vllm_collective.CollectiveWeightTransferEngine)
    worker.vllm_config = SimpleNamespace(parallel_config=SimpleNamespace(rank=0, world_size=1))
    worker.init_transfer_engine(vllm_collective.CollectiveInitInfo(
        senders=[["10.0.0.1", 29500 + k] for k in range(12)], prefix="sync0", workers=1, transport="nccl"))
    assert len(opened) == 12  # ray.learner_ranks of docs/cluster.md's two-node layouts
    p = plan_of(QWEN3_8B_RAY_2, H100, nodes=2)
    engine_gpu, learner_gpu = p.gpus
    assert P.NCCL_BUFFSIZE == 4 << 20 and P.NCCL_COMMUNICATOR == P.NCCL_BUFFSIZE * P.NCCL_CHANNELS
    assert engine_gpu.rows[P.COMMUNICATORS_ROW] == len(opened) * P.NCCL_COMMUNICATOR  # 1.5 GiB, not in the share
    assert learner_gpu.rows[P.COMMUNICATORS_ROW] == 4 * P.NCCL_COMMUNICATOR  # engine.replicas=4
    assert engine_gpu.rows[P.RELOAD_ROW] > 0 and p.fits
    # colocated, the sync goes through the host: no communicators of its own
    colocated = plan_of(SWE + ["runtime=ray", "ray.colocate=true", "engine.replicas=4",
                               "+engine.options.tensor_parallel_size=2", "ray.learner_ranks=8",
                               "learner.tensor_parallel=4"], H200)
    assert P.COMMUNICATORS_ROW not in colocated.gpus[0].rows


def test_a_sleeping_engine_is_planned_with_the_learners_release_and_the_sync_after_its_wake():
    """Asleep while the learner steps (issue 44): what stays beside the awake engine is what the
    learner's release leaves (weights, optimizer states; Megatron's gradient buffers, not the
    torch learner's gradients), and the larger of the step beyond the sleeping engine and the
    sync's learner side plus the engine's reload is counted."""
    asleep = SWE + ["learner.tensor_parallel=4", "engine.options.gpu_memory_utilization=0.45",
                    "+engine.options.sleep_during_step=true"]
    p = plan_of(asleep, H100)
    gpu0 = p.gpus[0]
    arch, cfg = P.KNOWN["qwen3-8b"], P.compose(asleep)
    sync = P.sync_costs(cfg, arch)
    assert sync.transport == "ipc" and gpu0.rows[P.SLEEP_ROW] == sync.learner_side("megatron") + sync.reload
    assert "policy gradients" in gpu0.rows and not any(r.startswith(("activations", P.LOSS_ROW)) for r in gpu0.rows)
    assert "learner.release_memory" in p.table() and not p.fits
    torch_learner = plan_of(["learner.device=cuda", "+engine.options.sleep_during_step=true"], H100, per_node=1)
    (gpu,) = torch_learner.gpus
    assert "policy weights" in gpu.rows and "policy gradients" not in gpu.rows  # set to None by the release
    assert torch_learner.fits


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
], ids=["8b-1xH100", "8b-1xH200", "8b-ray-2xH100", "8b-ray-2xH200", "30b-ray-2xH200", "30b-ray-4xH100"])
def test_the_layouts_the_configs_and_docs_give_fit(overrides, gpu, nodes):
    p = plan_of(overrides, gpu, nodes=nodes)
    assert p.fits, p.table()
    assert p.engine.full_sequences >= 1 and all(g.total <= gpu for g in p.gpus)


@pytest.mark.parametrize("overrides,gpu,nodes", [
    (QWEN3_30B_1, H100, 1), (QWEN3_30B_1, H200, 1),  # docs/cluster.md: no 30B-A3B layout on one node
    (QWEN3_30B_RAY_2, H100, 2),
    (SWE + ["learner.tensor_parallel=4", "engine.options.gpu_memory_utilization=0.45"], H100, 1),  # the old layout
    # the old layout at the share the plan computes for it: its KV cache holds no 40K sequence
    # once the weight sync's reload and one layer's backward are counted
    (SWE + ["learner.tensor_parallel=4"], H100, 1),
    # issue 44's: asleep while the learner steps, the sync after the wake does not fit beside the
    # awake engine (the plan said 0.9 GiB free when it counted neither release nor sync)
    (SWE + ["learner.tensor_parallel=4", "engine.options.gpu_memory_utilization=0.45",
            "+engine.options.sleep_during_step=true"], H100, 1),
], ids=["30b-1xH100", "30b-1xH200", "30b-ray-2xH100", "8b-tp4-share0.45-1xH100", "8b-tp4-1xH100",
        "8b-tp4-share0.45-asleep-1xH100"])
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
    assert P.SLEEP_ROW in gpu.rows and "ray.colocate" in p.table()
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
    # the figures conf/experiment/swe_verified.yaml and docs/cluster.md give
    assert (share, P.engine_share(cfg, H200)) == (0.44, 0.66)
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
