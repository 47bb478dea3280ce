"""The memory plan: what each GPU of a run's layout holds, computed from the composed config
before anything starts, and whether it fits.

    python -m training.plan +experiment=swe_verified [gpu_gib=79] [gpus_per_node=8] [nodes=1]

prints a table per kind of GPU (a learner rank's, an engine's, GPU 0 where torchrun's rank 0
holds both) and exits 0 when the layout fits, 1 (naming the fields to change) when it does
not, 2 when the model's architecture is unknown. `training.run` calls `check_layout` first:
with CUDA a layout that does not fit stops the run (exit 2) before any model is loaded.

These are computed estimates, not measurements. The arithmetic (bytes; P parameters on the
GPU, T tokens in a micro-batch, h hidden, a heads, g key-value heads, d head_dim, f the MLP's
intermediate size, V vocabulary, L layers):

- Weights, gradients, Adam (learner). Megatron (bf16 on GPUs): 2 B/param bf16 weights, 4 B/param
  fp32 gradients (its DDP reduces in fp32), 12 B/param fp32 master weights + Adam's two
  moments (fp32 weights: 4 + 4 + 8), the 12 divided by data parallel under
  `learner.distributed_optimizer` (by data parallel / expert parallel for experts). Tensor
  parallel splits every matrix (experts: expert parallel x tensor parallel), pipeline parallel
  the layers; the larger stage is planned (the first keeps the embedding, the last the final
  norm and the output layer). torch: a whole replica in `learner.dtype`, weights, gradients
  and AdamW's two moments each that many bytes a parameter. Frozen parameters (the critic's
  attention under `algo.freeze_critic_attention`) have weights only.
- The critic is the policy's model with a value head [h] + bias in place of the output layer
  (training/learners/mcore/model.py, torch.py's token-classification model): the same
  body, never tied.
- Activations (learner), after Korthikanti et al. 2022 ("Reducing Activation Recomputation in
  Large Transformer Models"), counted for this architecture with flash attention (no [T, T]
  scores) and no dropout, e = 2 (bf16), sp = tensor parallel under sequence parallel (else 1):
  a layer keeps 4 h T e / sp (the two norms' inputs and outputs) + T e (3 a d + 3 g d) / tp
  (q, k, v; q and k after norm and rotary; the attention's output) + T a 4 / tp (softmax
  statistics) + T e 3 f / tp (the MLP's gate+up and its activation); an MoE layer instead of
  3 f keeps T k e (h + 3 f_moe / tp) for its k routed copies of each token and T E 8 / sp of
  router logits. With `learner.recompute` (full, one layer a checkpoint) a layer keeps only
  its input, T h e / sp, and one layer's full set is rebuilt in the backward pass. Recompute or
  not, the backward through a layer holds more than that layer kept (`layer_backward_extra`):
  under sequence parallel the input all-gathered again, T h e, and the MLP intermediate's
  gradient, T e 3 f / tp (an MoE layer: T k e 3 f_moe / tp). The first
  pipeline stage holds pipeline_parallel micro-batches in flight (1F1B). T is
  `learner.micro_batch_tokens`, or the longest trajectory (agent.max_tokens, capped by
  engine.options.max_model_len) where that is longer: a trajectory is never split. The torch
  learner (transformers' modules, no recompute, no sharding) keeps more a layer: 4 h + 4 a d +
  3 g d + 4 f elements, and RMSNorm's fp32 copies below fp32.
- The loss (last stage): the final hidden states gathered [T, h] and their gradient (2 T h e),
  and one chunk of logits, `learner.logprob_chunk` x V / tp, as the matmul's output, fp32, its
  softmax and its gradient (e + 12 bytes each). The learner's side of a weight sync
  (`SyncCosts.learner_side`, below) happens between steps: the larger of the two.
- Engine (vLLM): its share of the GPU (`engine.options.gpu_memory_utilization` x the GPU;
  unset: `engine_share`) holds its weights / its tensor parallel, its activation peak for
  max_num_batched_tokens N (vLLM's default for the async engine 2048) and max_num_seqs S (128):
  N e (2 h + (2 a + 2 g) d / tp + 3 f / tp) + S V 12 (the sampler's logits, probabilities,
  logprobs), 1 GiB of CUDA context, vLLM's own communicators and cuBLAS workspaces, 1 GiB of
  CUDA graphs unless enforce_eager, and the KV cache in what is left: 2 max(1, g / tp) d e_kv L
  bytes a token.
- Weight sync (`sync_costs`), by how the weights travel: `ipc` (torchrun: the engine beside
  rank 0 on one GPU), `inline` (an engine over several GPUs, or runtime=ray's object store:
  bytes on the host), weights by collective over `nccl` (runtime=ray) or `gloo` (ray.colocate:
  through the host). B is the bucket (`engine.options.bucket_mb`, agent/engines/collective.py's
  DEFAULT_BUCKET_BYTES), W the checkpoint's largest tensor as sent. Outside the engine's share,
  on every GPU of an engine worker, vLLM's layerwise reload holds one rebuilt layer (its largest
  module, / its tensor parallel) and the chunk that arrived on the GPU: ipc max(B, W) (vLLM
  clones the staging buffer's tensors), nccl B + W (a bucket closes once it holds B or more),
  none through the host. A learner rank holds, beside its weights: Megatron's gathered tensor
  (W) or, by collective, its open bucket of them (B + W), and its send buffer on the GPU (ipc:
  the staging buffer, max(B, W); nccl: the packed bucket, B + W). Each NCCL communicator of
  the sync (one per learner rank on each engine worker, one per replica on each learner rank)
  holds NCCL_BUFFSIZE x NCCL_CHANNELS (4 MiB x 32, the assumption below), outside any share.
- A learner process adds 2 GiB (CUDA context, its own NCCL groups' buffers, allocator slack).
  Under torchrun the engine's share computed for GPU 0 leaves 5% of the GPU spare besides.
- An engine that sleeps while the learner steps (`engine.options.sleep_during_step`,
  `ray.colocate`): the learner releases its step's memory before the engine wakes
  (`release_memory`), so what stays allocated beside the awake engine is its weights and
  optimizer states (and Megatron's gradient buffers, which live as long as the model; the
  torch learner's gradients go). The GPU then holds the larger of the step's transient beyond
  what the sleeping engine frees and, with the engine awake, the sync's learner side and its
  reload.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from agent.engines.collective import DEFAULT_BUCKET_BYTES
from training.config import CONF
from training.learners.base import LayoutError

GiB = 1 << 30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}
LEARNER_OVERHEAD = 2 * GiB  # a learner process: CUDA context, NCCL buffers, allocator slack
ENGINE_OVERHEAD = 1 * GiB  # vLLM: CUDA context, its own tensor-parallel communicators, cuBLAS workspaces
CUDA_GRAPHS = 1 * GiB  # vLLM's captured graphs when not enforce_eager (inside its share since 0.21)
DEDICATED_SHARE = 0.9  # an engine alone on its GPU, as the engine's own default
SPARE = 0.05  # of a shared GPU the computed share leaves free, for what these estimates miss
VLLM_BATCHED_TOKENS = 2048  # vLLM 0.32's max_num_batched_tokens for AsyncLLM (ENGINE_CONTEXT)
VLLM_MAX_SEQS = 128  # and its max_num_seqs
VLLM_BLOCK = 16  # tokens a KV block on CUDA
PLAN_OPTIONS = {"gpu_gib": float, "gpus_per_node": int, "nodes": int}
LOSS_ROW = "loss chunk | weight sync"  # the larger: they never coincide
PROCESS_ROW = "CUDA context, NCCL, slack"
RELOAD_ROW = "weight sync: engine's reload"  # a rebuilt layer + the chunk received, outside the engine's share
COMMUNICATORS_ROW = "weight sync: NCCL communicators"
SLEEP_ROW = "step beyond sleeping engine | weight sync"  # the larger: the step, or the sync after the wake
# Each NCCL communicator of a weight sync by collective keeps, per channel and connection, the
# Simple protocol's buffer: NCCL_BUFFSIZE, 4 MiB unless set (NCCL's DEFAULT_BUFFSIZE, src/init.cc).
# The channels NCCL picks by topology; assumed here: 32, the most a ring takes (MAXCHANNELS / 2,
# as torch/_inductor/comm_analysis.py puts it, which estimates 16 on Hopper), the room above
# that covering the LL and LL128 protocols' smaller buffers.
NCCL_BUFFSIZE = 4 << 20
NCCL_CHANNELS = 32
NCCL_COMMUNICATOR = NCCL_BUFFSIZE * NCCL_CHANNELS


class MemoryPlanError(LayoutError):
    """A layout whose memory plan does not fit its GPUs (said with the fields to change)."""


class UnknownArchitecture(ValueError):
    """A model whose shape the plan cannot find (not a local folder, not cached, not in the table)."""


# -- the model's shape -----------------------------------------------------------------------
@dataclass(frozen=True)
class Arch:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    max_positions: int
    experts: int = 0
    top_k: int = 0
    moe_intermediate: int = 0
    moe_layers: int = 0  # layers whose MLP is the experts (the others dense)
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = True
    dtype: str = "bfloat16"  # the checkpoint's

    # parameter counts ------------------------------------------------------------------------
    @property
    def attention(self) -> int:
        """One layer's attention: q, k, v, o (+ biases, + q/k norms)."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        n = self.hidden * (q + 2 * kv) + q * self.hidden
        n += (q + 2 * kv) * self.qkv_bias + self.hidden * self.o_bias
        return n + 2 * self.head_dim * self.qk_norm

    @property
    def dense_mlp(self) -> int:
        return 3 * self.hidden * self.intermediate

    @property
    def expert_mlp(self) -> int:
        """One MoE layer's experts (the router apart)."""
        return self.experts * 3 * self.hidden * self.moe_intermediate

    @property
    def router(self) -> int:
        return self.hidden * self.experts

    @property
    def embedding(self) -> int:
        return self.vocab * self.hidden

    def body(self) -> int:
        """Embedding, layers, final norm: what policy and critic share."""
        dense_layers = self.layers - self.moe_layers
        layer = self.attention + 2 * self.hidden
        return (self.embedding + self.layers * layer + dense_layers * self.dense_mlp
                + self.moe_layers * (self.router + self.expert_mlp) + self.hidden)

    def policy_params(self) -> int:
        return self.body() + (0 if self.tied else self.embedding)

    def critic_params(self) -> int:
        return self.body() + self.hidden + 1  # the value head: Linear(h, 1) with its bias

    def expert_params(self) -> int:
        return self.moe_layers * self.expert_mlp

    def largest_tensor(self) -> int:
        """The checkpoint's largest tensor (parameters), as the learners hand weights to the
        engine: HF names, one tensor per projection and per expert."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return max(self.embedding, self.hidden * q, self.hidden * kv, self.hidden * self.intermediate,
                   self.hidden * self.moe_intermediate, self.router)

    def engine_module(self, tensor_parallel: int = 1) -> int:
        """vLLM's largest module on one worker (parameters): what its layerwise reload rebuilds
        at once. vLLM fuses q, k, v (key-value heads replicated past their count) and gate + up,
        shards the vocabulary and the MLPs' intermediate over tensor parallel, and keeps an MoE
        layer's experts as one module."""
        tp = tensor_parallel
        q, kv = self.heads * self.head_dim // tp, max(1, self.kv_heads // tp) * self.head_dim
        return max(-(-self.vocab // tp) * self.hidden, self.hidden * (q + 2 * kv), q * self.hidden,
                   2 * self.hidden * self.intermediate // tp, self.expert_mlp // tp)

    def kv_bytes_per_token(self, tensor_parallel: int = 1, dtype_bytes: int = 2) -> int:
        """K and V of every layer for one token on one GPU (vLLM replicates key-value heads
        when tensor parallel exceeds them)."""
        return 2 * max(1, self.kv_heads // tensor_parallel) * self.head_dim * dtype_bytes * self.layers

    @classmethod
    def from_config(cls, c: dict, name: str) -> "Arch":
        """From a transformers config (its dict)."""
        heads = c["num_attention_heads"]
        head_dim = c.get("head_dim") or c["hidden_size"] // heads
        experts = next((int(c[k]) for k in ("num_experts", "num_local_experts", "n_routed_experts") if c.get(k)), 0)
        layers = c["num_hidden_layers"]
        moe_layers = 0
        if experts:
            step, dense_only = c.get("decoder_sparse_step") or 1, set(c.get("mlp_only_layers") or [])
            moe_layers = sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
        model_type = c.get("model_type", "")
        bias = bool(c.get("attention_bias", False))
        return cls(
            name=name, hidden=c["hidden_size"], layers=layers, heads=heads,
            kv_heads=c.get("num_key_value_heads") or heads, head_dim=head_dim,
            intermediate=c.get("intermediate_size") or 0, vocab=c["vocab_size"],
            tied=bool(c.get("tie_word_embeddings", False)), max_positions=c.get("max_position_embeddings") or 0,
            experts=experts, top_k=c.get("num_experts_per_tok") or 0,
            moe_intermediate=c.get("moe_intermediate_size") or 0, moe_layers=moe_layers,
            qkv_bias=model_type == "qwen2" or bias, o_bias=model_type != "qwen2" and bias,
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
            dtype=str(c.get("dtype") or c.get("torch_dtype") or "bfloat16").replace("torch.", ""))


def _qwen3(name, hidden, layers, heads, kv_heads, intermediate, tied, **moe) -> Arch:
    return Arch(name=f"Qwen/{name}", hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, head_dim=128,
                intermediate=intermediate, vocab=151936, tied=tied, max_positions=40960, **moe)


# the Qwen3 checkpoints' config.json numbers (huggingface.co/Qwen/<name>)
KNOWN = {a.name.split("/")[-1].lower(): a for a in (
    _qwen3("Qwen3-0.6B", 1024, 28, 16, 8, 3072, tied=True),
    _qwen3("Qwen3-1.7B", 2048, 28, 16, 8, 6144, tied=True),
    _qwen3("Qwen3-4B", 2560, 36, 32, 8, 9728, tied=True),
    _qwen3("Qwen3-8B", 4096, 36, 32, 8, 12288, tied=False),
    _qwen3("Qwen3-14B", 5120, 40, 40, 8, 17408, tied=False),
    _qwen3("Qwen3-32B", 5120, 64, 64, 8, 25600, tied=False),
    _qwen3("Qwen3-30B-A3B", 2048, 48, 32, 4, 6144, tied=False, experts=128, top_k=8, moe_intermediate=768,
           moe_layers=48),
)}


def model_arch(model_cfg: DictConfig) -> Arch:
    """The model's shape: `model.path`'s config.json when it is a folder (or in the local hub
    cache), else the table above; null: the embedded tiny model."""
    path = model_cfg.get("path")
    if path is None:
        from agent.tiny_model import DEFAULT_DIR, MODEL_CONFIG, TOOL_TAGS

        built = DEFAULT_DIR / "config.json"
        if built.exists():
            return Arch.from_config(json.loads(built.read_text()), "tiny (built-in)")
        # the tokenizer's 4096 tokens and the tool tags added to it
        return Arch.from_config({**MODEL_CONFIG, "model_type": "qwen2", "vocab_size": 4096 + len(TOOL_TAGS)},
                                "tiny (built-in)")
    path = str(path)
    if (Path(path) / "config.json").is_file():
        config = json.loads((Path(path) / "config.json").read_text())
        try:
            return Arch.from_config(config.get("text_config") or config, path)
        except (KeyError, TypeError) as err:
            raise UnknownArchitecture(f"model.path={path}: its config.json has no {err} (model_type "
                                      f"{config.get('model_type')!r}): the plan cannot size it") from None
    known = KNOWN.get(path.rstrip("/").split("/")[-1].lower())
    if known is not None:
        return known
    try:  # a hub name already downloaded
        from transformers import AutoConfig

        return Arch.from_config(AutoConfig.from_pretrained(path, local_files_only=True).to_dict(), path)
    except (OSError, ValueError):
        raise UnknownArchitecture(
            f"model.path={path}: no config.json there, not in the local hub cache, and not one of the plan's known "
            f"models ({', '.join(a.name for a in KNOWN.values())}); give a local folder with its config.json") from None


# -- the plan ----------------------------------------------------------------------------------
@dataclass
class Gpu:
    """One kind of GPU in the layout: what each of them holds (bytes by row)."""
    title: str
    count: int
    rows: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.rows.values())


@dataclass
class EngineSide:
    share: float
    share_from: str  # the field, or "computed"
    budget: int
    weights: int
    activations: int
    overhead: int
    kv: int
    kv_per_token: int
    max_model_len: int
    tensor_parallel: int
    replicas: int
    in_flight: int  # rollouts in flight a replica

    @property
    def kv_tokens(self) -> int:
        return max(0, self.kv) // self.kv_per_token // VLLM_BLOCK * VLLM_BLOCK

    @property
    def full_sequences(self) -> int:
        return self.kv_tokens // self.max_model_len


@dataclass
class Plan:
    arch: Arch
    gpu_bytes: int
    summary: list[str]
    gpus: list[Gpu]
    engine: EngineSide | None
    problems: list[str]
    notes: list[str]

    @property
    def fits(self) -> bool:
        return not self.problems

    def table(self) -> str:
        if not self.gpus:
            return "\n".join(self.summary + ["nothing to place on GPUs: learner and engine run on the CPU"])
        names = [r for g in self.gpus for r in g.rows]
        rows = list(dict.fromkeys(names))
        heads = [f"{g.title} (x{g.count})" for g in self.gpus]
        width = max(len(r) for r in rows + ["total", "free"]) + 2
        cols = [max(len(h), 10) + 2 for h in heads]
        out = self.summary + ["computed estimates (GiB), not measurements:", ""]
        out.append(" " * width + "".join(h.rjust(c) for h, c in zip(heads, cols)))
        for r in rows:
            out.append(r.ljust(width) + "".join((_gib(g.rows[r]) if r in g.rows else "-").rjust(c)
                                                for g, c in zip(self.gpus, cols)))
        out.append("total".ljust(width) + "".join(_gib(g.total).rjust(c) for g, c in zip(self.gpus, cols)))
        out.append("free".ljust(width) + "".join(_gib(self.gpu_bytes - g.total).rjust(c) for g, c in zip(self.gpus, cols)))
        if self.engine is not None:
            e = self.engine
            out += ["", f"engine KV cache: {_gib(max(0, e.kv))} GiB a GPU, {e.kv_per_token / 1024:g} KiB a token, "
                        f"{e.kv_tokens:,} tokens a replica: {e.full_sequences} sequences of max_model_len "
                        f"{e.max_model_len} at once; {e.in_flight} rollouts in flight a replica "
                        f"({e.kv_tokens // max(e.in_flight, 1):,} tokens each when all are)"]
        out += [f"note: {n}" for n in self.notes]
        out += [f"does not fit: {p}" for p in self.problems] or ["fits"]
        return "\n".join(out)


def _gib(n: int) -> str:
    return f"{n / GiB:.1f}"


def _dtype_bytes(name: str | None, default: int = 2) -> int:
    return DTYPE_BYTES.get(str(name).replace("torch.", ""), default) if name else default


@dataclass(frozen=True)
class Hardware:
    gpu_bytes: int
    gpus_per_node: int
    nodes: int
    counted: bool = True  # False: the GPU count is unknown here (Ray's cluster counts them itself)

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes


def _critic_of(cfg: DictConfig, arch: Arch) -> tuple[bool, int]:
    """(whether the algo trains a critic, the critic's parameters it keeps frozen)."""
    from hydra.utils import instantiate

    try:  # (the model's algo_overrides change rates, not whether there is a critic)
        algo = instantiate(cfg.algo)
        critic, freeze = bool(algo.uses_critic), bool(getattr(algo, "freeze_critic_attention", False))
    except Exception:  # a value the algo refuses: it says so when the learner is built; plan as its fields read
        critic = cfg.algo.get("baseline", "critic") == "critic" and "SAO" in str(cfg.algo.get("_target_"))
        freeze = bool(cfg.algo.get("freeze_critic_attention", False))
    return critic, arch.layers * arch.attention if critic and freeze else 0


# -- the weight sync ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class SyncCosts:
    """What a weight sync holds on the GPUs beyond the weights, in bytes (module docstring)."""
    transport: str  # ipc | inline | nccl | gloo
    bucket: int  # B: engine.options.bucket_mb
    largest: int  # W: the checkpoint's largest tensor, as the learner sends it
    layer: int  # the engine's largest module on one worker, which its layerwise reload rebuilds
    chunk: int  # what arrives on an engine worker's GPU at once (0: it arrives on the host)
    send: int  # a learner rank's send buffer on its GPU (0: on the host)
    engine_communicators: int  # on each engine worker's GPU: one NCCL communicator per learner rank
    learner_communicators: int  # on each learner rank's GPU: one per engine replica

    @property
    def reload(self) -> int:
        """On each engine worker's GPU, outside its share, during the sync."""
        return self.layer + self.chunk

    def learner_side(self, kind: str) -> int:
        """A learner rank's transient during the sync: Megatron's gathered tensors (the one in
        hand; by collective, its open bucket of them until the bucket is full) and the send
        buffer. The torch learner sends its own tensors: only the send buffer."""
        if kind != "megatron":
            return self.send
        held = self.bucket + self.largest if self.transport in ("nccl", "gloo") else self.largest
        return held + self.send


def sync_transport(cfg: DictConfig) -> str:
    """How the weights reach the engine's GPUs: under runtime=ray the cluster's choice by
    `ray.weight_sync` (training/runtime/ray.py: NCCL, or gloo through the host when colocated;
    the object store's weights go inline), else `engine.options.weight_transfer` as
    agent/engines/vllm_async.resolve_transfer reads it with CUDA. An engine off the GPU: inline."""
    if not _engine_on_gpu(cfg):
        return "inline"
    _, options = _engine_kind(cfg)
    if cfg.get("runtime", "local") == "ray":
        r = cfg.get("ray") or {}
        if r.get("weight_sync", "collective") != "collective":
            return "inline"
        return "gloo" if r.get("colocate", False) else "nccl"
    chosen = str(options.get("weight_transfer") or "auto")
    if chosen == "auto":
        return "ipc" if int(options.get("tensor_parallel_size", 1)) == 1 else "inline"
    return chosen


def sync_costs(cfg: DictConfig, arch: Arch) -> SyncCosts:
    """The weight sync's costs for this config (bytes; module docstring). The chunk sizes are
    the sync code's: vLLM's IPC staging buffer is agent/engines/vllm_transfer.ipc_buffer_bytes,
    max(B, W); a bucket by collective closes once it holds B or more (collective.make_plan)."""
    _, options = _engine_kind(cfg)
    ln = cfg.learner
    transport = sync_transport(cfg)
    bucket = int(options.get("bucket_mb") or DEFAULT_BUCKET_BYTES >> 20) << 20
    if "megatron" in str(ln.get("_target_", "")):  # the bridge exports the model's own dtype
        e_sent = 2 if str(ln.get("dtype", "auto")) in ("auto", "bfloat16") else 4
    else:
        e_sent = _dtype_bytes(ln.get("dtype"), 4)
    dtype = options.get("dtype") or "auto"
    e_engine = 2 if dtype == "auto" else _dtype_bytes(dtype)
    W = arch.largest_tensor() * e_sent
    on_gpu = {"ipc": max(bucket, W), "nccl": bucket + W}.get(transport, 0)
    nccl = transport == "nccl"
    ranks = int((cfg.get("ray") or {}).get("learner_ranks", 1))
    return SyncCosts(transport=transport, bucket=bucket, largest=W,
                     layer=arch.engine_module(int(options.get("tensor_parallel_size", 1))) * e_engine,
                     chunk=on_gpu, send=on_gpu,
                     engine_communicators=ranks * NCCL_COMMUNICATOR if nccl else 0,
                     learner_communicators=int(cfg.engine.get("replicas", 1)) * NCCL_COMMUNICATOR if nccl else 0)


def layer_backward_extra(arch: Arch, tokens: int, e: int, tp: int = 1,
                         sequence_parallel: bool = False) -> dict[str, int]:
    """What the backward through one layer holds beyond the set that layer kept (bytes; T =
    `tokens`, e the compute dtype's bytes), as megatron-core 0.16's code allocates it:

    - "gathered input": under sequence parallel (tp > 1) a column-parallel linear (q/k/v, the
      MLP's fc1) keeps only its input's shard and all-gathers it again for its weight gradient,
      into [T, h] (tensor_parallel/layers.py, LinearWithGradAccumulationAndAsyncCommunication:
      forward 465-484, backward 515-528; one global buffer that both linears reuse);
    - "MLP intermediate gradient": SwiGLU's backward (fusions/fused_bias_swiglu.py,
      SwiGLUFunction) makes the fc1 output's gradient, [T, 2 f / tp], from the activation's,
      [T, f / tp] (transformer/mlp.py, MLP.forward): 3 f / tp a token; an MoE layer's for its k
      routed copies of each token, 3 f_moe / tp each.

    Full recompute (transformer_block.py 532-542, one layer a checkpoint; random.py,
    CheckpointFunction: forward saves the layer's input, 528; backward reruns the layer, 557)
    rebuilds one layer's kept set, and this comes on top of it. The gathered input's own gradient
    ([T, h] before its reduce-scatter, layers.py 531-551) comes in fc1's backward, after SwiGLU's
    and fc2's saved tensors (3 f / tp a token) and the activation's gradient are freed: less
    than what is counted while 4 f / tp >= h, as in every layout here."""
    gathered = tokens * arch.hidden * e if tp > 1 and sequence_parallel else 0
    if arch.moe_layers:
        grad = tokens * arch.top_k * e * 3 * arch.moe_intermediate // tp
    else:
        grad = tokens * e * 3 * arch.intermediate // tp
    return {"gathered input": gathered, "MLP intermediate gradient": grad}


def _learner(cfg: DictConfig, arch: Arch, world: int) -> tuple[str, dict[str, int], list[str], str]:
    """(kind, bytes by row on the worst learner GPU, problems, layout in words); kind "" when
    the learner stays on the CPU."""
    ln = cfg.learner
    critic, frozen = _critic_of(cfg, arch)
    max_len = int((cfg.engine.get("options") or {}).get("max_model_len") or cfg.agent.max_tokens)
    # a trajectory is never split: the longest one is a micro-batch of its own
    T = max(int(ln.get("micro_batch_tokens") or 8192), min(int(cfg.agent.max_tokens), max_len))
    chunk = int(ln.get("logprob_chunk") or 1024)
    sync = sync_costs(cfg, arch)
    if "megatron" in str(ln.get("_target_", "")):
        tp, pp, ep = int(ln.tensor_parallel), int(ln.pipeline_parallel), int(ln.expert_parallel)
        problem = _megatron_layout_problem(arch, tp, pp, ep, bool(ln.get("sequence_parallel", True)), world)
        if problem:
            return "megatron", {}, [problem], f"megatron, tensor {tp} x pipeline {pp} x expert {ep} over {world} ranks"
        dp = world // (tp * pp)
        recompute = bool(ln.get("recompute", False))
        rows = megatron_rows(arch, tp=tp, pp=pp, ep=ep, dp=dp, sequence_parallel=bool(ln.get("sequence_parallel", True)),
                             distributed_optimizer=bool(ln.get("distributed_optimizer", True)), recompute=recompute,
                             bf16=str(ln.get("dtype", "auto")) in ("auto", "bfloat16"), tokens=T, chunk=chunk,
                             critic=critic, frozen=frozen, sync=sync.learner_side("megatron"))
        words = (f"megatron, tensor {tp} x pipeline {pp} x data {dp}" + (f", expert {ep}" if ep > 1 else "")
                 + (", distributed optimizer" if ln.get("distributed_optimizer", True) else "")
                 + f", micro-batch {T} tokens" + (", recompute" if recompute else ""))
        return "megatron", {**rows, PROCESS_ROW: LEARNER_OVERHEAD}, [], words
    if not str(ln.get("device", "cpu")).startswith("cuda"):
        return "", {}, [], "torch on the CPU"
    rows = torch_rows(arch, _dtype_bytes(ln.get("dtype"), 4), tokens=T, chunk=chunk, critic=critic, frozen=frozen,
                      sync=sync.learner_side("torch"))
    return "torch", {**rows, PROCESS_ROW: LEARNER_OVERHEAD}, [], \
        f"torch, {world} data-parallel replica(s), micro-batch {T} tokens"


def torch_rows(arch: Arch, e: int, *, tokens: int, chunk: int, critic: bool, frozen: int,
               sync: int = 0) -> dict[str, int]:
    """A torch learner rank's bytes: a whole replica in its dtype (e bytes), AdamW's two moments
    in the same dtype, transformers' activations (module docstring); `sync`: its side of a
    weight sync (`SyncCosts.learner_side`)."""
    P = arch.policy_params()
    rows = {"policy weights": P * e, "policy gradients": P * e, "policy optimizer": 2 * P * e}
    if critic:
        c, trainable = arch.critic_params(), arch.critic_params() - frozen
        rows.update({"critic weights": c * e, "critic gradients": trainable * e, "critic optimizer": 2 * trainable * e})
    T, h, q, kv = tokens, arch.hidden, arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    # transformers' layers keep q, k, v, the q/k norm inputs and rotary outputs, the attention's
    # output and its copy for o_proj; gate, up, act(gate), act * up; RMSNorm upcasts below fp32
    layer = T * e * (4 * h + 4 * q + 3 * kv) + T * arch.heads * 4
    if arch.moe_layers:
        layer += T * arch.top_k * e * (h + 4 * arch.moe_intermediate) + T * arch.experts * 8
    else:
        layer += T * e * 4 * arch.intermediate
    if e < 4:
        layer += T * 4 * 2 * (2 * h + (q + kv) * arch.qk_norm)
    rows["activations"] = arch.layers * layer + sum(layer_backward_extra(arch, T, e).values())
    rows[LOSS_ROW] = max(2 * T * h * e + chunk * arch.vocab * (e + 12), sync)
    return rows


def _megatron_layout_problem(arch: Arch, tp: int, pp: int, ep: int, sequence_parallel: bool, world: int) -> str | None:
    """The Megatron learner's own check (training/learners/mcore/model.py) on the plan's shape."""
    from types import SimpleNamespace

    from training.learners.mcore import model as mm

    shape = SimpleNamespace(num_attention_heads=arch.heads, num_key_value_heads=arch.kv_heads, vocab_size=arch.vocab,
                            intermediate_size=arch.intermediate, num_hidden_layers=arch.layers, model_type=arch.name,
                            num_experts=arch.experts)
    try:
        mm.check_layout(mm.Layout(tp, pp, ep, sequence_parallel), shape, world)
    except LayoutError as err:
        return str(err)
    return None


def megatron_rows(arch: Arch, *, tp: int = 1, pp: int = 1, ep: int = 1, dp: int = 1, sequence_parallel: bool = True,
                  distributed_optimizer: bool = True, recompute: bool = False, bf16: bool = True, tokens: int = 8192,
                  chunk: int = 1024, critic: bool = True, frozen: int = 0, sync: int | None = None) -> dict[str, int]:
    """A Megatron learner rank's bytes on the worst pipeline stage (module docstring). `sync`:
    its side of a weight sync (`SyncCosts.learner_side`); None: the largest tensor gathered and
    a staging copy of it."""
    e = 2 if bf16 else 4
    master = 12 if bf16 else 8  # fp32 master weights + Adam's two moments; fp32 weights are their own master
    edp = max(dp // ep, 1)  # experts' data parallel (expert tensor parallel = tensor parallel)
    Lp = arch.layers // pp
    moe = arch.moe_layers // pp

    def stage(extra: int, frozen_total: int) -> tuple[float, float, float]:
        """(parameters, trainable dense, trainable expert) on one GPU of a stage with `extra`."""
        dense = Lp * (arch.attention + 2 * arch.hidden) + (Lp - moe) * arch.dense_mlp + moe * arch.router + extra
        expert = moe * arch.expert_mlp / (ep * tp)
        return dense / tp + expert, (dense - frozen_total / pp) / tp, expert

    def rows_of(label: str, first: int, last: int, frozen_total: int) -> dict[str, int]:
        # the first stage keeps the embedding, the last the final norm and the output layer
        params, dense, expert = max((stage(x, frozen_total) for x in ([first + last] if pp == 1 else [first, last])),
                                    key=lambda s: s[0])
        optim = master * (dense / (dp if distributed_optimizer else 1) + expert / (edp if distributed_optimizer else 1))
        return {f"{label} weights": int(params * e), f"{label} gradients": int((dense + expert) * 4),
                f"{label} optimizer": int(optim)}

    # untied: lm_head; tied: the embedding serves, but a last stage of its own keeps a copy
    out_layer = arch.embedding if (not arch.tied or pp > 1) else 0
    rows = rows_of("policy", arch.embedding, arch.hidden + out_layer, 0)
    if critic:
        rows.update(rows_of("critic", arch.embedding, 2 * arch.hidden + 1, frozen))  # value head: [h] + bias
    T = tokens
    sp = tp if (tp > 1 and sequence_parallel) else 1
    h, q, kv = arch.hidden, arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    attn = 4 * h * T * e / sp + T * e * (3 * q + 3 * kv) / tp + T * arch.heads * 4 / tp
    if arch.moe_layers:
        full = attn + T * arch.top_k * e * (h + 3 * arch.moe_intermediate / tp) + T * arch.experts * 8 / sp
    else:
        full = attn + T * e * 3 * arch.intermediate / tp
    # 1F1B: the first stage holds pp micro-batches in flight; one layer's backward holds more
    backward = sum(layer_backward_extra(arch, T, e, tp, sequence_parallel).values())
    act = (pp * Lp * (T * h * e / sp) + full if recompute else pp * Lp * full) + backward
    loss = 2 * T * h * e + chunk * (arch.vocab / tp) * (e + 12)
    if sync is None:
        sync = 2 * arch.largest_tensor() * e
    rows["activations (recompute)" if recompute else "activations"] = int(act)
    rows[LOSS_ROW] = int(max(loss, sync))
    return rows


def learner_rank_bytes(model_path: str, *, tensor_parallel: int = 1, pipeline_parallel: int = 1,
                       expert_parallel: int = 1, data_parallel: int = 1, micro_batch_tokens: int = 8192,
                       recompute: bool = False, critic: bool = True, distributed_optimizer: bool = True,
                       sequence_parallel: bool = True, logprob_chunk: int = 1024,
                       freeze_critic_attention: bool = True) -> int:
    """What one Megatron learner rank allocates at its peak by this plan (bf16), the process's
    CUDA context and allocator slack apart: to set beside torch.cuda.max_memory_allocated()."""
    arch = model_arch(OmegaConf.create({"path": model_path}))
    frozen = arch.layers * arch.attention if critic and freeze_critic_attention else 0
    return sum(megatron_rows(arch, tp=tensor_parallel, pp=pipeline_parallel, ep=expert_parallel, dp=data_parallel,
                             sequence_parallel=sequence_parallel, distributed_optimizer=distributed_optimizer,
                             recompute=recompute, tokens=micro_batch_tokens, chunk=logprob_chunk, critic=critic,
                             frozen=frozen).values())


def _engine_kind(cfg: DictConfig) -> tuple[str, dict]:
    from training.factories import engine_choice

    return engine_choice(cfg.engine)


def _engine(cfg: DictConfig, arch: Arch, gpu_bytes: int, share: float, share_from: str) -> EngineSide:
    kind, options = _engine_kind(cfg)
    tp = int(options.get("tensor_parallel_size", 1))
    dtype = options.get("dtype") or "auto"
    e = 2 if dtype == "auto" else _dtype_bytes(dtype)  # auto: bfloat16 on CUDA
    kv_dtype = str(options.get("kv_cache_dtype") or "auto")
    e_kv = 1 if kv_dtype.startswith("fp8") else e
    weights = arch.policy_params() * e // tp
    N = int(options.get("max_num_batched_tokens") or VLLM_BATCHED_TOKENS)
    S = int(options.get("max_num_seqs") or VLLM_MAX_SEQS)
    h, q, kv = arch.hidden, arch.heads * arch.head_dim, arch.kv_heads * arch.head_dim
    act = N * e * (2 * h + (2 * q + 2 * kv) / tp) + S * arch.vocab * 12
    if arch.moe_layers:
        act += N * arch.top_k * e * (h + 3 * arch.moe_intermediate / tp)
    else:
        act += N * e * 3 * arch.intermediate / tp
    overhead = ENGINE_OVERHEAD + (0 if options.get("enforce_eager", False) else CUDA_GRAPHS)
    budget = int(share * gpu_bytes)
    replicas = int(cfg.engine.get("replicas", 1))
    kv_left = budget - weights - int(act) - overhead
    return EngineSide(share=share, share_from=share_from, budget=budget, weights=weights, activations=int(act),
                      overhead=overhead, kv=kv_left, kv_per_token=arch.kv_bytes_per_token(tp, e_kv),
                      max_model_len=int(options.get("max_model_len") or 16384), tensor_parallel=tp, replicas=replicas,
                      in_flight=-(-int(cfg.trainer.num_workers) // replicas))


def _min_engine_bytes(cfg: DictConfig, arch: Arch, gpu_bytes: int) -> int:
    """What the engine needs at least: weights, activations, overhead, one full-length sequence."""
    e = _engine(cfg, arch, gpu_bytes, 0.0, "")
    need = -e.kv + e.kv_per_token * -(-e.max_model_len // VLLM_BLOCK) * VLLM_BLOCK
    return need


def _learner_world(cfg: DictConfig, hw: Hardware) -> int:
    return int(cfg.ray.learner_ranks) if cfg.get("runtime", "local") == "ray" else hw.gpus


def _engine_on_gpu(cfg: DictConfig) -> bool:
    """vLLM runs on the GPU where there is one; the hf engine (one sequence at a time) is not planned."""
    return _engine_kind(cfg)[0] in ("vllm", "vllm_batch")


def engine_share(cfg: DictConfig, gpu_bytes: int) -> float:
    """The engine's share of a GPU (`engine.options.gpu_memory_utilization`) as the plan computes
    it: 0.9 on GPUs of its own (runtime=ray, or a learner on the CPU); under torchrun, GPU 0
    less what the learner's rank there needs at its peak and 5% spare, to the hundredth below."""
    if cfg.get("runtime", "local") == "ray":
        return DEDICATED_SHARE
    hw = Hardware(gpu_bytes, int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
                  max(1, int(os.environ.get("WORLD_SIZE", "1")) // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    return _shared_share(cfg, model_arch(cfg.model), hw)


def planned_share(cfg: DictConfig) -> float | None:
    """On CUDA, the engine's GPU share the memory plan computes where the config gives none
    (training.plan.engine_share: GPU 0 less the learner rank beside it); None elsewhere."""
    import torch

    if not torch.cuda.is_available() or (cfg.engine.get("options") or {}).get("gpu_memory_utilization") is not None:
        return None
    try:
        total = torch.cuda.get_device_properties(int(os.environ.get("LOCAL_RANK", "0"))).total_memory
        return engine_share(cfg, total)
    except UnknownArchitecture:
        return None  # nothing to plan with: the engine's default share


def _shared_share(cfg: DictConfig, arch: Arch, hw: Hardware) -> float:
    """A GPU less its learner rank's peak, the weight sync's costs outside the engine's share,
    and 5% spare (as if the engine stayed awake through the step: the sleeping case needs less)."""
    kind, rows, _, _ = _learner(cfg, arch, _learner_world(cfg, hw))
    if not kind:
        return DEDICATED_SHARE
    sync = sync_costs(cfg, arch)
    free = hw.gpu_bytes * (1 - SPARE) - sum(rows.values()) - sync.reload - sync.engine_communicators
    return max(0.0, min(DEDICATED_SHARE, math.floor(100 * free / hw.gpu_bytes) / 100))


def _step_transient(kind: str, row: str) -> bool:
    """Whether a learner row is memory its step holds only for itself, which `release_memory`
    hands back: activations, the loss's chunk, and the torch learner's gradients (set to None);
    Megatron's gradients live in DDP buffers as long as the model."""
    return "activations" in row or row == LOSS_ROW or (kind == "torch" and "gradients" in row)


def _sleeping_beside(kind: str, learner_rows: dict, engine: EngineSide, sync: SyncCosts) -> tuple[dict, str]:
    """A learner rank's rows on a GPU whose engine sleeps while it steps, and the note that says
    what they assume. While it steps, vLLM's sleep has freed the engine's weights and KV cache,
    which the step's transient memory may use; then the learner releases it (`release_memory`),
    the engine wakes to its whole share, and the weight sync adds its learner side and the
    engine's reload. What stays throughout is the rest of the learner's rows; of the step beyond
    the sleeping engine and the sync the larger is counted."""
    static = {k: v for k, v in learner_rows.items() if not _step_transient(kind, k)}
    transient = sum(learner_rows.values()) - sum(static.values())
    beyond = max(0, transient - (engine.budget - engine.overhead))
    during_sync = sync.learner_side(kind) + sync.reload
    note = (f"the learner's step uses the sleeping engine's memory ({_gib(transient)} GiB of step transient, "
            f"{_gib(beyond)} beyond it); learner.release_memory hands that back before the engine wakes, leaving "
            f"the learner's weights and optimizer states" + (" and gradient buffers" if kind == "megatron" else "")
            + f"; the weight sync then adds {_gib(during_sync)} GiB beside the awake engine (the learner's "
            f"{sync.transport} buffers {_gib(sync.learner_side(kind))}, the engine's reload {_gib(sync.reload)})")
    return {**static, SLEEP_ROW: max(beyond, during_sync)}, note


def _sync_rows(sync: SyncCosts, side: str) -> dict[str, int]:
    """The weight sync's rows outside any share on an engine worker's GPU (`side` "engine") or a
    learner rank's ("learner"); none that are 0."""
    rows = {RELOAD_ROW: sync.reload, COMMUNICATORS_ROW: sync.engine_communicators} if side == "engine" \
        else {COMMUNICATORS_ROW: sync.learner_communicators}
    return {k: v for k, v in rows.items() if v}


def plan(cfg: DictConfig, hw: Hardware) -> Plan:
    """The memory plan of this config on `hw` (its GPUs as if they were there)."""
    arch = model_arch(cfg.model)
    runtime = cfg.get("runtime", "local")
    world = _learner_world(cfg, hw)
    kind, learner_rows, problems, learner_words = _learner(cfg, arch, world)
    on_gpu = _engine_on_gpu(cfg)
    _, options = _engine_kind(cfg)
    etp = int(options.get("tensor_parallel_size", 1))
    replicas = int(cfg.engine.get("replicas", 1))
    summary = [f"memory plan: {arch.name} ({arch.policy_params() / 1e9:.2f} B parameters"
               + (f", {arch.experts} experts, top-{arch.top_k}" if arch.experts else "") + f"), runtime={runtime}, "
               f"{hw.nodes} node(s) x {hw.gpus_per_node} GPUs of {hw.gpu_bytes / GiB:.1f} GiB",
               f"learner: {learner_words}" + (f", {world} rank(s)" if kind else "")]
    notes: list[str] = []
    gpus: list[Gpu] = []
    engine = None
    fields_learner = ", ".join(
        ["learner.tensor_parallel", "learner.pipeline_parallel"] + ["learner.expert_parallel"] * bool(arch.experts)
        + ["ray.learner_ranks (more GPUs)" if runtime == "ray" else "more nodes"]
        + ["learner.recompute=true"] * (not cfg.learner.get("recompute", True))
        + ["learner.micro_batch_tokens", "learner.logprob_chunk"])
    given = options.get("gpu_memory_utilization")
    colocate = runtime == "ray" and bool((cfg.get("ray") or {}).get("colocate", False))
    sync = sync_costs(cfg, arch)
    if colocate and on_gpu and kind:
        # ray.colocate: every learner rank's GPU holds an engine worker too, asleep while it steps
        share = float(given) if given is not None else _shared_share(cfg, arch, hw)
        engine = _engine(cfg, arch, hw.gpu_bytes, share, "engine.options.gpu_memory_utilization"
                         if given is not None else "computed: a GPU less its learner rank")
        shared = _engine_gpu("engine worker + learner rank", world, engine)
        beside, note = _sleeping_beside(kind, learner_rows, engine, sync)
        shared.rows = {**beside, **shared.rows}  # (gloo through the host: no NCCL communicators of the sync)
        notes.append("ray.colocate: the engine sleeps (vLLM's sleep mode) while the learner steps; " + note)
        gpus.append(shared)
        summary.append(f"engine: {replicas} replica(s) x tensor parallel {etp} on the learner ranks' GPUs (ray.colocate), "
                       f"share {share:.2f} ({engine.share_from})")
        if replicas * etp != world:
            problems.append(f"ray.colocate: engine.replicas {replicas} x engine.options.tensor_parallel_size {etp} "
                            f"must equal ray.learner_ranks {world}")
        if hw.counted and world > hw.gpus:
            problems.append(f"{world} GPUs asked (ray.learner_ranks {world}, shared with the engines), "
                            f"{hw.gpus} there: lower it or add nodes")
    elif runtime == "ray":
        share = float(given) if given is not None else DEDICATED_SHARE
        if on_gpu:
            engine = _engine(cfg, arch, hw.gpu_bytes, share, "engine.options.gpu_memory_utilization"
                             if given is not None else "its own GPU")
            alone = _engine_gpu("engine", replicas * etp, engine)
            alone.rows.update(_sync_rows(sync, "engine"))
            gpus.append(alone)
        if kind:
            gpus.append(Gpu("learner rank", world, {**learner_rows, **_sync_rows(sync, "learner")}))
        needed = replicas * etp * on_gpu + world * bool(kind)
        summary.append(f"engine: {replicas} replica(s) x tensor parallel {etp} on GPUs of their own" if on_gpu
                       else "engine: on the CPU")
        if hw.counted and needed > hw.gpus:
            problems.append(f"{needed} GPUs asked (engine.replicas {replicas} x engine.options.tensor_parallel_size "
                            f"{etp} + ray.learner_ranks {world}), {hw.gpus} there: lower them or add nodes")
    else:
        if on_gpu and kind:
            share = float(given) if given is not None else _shared_share(cfg, arch, hw)
            engine = _engine(cfg, arch, hw.gpu_bytes, share, "engine.options.gpu_memory_utilization"
                             if given is not None else "computed: GPU 0 less the learner rank")
            shared = _engine_gpu("GPU 0: engine + learner rank", etp, engine)
            if options.get("sleep_during_step"):
                beside, note = _sleeping_beside(kind, learner_rows, engine, sync)
                shared.rows = {**beside, **shared.rows}
                notes.append("engine.options.sleep_during_step: " + note)
            else:  # the learner's CUDA cache keeps its step's peak: the sync's reload comes on top
                shared.rows = {**learner_rows, **shared.rows, **_sync_rows(sync, "engine")}
            gpus.append(shared)
            if world > etp:
                gpus.append(Gpu("learner rank", world - etp, dict(learner_rows)))
            summary.append(f"engine: in rank 0's process on GPU 0" + (f"-{etp - 1}" if etp > 1 else "")
                           + f", share {share:.2f} ({engine.share_from})")
        elif on_gpu:
            share = float(given) if given is not None else DEDICATED_SHARE
            engine = _engine(cfg, arch, hw.gpu_bytes, share, "engine.options.gpu_memory_utilization"
                             if given is not None else "its own GPU")
            alone = _engine_gpu("engine", etp, engine)
            # (ipc: the learner's process, on the CPU, still stages the weights on GPU 0)
            alone.rows.update({k: v + sync.send if k == RELOAD_ROW else v for k, v in _sync_rows(sync, "engine").items()})
            gpus.append(alone)
            summary.append(f"engine: on GPU 0, share {share:.2f}, the learner on the CPU")
        elif kind:
            gpus.append(Gpu("learner rank", world, dict(learner_rows)))
            summary.append("engine: on the CPU")
    for g in gpus:
        if g.total > hw.gpu_bytes:
            fields = []
            if "learner" in g.title:
                fields.append(fields_learner)
            if "engine" in g.title:
                fields.append("engine.options.gpu_memory_utilization"  # (a bucket larger than W adds to the chunk)
                              + (", engine.options.bucket_mb" if sync.chunk > sync.largest else ""))
            problems.append(f"{g.title}: {_gib(g.total)} GiB of {_gib(hw.gpu_bytes)} GiB; change "
                            + "; ".join(fields))
    if engine is not None:
        minimum = _min_engine_bytes(cfg, arch, hw.gpu_bytes)
        if engine.full_sequences < 1:
            problems.append(
                f"engine: its share {engine.share:.2f} ({_gib(engine.budget)} GiB) holds {_gib(engine.weights)} GiB "
                f"of weights, {_gib(engine.activations + engine.overhead)} GiB of activations and overhead, and "
                f"{engine.kv_tokens:,} tokens of KV cache, less than one sequence of engine.options.max_model_len="
                f"{engine.max_model_len} (it needs {_gib(minimum)} GiB, a share of {minimum / hw.gpu_bytes:.2f}); "
                "raise engine.options.gpu_memory_utilization or engine.options.tensor_parallel_size, lower "
                "engine.options.max_model_len" + (", or shard the learner more (" + fields_learner + ")"
                                                   if runtime != "ray" and kind else ""))
        elif engine.full_sequences < engine.in_flight:
            notes.append(f"trainer.num_workers={cfg.trainer.num_workers} rollouts share {engine.replicas} replica(s): "
                         f"{engine.full_sequences} of a replica's {engine.in_flight} fit at full length at once "
                         "(vLLM queues or preempts the rest; rollouts waiting on tools hold no KV cache)")
    if arch.max_positions and engine is not None and engine.max_model_len > arch.max_positions:
        notes.append(f"engine.options.max_model_len={engine.max_model_len} is beyond the model's "
                     f"max_position_embeddings {arch.max_positions}")
    return Plan(arch, hw.gpu_bytes, summary, gpus, engine, problems, notes)


def _engine_gpu(title: str, count: int, e: EngineSide) -> Gpu:
    return Gpu(title, count, {"engine weights": e.weights, "engine activations + sampler": e.activations,
                              "engine CUDA context + graphs": e.overhead, "engine KV cache": max(0, e.kv)})


# -- the run's check, the command ----------------------------------------------------------------
def check_layout(cfg: DictConfig) -> None:
    """Before anything starts: with CUDA, raise MemoryPlanError when the plan does not fit this
    machine's GPUs (torchrun: WORLD_SIZE ranks, LOCAL_WORLD_SIZE a node); on CPU nothing."""
    import torch

    if not torch.cuda.is_available():
        return
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    hw = Hardware(torch.cuda.get_device_properties(int(os.environ.get("LOCAL_RANK", "0"))).total_memory, local,
                  max(1, int(os.environ.get("WORLD_SIZE", "1")) // local),
                  counted=cfg.get("runtime", "local") != "ray")
    try:
        p = plan(cfg, hw)
    except UnknownArchitecture:
        return  # nothing to plan with; the model's own loading says what is wrong with it
    if not p.fits:
        raise MemoryPlanError("the memory plan does not fit (python -m training.plan with the same overrides "
                              "prints it): " + " | ".join(p.problems))


def compose(overrides: list[str]) -> DictConfig:
    """The run's config as `python -m training.run` composes it (conf/config.yaml + overrides)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=overrides)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    opts: dict = {}
    overrides = []
    for a in argv:
        key, _, value = a.partition("=")
        if key in PLAN_OPTIONS:
            opts[key] = PLAN_OPTIONS[key](value)
        else:
            overrides.append(a)
    cfg = compose(overrides)
    import torch

    cuda = torch.cuda.is_available()
    if "gpu_gib" not in opts and not cuda:
        print("no CUDA here and no gpu_gib given: nothing to place (plan a GPU with gpu_gib=80 gpus_per_node=8)")
        return 0
    gpu_bytes = int(opts["gpu_gib"] * GiB) if "gpu_gib" in opts else torch.cuda.get_device_properties(0).total_memory
    per_node = opts.get("gpus_per_node") or (torch.cuda.device_count() if cuda else 8)
    hw = Hardware(gpu_bytes, per_node, opts.get("nodes", 1))
    try:
        p = plan(cfg, hw)
    except UnknownArchitecture as err:
        print(f"error: {err}")
        return 2
    print(p.table())
    return 0 if p.fits else 1


if __name__ == "__main__":
    sys.exit(main())
