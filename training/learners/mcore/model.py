"""megatron-core models for the learner, through mbridge: the parallel layout, the checks that
a layout fits the model, building the policy and the critic (`GPTModel`s from the checkpoint's
HF config), loading HF weights into them and exporting HF-named weights out.

The bridge (`mbridge`) maps HF names and layouts to megatron's and back, gathers across
tensor, pipeline and expert parallel ranks, and knows Qwen2, Qwen3, Qwen3-MoE, GLM-4 MoE,
DeepSeek-V3, Llama and Mixtral. What is ours: the layer spec without Transformer Engine (the
bridge assumes TE; without it megatron's local modules are used and two norm names differ),
the critic's value head, and the checks.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from agent.engines.base import rope_scaling_of
from training.learners.base import LayoutError

try:  # Transformer Engine: fused kernels and packed (THD) attention on GPUs
    import transformer_engine  # noqa: F401

    HAVE_TE = True
except ImportError:
    HAVE_TE = False


@dataclass(frozen=True)
class Layout:
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    expert_parallel: int = 1
    sequence_parallel: bool = True  # with tensor_parallel > 1

    def data_parallel(self, world: int) -> int:
        return world // (self.tensor_parallel * self.pipeline_parallel)

    def describe(self, world: int) -> dict:
        return {**asdict(self), "data_parallel": self.data_parallel(world), "world": world}


def check_layout(layout: Layout, hf_config, world: int) -> None:
    """Every way a layout can fail to divide the model or the ranks, named by field and value."""
    tp, pp, ep = layout.tensor_parallel, layout.pipeline_parallel, layout.expert_parallel
    for field, value in (("tensor_parallel", tp), ("pipeline_parallel", pp), ("expert_parallel", ep)):
        if not isinstance(value, int) or value < 1:
            raise LayoutError(f"learner.{field}={value!r}: must be a positive integer")
    if world % (tp * pp):
        raise LayoutError(f"learner.tensor_parallel={tp} x learner.pipeline_parallel={pp} = {tp * pp} "
                          f"does not divide the {world} ranks (torchrun --nproc-per-node x nodes)")
    dp = world // (tp * pp)
    rope = rope_scaling_of(hf_config)
    if rope:  # mbridge's bridges pass rope_theta (rotary_base) to Megatron and nothing of the scaling
        raise LayoutError(f"model.path: the model's RoPE is scaled ({rope}); mbridge 0.15 builds Megatron's rotary "
                          "embedding without rope_scaling, so this learner's logprobs would differ from the engine's "
                          "(vLLM applies the scaling). Train it with learner=torch, or without rope_scaling in its config.json")
    heads, groups = hf_config.num_attention_heads, getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads
    if heads % tp:
        raise LayoutError(f"learner.tensor_parallel={tp} does not divide the model's {heads} attention heads")
    if groups % tp:
        raise LayoutError(f"learner.tensor_parallel={tp} does not divide the model's {groups} key-value heads")
    if hf_config.vocab_size % tp:
        raise LayoutError(f"learner.tensor_parallel={tp} does not divide the model's vocabulary of {hf_config.vocab_size}")
    ffn = getattr(hf_config, "intermediate_size", None)
    if ffn and ffn % tp:
        raise LayoutError(f"learner.tensor_parallel={tp} does not divide the model's intermediate_size {ffn}")
    layers = hf_config.num_hidden_layers
    if layers % pp:
        raise LayoutError(f"learner.pipeline_parallel={pp} does not divide the model's {layers} layers")
    experts = _num_experts(hf_config)
    if ep > 1 and not experts:
        raise LayoutError(f"learner.expert_parallel={ep}: the model ({hf_config.model_type}) has no experts")
    if experts and experts % ep:
        raise LayoutError(f"learner.expert_parallel={ep} does not divide the model's {experts} experts")
    if dp % ep:  # megatron: experts are split over data-parallel ranks (expert tensor parallel = TP)
        raise LayoutError(f"learner.expert_parallel={ep} does not divide the {dp} data-parallel ranks "
                          f"({world} ranks / tensor {tp} x pipeline {pp})")


def _num_experts(hf_config) -> int:
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if getattr(hf_config, key, None):
            return int(getattr(hf_config, key))
    return 0


def init_parallel(layout: Layout, seed: int) -> None:
    """Join (or, in one process, start) the process group and set megatron's parallel state."""
    from megatron.core import parallel_state, tensor_parallel

    if not dist.is_initialized():  # one process: an in-memory store, no port to take or leak
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", store=dist.HashStore(),
                                rank=0, world_size=1)
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=layout.tensor_parallel,
        pipeline_model_parallel_size=layout.pipeline_parallel,
        expert_model_parallel_size=layout.expert_parallel,
    )
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


# -- the bridge ---------------------------------------------------------------------------------
def hf_config_of(path: str):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    # transformers 5 keeps RoPE's base in rope_parameters; the bridge reads rope_theta
    if getattr(config, "rope_theta", None) is None and getattr(config, "rope_parameters", None):
        config.rope_theta = config.rope_parameters.get("rope_theta")
    return config


def supported_architectures() -> list[str]:
    from mbridge import AutoBridge

    return sorted(AutoBridge.list_supported_models())


def make_bridge(hf_config, dtype: torch.dtype, layout: Layout, value_model: bool = False,
                recompute: bool = False):
    """An mbridge `Bridge` for this config and layout: the policy's, or (value_model) the
    critic's, whose output layer is a scalar value head and whose embedding is never tied to it."""
    from mbridge import AutoBridge

    if hf_config.model_type not in supported_architectures():
        raise LayoutError(f"model.path: architecture {hf_config.model_type!r} ({', '.join(hf_config.architectures or [])}) "
                          f"cannot be converted by mbridge; it converts {', '.join(supported_architectures())}")
    if not HAVE_TE and _num_experts(hf_config):
        raise LayoutError(f"model.path: {hf_config.model_type} is a mixture of experts; mbridge lays its experts out "
                          "as Transformer Engine's grouped MLP, and Transformer Engine is not installed (GPU "
                          "machines: pip install transformer-engine). Without it, dense models only")
    config = copy.deepcopy(hf_config)
    if value_model:
        config.tie_word_embeddings = False  # the head is [1, H]: nothing to share with the embedding
    bridge = AutoBridge.from_config(config, dtype=dtype)
    # the bridge keeps its name maps on the class and edits them for tied embeddings: give each
    # bridge its own, so a policy (tied) and a critic (untied) of one model do not mix them up
    bridge._DIRECT_MAPPING = dict(type(bridge)._DIRECT_MAPPING)
    bridge._MLP_MAPPING = dict(type(bridge)._MLP_MAPPING)
    bridge._OTHER_MAPPING = dict(getattr(type(bridge), "_OTHER_MAPPING", {}))
    tied = getattr(hf_config, "tie_word_embeddings", False)
    # (set either way: a tied model built earlier in this process has edited the class's map)
    bridge._DIRECT_MAPPING["output_layer.weight"] = "model.embed_tokens.weight" if tied else "lm_head.weight"
    if value_model:  # the value head is transformers' token-classification head, `score`
        bridge._DIRECT_MAPPING["output_layer.weight"] = "score.weight"
        bridge._DIRECT_MAPPING["output_layer.bias"] = "score.bias"
        hidden = hf_config.hidden_size
        bridge._get_safetensor_io = lambda path: _value_io(bridge._get_actual_hf_path(path), hidden)
    extra = {"sequence_parallel": layout.tensor_parallel > 1 and layout.sequence_parallel,
             "calculate_per_token_loss": True,  # the loss is a token mean over the whole batch
             "hidden_dropout": 0.0, "attention_dropout": 0.0}
    if recompute:
        extra.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    if not HAVE_TE:
        extra["masked_softmax_fusion"] = False  # the fused softmax is a CUDA kernel
        bridge._get_transformer_layer_spec = lambda vp_stage=None: _local_block_spec(bridge.config)
        # megatron's local modules name the two pre-norms apart from TE's fused ones
        bridge._OTHER_MAPPING["input_layernorm.weight"] = ["model.layers.{layer_number}.input_layernorm.weight"]
        bridge._MLP_MAPPING = {"pre_mlp_layernorm.weight": ["model.layers.{layer_number}.post_attention_layernorm.weight"],
                               **bridge._MLP_MAPPING}
    bridge.set_extra_args(**extra)
    return bridge


def _value_io(path: str, hidden: int):
    """The bridge's safetensors reader for a critic: a checkpoint without a value head (the
    policy's own, the usual start) gives a fresh one, zeros, so every value starts at 0."""
    from mbridge.core.safetensor_io import SafeTensorIO

    class ValueIO(SafeTensorIO):
        def load_some_hf_weight(self, hf_weight_names):
            fresh = {"score.weight": torch.zeros(1, hidden), "score.bias": torch.zeros(1)}
            have = set(self.load_hf_weight_names())
            missing = {n: fresh[n] for n in hf_weight_names if n in fresh and n not in have}
            found = super().load_some_hf_weight([n for n in hf_weight_names if n not in missing]) \
                if len(missing) < len(hf_weight_names) else {}
            return {**found, **missing}

    return ValueIO(path)


class _RMSNorm(torch.nn.RMSNorm):
    """torch's RMSNorm as megatron's local spec builds it, with the weight marked
    `sequence_parallel` so megatron sums its gradient over tensor-parallel ranks (each sees
    only its slice of the sequence). megatron's own wrapper refuses sequence parallel."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **_):
        super().__init__(hidden_size, eps=eps, dtype=config.params_dtype)
        self.weight.sequence_parallel = config.sequence_parallel


def _local_block_spec(config):
    """megatron's local (no Transformer Engine) decoder spec, RMSNorm everywhere."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization="RMSNorm")
    for layer in spec.layer_specs:
        sub = layer.submodules
        sub.input_layernorm = _RMSNorm
        sub.pre_mlp_layernorm = _RMSNorm
        attn = sub.self_attention.submodules
        if config.qk_layernorm:
            attn.q_layernorm = attn.k_layernorm = _RMSNorm
    spec.layer_norm = _RMSNorm
    return spec


class ValueHead(torch.nn.Linear):
    """The critic's output layer: one value per token, [s, b, 1] fp32 as megatron's output
    layer is called. Under sequence parallel each rank holds a slice of the sequence: the
    values are gathered, and the weight's gradient is summed over tensor-parallel ranks."""

    def __init__(self, hidden: int, config):
        super().__init__(hidden, 1, bias=True, dtype=config.params_dtype)
        self.sequence_parallel = config.sequence_parallel
        for p in self.parameters():
            p.sequence_parallel = config.sequence_parallel

    def forward(self, hidden, weight=None, runtime_gather_output=None):
        from megatron.core import tensor_parallel

        values = super().forward(hidden).float()
        if self.sequence_parallel:
            values = tensor_parallel.gather_from_sequence_parallel_region(values, tensor_parallel_output_grad=False)
        return values, None


def _value_head(model, pre_process, post_process, config, hf_config):
    if post_process:
        model.output_layer = ValueHead(config.hidden_size, config)
    model.share_embeddings_and_output_weights = False


def _freeze_attention(model, pre_process, post_process, config, hf_config):
    """The attention's projections (and its q/k norms) stop training, as the torch learner's
    `self_attn`; the input norm trains, including where Transformer Engine fuses it into
    `linear_qkv` (`layer_norm_weight`)."""
    for name, p in model.named_parameters():
        if ".self_attention." in name and "linear_qkv.layer_norm_" not in name:
            p.requires_grad_(False)


def build(bridge, model_path: str, *, value_model: bool = False, freeze_attention: bool = False,
          bf16: bool = False, distributed_optimizer: bool = True) -> list:
    """The model chunks (DDP-wrapped), with the checkpoint's weights loaded through the bridge.
    A critic gets a value head (loaded too from a value checkpoint's `score.*`); a policy's
    forward returns its final hidden states, for `training.learners.mcore.logprobs`."""
    from training.learners.mcore.logprobs import hidden_out

    # the policy's logprobs are computed from its hidden states in chunks (training/learners/mcore/logprobs.py)
    callbacks = ([_value_head] if value_model else [hidden_out]) + ([_freeze_attention] if freeze_attention else [])
    ddp = {"grad_reduce_in_fp32": True, "use_distributed_optimizer": distributed_optimizer,
           "overlap_grad_reduce": False, "overlap_param_gather": False}
    chunks = bridge.get_model(post_model_creation_callbacks=callbacks, wrap_with_ddp=True, bf16=bf16, fp16=False,
                              ddp_config=ddp, data_parallel_random_init=False)
    bridge.load_weights(chunks, model_path)
    return chunks


def _unwrap(module):
    while hasattr(module, "module"):
        module = module.module
    return module


def gather_hf(bridge, chunks) -> dict[str, torch.Tensor]:
    """Every weight by HF name, gathered across TP/PP/EP by the bridge, on the CPU. A collective:
    every rank takes part; rank 0 keeps the tensors, the others drop each once it is gathered
    (and get {}). A critic's head is `score.*`; a tied embedding sent by two pipeline stages is
    kept once."""
    keep = not dist.is_initialized() or dist.get_rank() == 0
    weights: dict[str, torch.Tensor] = {}
    for name, tensor in bridge.export_weights(chunks):
        if keep:
            weights[name] = tensor.detach().to("cpu").contiguous()
    return weights


def save_hf(bridge, chunks, out: Path, hf_config, value_model: bool = False) -> None:
    """An HF checkpoint (safetensors + config) that `from_pretrained` loads: a causal LM, or
    (value_model) a token-classification model with one label, as the torch learner's critic.
    Written by rank 0; every rank takes part in the gather."""
    from safetensors.torch import save_file

    tensors = gather_hf(bridge, chunks)
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    out.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(hf_config)
    if value_model:
        config.architectures = [config.architectures[0].replace("ForCausalLM", "ForTokenClassification")]
        config.num_labels = 1
        config.id2label, config.label2id = {0: "LABEL_0"}, {"LABEL_0": 0}
        config.tie_word_embeddings = False
        tensors.pop("lm_head.weight", None)
    elif getattr(config, "tie_word_embeddings", False):
        tensors.pop("lm_head.weight", None)  # tied: transformers rebuilds it from the embedding
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(out)
