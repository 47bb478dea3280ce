"""The Megatron learner (`learner=megatron`): policy and token-level critic as megatron-core
`GPTModel`s built from the checkpoint's HF config through mbridge, with tensor (and sequence),
pipeline, expert and data parallelism, megatron's DDP and (distributed) optimizer, activation
recomputation, and bf16 with fp32 master weights on GPUs. Same interface and behaviour as the
torch learner (`training/learners/torch.py`); the algorithms and losses are the same objects.

    torchrun --nproc-per-node 8 -m training.run learner=megatron learner.tensor_parallel=4

Every rank builds the learner; rank 0 drives it and the others follow its commands
(`training/runtime/`), since step, weight export, save and load are collectives here.

A step, in order (as the torch learner's): pack; one forward-only pass of each model for
pi_old logprobs and values (this data-parallel rank's rows, summed over the data-parallel
group so every rank holds the whole batch's); the algorithm's advantages over the whole batch;
K critic updates; then (after warm-up) the policy update(s). Each update runs megatron's
forward-backward schedule over token-budget micro-batches of packed sequences. Losses use
megatron's per-token mode: a micro-batch returns its loss summed over its tokens and the
number of tokens it adds to the mean, and megatron divides the gradient by the whole batch's
count over micro-batches and data-parallel ranks, which is the torch learner's token mean.
Logprobs come from the final hidden states and each rank's vocab shard of the output weight,
a chunk of tokens at a time (`training/learners/mcore/logprobs.py`): no rank ever holds more than
chunk x vocab / tensor-parallel logits.
"""

from __future__ import annotations

import json
import random
import time
from collections import defaultdict
from functools import partial
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
import torch.distributed as dist
from transformers import AutoTokenizer

from agent.trajectory import Trajectory
from training import losses
from training.batch import Batch, pack
from training.collectives import shard_rows
from training.learners.metrics import accumulate, batch_metrics, policy_health
from training.learners.mcore import cpu as mcore_cpu
from training.learners.mcore import model as mm
from training.learners.mcore.logprobs import vocab_parallel_logprobs
from training.learners.mcore.packing import Packed, pack_rows, token_budget_parts
from training.learners.base import LayoutError
from training.timings import Phases


class _Model:
    """One megatron model (policy or critic): bridge, DDP-wrapped chunks, optimizer, config."""

    def __init__(self, bridge, chunks, optimizer, value_model: bool):
        from megatron.core.distributed import finalize_model_grads

        self.bridge, self.chunks, self.optimizer, self.value_model = bridge, chunks, optimizer, value_model
        self.config = chunks[0].config
        self.config.finalize_model_grads_func = finalize_model_grads
        self.config.grad_scale_func = optimizer.scale_loss
        self.config.no_sync_func = chunks[0].no_sync if len(chunks) == 1 else [c.no_sync for c in chunks]


@mcore_cpu.in_every_thread
class MegatronLearner:
    collective = True  # step, weights for the engine, save and load run on every rank together

    def __init__(
        self,
        model_path: str,
        algo,
        value_checkpoint: str | None = None,
        tensor_parallel: int = 1,
        pipeline_parallel: int = 1,
        expert_parallel: int = 1,
        sequence_parallel: bool = True,
        distributed_optimizer: bool = True,
        recompute: bool = False,
        dtype: str = "auto",  # bfloat16 (fp32 master weights) with CUDA, float32 on CPU
        weight_decay: float = 0.0,
        grad_clip: float = 1.0,
        micro_batch_tokens: int | None = None,
        logprob_chunk: int = 1024,
        sampling_temperature: float = 1.0,
        seed: int = 0,
    ):
        if not torch.cuda.is_available():
            mcore_cpu.enable()  # tests and development: megatron's CUDA calls go to the CPU
        with mcore_cpu.scope():  # (the decorator found it off when this call began)
            self._init(model_path, algo, value_checkpoint, tensor_parallel, pipeline_parallel, expert_parallel,
                       sequence_parallel, distributed_optimizer, recompute, dtype, weight_decay, grad_clip,
                       micro_batch_tokens, logprob_chunk, sampling_temperature, seed)

    def _init(self, model_path, algo, value_checkpoint, tensor_parallel, pipeline_parallel, expert_parallel,
              sequence_parallel, distributed_optimizer, recompute, dtype, weight_decay, grad_clip,
              micro_batch_tokens, logprob_chunk, sampling_temperature, seed):
        from megatron.core import parallel_state as ps

        torch.manual_seed(seed)
        self.algo = algo
        self.temperature = sampling_temperature
        # packed sequences: with TE's attention (THD) a token costs the same in any pack; megatron's
        # local attention masks a [T, T] block-diagonal square, so its packs stay short
        self.micro_batch_tokens = micro_batch_tokens or (8192 if mm.HAVE_TE else 1024)
        self.logprob_chunk = logprob_chunk
        self.layout = mm.Layout(tensor_parallel, pipeline_parallel, expert_parallel, sequence_parallel)
        world = dist.get_world_size() if dist.is_initialized() else 1
        self.hf_config = mm.hf_config_of(model_path)
        mm.check_layout(self.layout, self.hf_config, world)
        if dtype == "auto":
            dtype = "bfloat16" if torch.cuda.is_available() else "float32"
        self.bf16 = dtype == "bfloat16"
        torch_dtype = getattr(torch, dtype)
        mm.init_parallel(self.layout, seed)
        self.device = torch.cuda.current_device() if torch.cuda.is_available() else "cpu"
        self.tp = ps.get_tensor_model_parallel_world_size()
        self.dp_rank, self.dp = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
        self.dp_group = ps.get_data_parallel_group()
        self.last_stage = ps.is_pipeline_last_stage()
        # the rank whose metrics rank 0 reports: last pipeline stage, first tensor and data rank
        self.report_rank = self._first_report_rank()
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.pad_id = self.tokenizer.pad_token_id or 0
        self.policy = self._make(model_path, torch_dtype, algo.lr_policy, weight_decay, grad_clip,
                                 distributed_optimizer, recompute, value_model=False)
        self.critic = None
        if algo.uses_critic:
            self.critic = self._make(value_checkpoint or model_path, torch_dtype, algo.lr_critic, weight_decay,
                                     grad_clip, distributed_optimizer, recompute, value_model=True,
                                     freeze_attention=algo.freeze_critic_attention)
        self._phase = Phases()  # the current step's time per phase (training/timings.py)
        self.step_count = 0
        self.version = 0
        # megatron's checkpoint writer reports through a queue served by a spawned process,
        # made at the first save; made then, next to a running vLLM engine, the spawn hangs
        # (seen here on CPU). Made now, before any engine starts, it is ready when needed.
        from megatron.core.dist_checkpointing.strategies import filesystem_async

        filesystem_async._get_write_results_queue()

    def _make(self, path, dtype, lr, weight_decay, grad_clip, distributed_optimizer, recompute, value_model,
              freeze_attention=False) -> _Model:
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        hf_config = mm.hf_config_of(path) if value_model else self.hf_config
        bridge = mm.make_bridge(hf_config, dtype, self.layout, value_model=value_model, recompute=recompute)
        chunks = mm.build(bridge, path, value_model=value_model, freeze_attention=freeze_attention, bf16=self.bf16,
                          distributed_optimizer=distributed_optimizer)
        # torch's AdamW defaults, as the torch learner's optimizer
        opt_config = OptimizerConfig(optimizer="adam", lr=lr, weight_decay=weight_decay, adam_beta1=0.9,
                                     adam_beta2=0.999, adam_eps=1e-8, clip_grad=grad_clip, bf16=self.bf16,
                                     params_dtype=dtype, use_distributed_optimizer=distributed_optimizer)
        return _Model(bridge, chunks, get_megatron_optimizer(opt_config, chunks), value_model)

    def _first_report_rank(self) -> int:
        """The global rank of (last pipeline stage, tensor rank 0, data rank 0)."""
        from megatron.core import parallel_state as ps

        mine = int(self.last_stage and ps.get_tensor_model_parallel_rank() == 0 and self.dp_rank == 0)
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return 0
        flags = torch.zeros(dist.get_world_size(), dtype=torch.long, device=self.device)  # (NCCL: on the GPU)
        flags[dist.get_rank()] = mine
        dist.all_reduce(flags)
        return int(flags.nonzero()[0].item())

    # -- forward-backward over packed micro-batches ------------------------------------------
    def _packs(self, batch: Batch, parts: list[list[int]]) -> list[Packed]:
        """`parts` packed, then padded with empty micro-batches to the most any data-parallel
        rank has: MoE's token dispatch is a collective over ranks of several data-parallel
        replicas, so each must run the same number of micro-batches."""
        if self.dp > 1:
            most = torch.tensor([len(parts)], device=self.device)
            dist.all_reduce(most, op=dist.ReduceOp.MAX, group=self.dp_group)
            parts = parts + [[] for _ in range(int(most.item()) - len(parts))]
        multiple = self.tp if self.layout.sequence_parallel and self.tp > 1 else 1
        return [pack_rows(batch, rows, multiple, thd=mm.HAVE_TE, device=self.device) for rows in parts]

    def _run(self, model: _Model, packs: list[Packed], loss_fn, forward_only: bool) -> list[dict]:
        """megatron's schedule over `packs`; returns the last stage's per-micro-batch outputs."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        def forward_step(data_iterator, chunk):
            p = next(data_iterator)
            out = chunk(p.input_ids, p.position_ids, p.attention_mask, packed_seq_params=p.packed_seq_params)
            return out, partial(loss_fn, p)

        return get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter(packs), model=model.chunks,
            num_microbatches=len(packs), seq_length=max(p.input_ids.shape[1] for p in packs),
            micro_batch_size=1, forward_only=forward_only)

    def _logprobs(self, p: Packed, hidden: torch.Tensor) -> torch.Tensor:
        """[rows, L] log pi_theta(target) at temperature from the policy's [1, T, H] final hidden
        states and this rank's vocab shard of the output weight, a chunk of tokens at a time."""
        weight = mm._unwrap(self.policy.chunks[-1]).output_layer.loss_weight
        logp = vocab_parallel_logprobs(hidden.reshape(-1, hidden.shape[-1]), weight, p.targets.reshape(-1),
                                       self.temperature, self.logprob_chunk)
        return p.unpack(logp)

    def _update(self, model: _Model, packs: list[Packed], loss_fn) -> dict[str, float]:
        name = "critic" if model.value_model else "policy"
        for chunk in model.chunks:
            chunk.zero_grad_buffer()
        model.optimizer.zero_grad()
        with self._phase(f"{name}_backward"):  # megatron's schedule: forward and backward together
            outputs = self._run(model, packs, loss_fn, forward_only=False)
        with self._phase(f"{name}_optimizer"):
            _, grad_norm, _ = model.optimizer.step()
        acc: dict[str, float] = defaultdict(float)
        for out in outputs if self.last_stage else []:
            for k, v in out.items():
                acc[k] += v
        acc = self._sum_over_dp(acc)
        acc["value/grad_norm" if model.value_model else "policy/grad_norm"] = float(grad_norm or 0.0)
        return dict(acc)

    def _count(self, n: float) -> torch.Tensor:
        """A micro-batch's token count for megatron's per-token loss mode."""
        return torch.tensor(int(round(n)), dtype=torch.int, device=self.device)

    def _sum_over_dp(self, metrics: dict[str, float]) -> dict[str, float]:
        """Per-rank partial sums summed over the data-parallel group; a key a rank lacks (it had
        no rows) counts 0 there."""
        if self.dp == 1:
            return dict(metrics)
        parts: list[dict] = [{} for _ in range(self.dp)]
        dist.all_gather_object(parts, dict(metrics), group=self.dp_group)
        return {k: sum(p.get(k, 0.0) for p in parts) for k in sorted({k for p in parts for k in p})}

    # -- one step -----------------------------------------------------------------------------
    def step(self, trajectories: list[Trajectory], group_ids: list[int] | None = None) -> dict[str, float]:
        t0 = time.perf_counter()
        self._phase = Phases(torch.cuda.synchronize if torch.cuda.is_available() else None)
        with self._phase("pack"):
            batch = Batch(**{k: v.to(self.device) for k, v in vars(pack(trajectories, self.pad_id, group_ids)).items()})
            lengths = batch.attention_mask.sum(1).tolist()
            mine = shard_rows(lengths, self.dp_rank, self.dp)
            packs = self._packs(batch, token_budget_parts(lengths, mine, self.micro_batch_tokens))
        n_sampled = max(batch.num_sampled, 1)
        old_logp, values = self._old_logprobs_and_values(batch, packs)
        metrics: dict[str, float] = {}
        advantages = returns = None
        if self.last_stage:
            with self._phase("advantages"):
                advantages, returns = self.algo.advantages(batch, values)
        if self.critic is not None:
            lr = self.algo.critic_lr_at(self.step_count)
            for group in self.critic.optimizer.param_groups:
                group["lr"] = lr
            if self.last_stage:
                metrics["value/lr"] = lr
            for _ in range(self.algo.critic_steps):
                update = self._update(self.critic, packs, partial(self._value_loss, batch, returns, n_sampled))
                update.pop("value/explained_var", None)
                metrics.update(update)
            if self.algo.values_after_critic:  # advantages from the values the K updates left
                after = self._critic_values(batch, packs)
                if self.last_stage:
                    with self._phase("advantages"):
                        advantages, _ = self.algo.advantages(batch, after)
                    metrics["value/explained_var_after"] = losses.value_loss(
                        after, returns, batch.loss_mask)[1]["value/explained_var"]
        if self.last_stage:  # the explained variance: the values before this batch's critic updates
            metrics.update(batch_metrics(batch, old_logp, advantages, values, returns, self.version))
        if self.critic is None or self.algo.policy_updates_at(self.step_count):
            metrics.update(self._policy_update(batch, advantages, old_logp))
            self.version += 1
        elif self.last_stage:  # no update, but the same health metrics (mask fractions, ratio)
            metrics.update(policy_health(self.algo, batch, advantages, old_logp, n_sampled))
        self.algo.observe_rewards(batch.rewards, batch.prompt_keys)
        self.step_count += 1
        metrics["learner/step"] = float(self.step_count)
        metrics["learner/version"] = float(self.version)
        if self.last_stage:  # the report rank's own times (every rank waits for the slowest in the collectives)
            metrics.update(self._phase.metrics("time/learner"))
            metrics["time/learner/total_s"] = time.perf_counter() - t0
        return self._from_report_rank(metrics)

    def _from_report_rank(self, metrics: dict[str, float]) -> dict[str, float]:
        """The metrics as the last pipeline stage computed them, on every rank."""
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return metrics
        box = [metrics]
        dist.broadcast_object_list(box, src=self.report_rank)
        return box[0]

    def _old_logprobs_and_values(self, batch: Batch, packs: list[Packed]):
        """[B, L] pi_old logprobs and values (None without a critic) for the whole batch, on the
        last pipeline stage (zeros elsewhere): each data-parallel rank fills its rows, then sum."""
        old_logp = self._forward_only(self.policy, batch, packs, as_logprobs=True)
        values = self._forward_only(self.critic, batch, packs, as_logprobs=False) if self.critic is not None else None
        return old_logp, values

    def _critic_values(self, batch: Batch, packs: list[Packed]) -> torch.Tensor:
        """[B, L] the critic's values now (after its updates), as `_old_logprobs_and_values`."""
        return self._forward_only(self.critic, batch, packs, as_logprobs=False)

    def _forward_only(self, model: _Model, batch: Batch, packs: list[Packed], as_logprobs: bool) -> torch.Tensor:
        """[B, L] the policy's logprobs or the critic's values for the whole batch, no grad: each
        data-parallel rank fills its rows on the last pipeline stage (zeros elsewhere), then sum."""
        target = torch.zeros(*batch.input_ids.shape, device=self.device)

        def collect(p, output):
            rows = (self._logprobs(p, output) if as_logprobs else p.unpack(output[..., 0])).detach().float()
            if p.rows:
                target[torch.tensor(p.rows), : rows.shape[1]] = rows
            return output.new_zeros(()), self._count(0), {}

        with self._phase("critic_forward" if model.value_model else "policy_forward"), torch.no_grad():
            self._run(model, packs, collect, forward_only=True)
            if self.dp > 1:
                dist.all_reduce(target, group=self.dp_group)
        return target

    def _value_loss(self, batch, returns, n_sampled, p: Packed, output):
        mb = batch.select(p.rows) if p.rows else None
        if mb is None:  # a rank without rows: no tokens, no gradient
            return output.sum() * 0.0, self._count(0), {}
        target = returns[torch.tensor(p.rows)][:, : mb.input_ids.shape[1]]
        loss, m = losses.value_loss(p.unpack(output[..., 0]), target, mb.loss_mask, normalizer=n_sampled)
        weighted: dict[str, float] = defaultdict(float)
        accumulate(weighted, m, mb.num_sampled / n_sampled)
        return loss * n_sampled, self._count(mb.num_sampled), weighted

    def _policy_update(self, batch, advantages, old_logp) -> dict[str, float]:
        """`algo.policy_minibatches` optimizer steps as in the torch learner, each over its
        share of the batch's rows split over the data-parallel ranks."""
        M = getattr(self.algo, "policy_minibatches", 1)
        lengths = batch.attention_mask.sum(1).tolist()
        acc: dict[str, float] = defaultdict(float)
        for i in range(M):
            share = list(range(i, len(batch), M))
            if not share:  # fewer rows than mini-batches: the torch learner's step moves nothing either
                continue
            mine = [share[j] for j in shard_rows([lengths[r] for r in share], self.dp_rank, self.dp)]
            n_loss = max(self.algo.loss_units(batch, share, old_logp), 1.0)
            n_sampled = max(float(batch.loss_mask[share].sum()), 1.0)
            packs = self._packs(batch, token_budget_parts(lengths, mine, self.micro_batch_tokens))
            loss_fn = partial(self._policy_loss, batch, advantages, old_logp, n_loss, n_sampled)
            for k, v in self._update(self.policy, packs, loss_fn).items():
                acc[k] += v / M
        return dict(acc)

    def _policy_loss(self, batch, advantages, old_logp, n_loss, n_sampled, p: Packed, output):
        if not p.rows:
            return output.sum() * 0.0, self._count(0), {}
        mb = batch.select(p.rows)
        idx, n = torch.tensor(p.rows), mb.input_ids.shape[1]
        old = old_logp[idx][:, :n]
        loss, m = self.algo.policy_loss(self._logprobs(p, output), mb, advantages[idx][:, :n], old, n_loss)
        # this micro-batch's share of the token count the mean is over (the whole batch's, summed)
        count = self.algo.loss_units(batch, p.rows, old_logp)
        weighted: dict[str, float] = defaultdict(float)
        accumulate(weighted, m, mb.num_sampled / n_sampled)
        return loss * n_loss, self._count(count), weighted

    def release_memory(self) -> None:
        """After a step, before a colocated engine wakes (every rank): the optimizers' main
        parameters drop their gradients (megatron's `zero_grad(set_to_none=True)`: views of the
        DDP gradient buffer, or fp32 copies of it), and on CUDA the caching allocator hands its
        free blocks back (the step's activations, recomputed layers, logits chunks). The DDP
        gradient buffers themselves stay: megatron allocates them once for the model's life."""
        for _, model in self._models():
            model.optimizer.zero_grad(set_to_none=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    # -- weights out, checkpoints -------------------------------------------------------------
    def state_dict_for_engine(self) -> list[tuple[str, torch.Tensor]]:
        """The policy's weights by HF name, gathered across TP/PP/EP by the bridge, the tied
        output head included (vLLM needs it). A collective: every rank takes part; rank 0 keeps
        the weights (on the CPU), the others drop each tensor once it is gathered."""
        weights = mm.gather_hf(self.policy.bridge, self.policy.chunks)
        if "lm_head.weight" not in weights and "model.embed_tokens.weight" in weights:
            weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
        return list(weights.items())

    def weights_for_engine(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The bridge's export, as it comes: each HF tensor gathered across TP/EP and passed along
        the pipeline stages to every rank, one at a time (a collective: every rank walks it all);
        a tied embedding two stages send, once."""
        seen: set[str] = set()
        for name, tensor in self.policy.bridge.export_weights(self.policy.chunks):
            if name not in seen:
                seen.add(name)
                yield name, tensor.detach()

    def save(self, path: str | Path) -> None:
        """`megatron/` (megatron's distributed checkpoint: models, optimizers), `layout.json`,
        per-rank RNG, `learner.pt` (step, version, algo state), and HF exports `policy/` and
        `critic/` that `from_pretrained` and `eval.swebench --ckpt` load. Every rank calls it."""
        from megatron.core import dist_checkpointing

        path = Path(path)
        rank = dist.get_rank() if dist.is_initialized() else 0
        if rank == 0:
            path.mkdir(parents=True, exist_ok=True)
        self._barrier()
        for name, model in self._models():
            dist_checkpointing.save(self._sharded_state(model), str(_ensure(path / "megatron" / name)))
        torch.save(_rng_state(), _ensure(path / "rng") / f"rank_{rank}.pt")
        mm.save_hf(self.policy.bridge, self.policy.chunks, path / "policy", self.hf_config)
        if self.critic is not None:
            mm.save_hf(self.critic.bridge, self.critic.chunks, path / "critic", self.hf_config, value_model=True)
        if rank == 0:
            for sub in ("policy",) + (("critic",) if self.critic is not None else ()):
                self.tokenizer.save_pretrained(path / sub)
            (path / "layout.json").write_text(json.dumps(self._layout_record(), indent=2))
            torch.save({"step_count": self.step_count, "version": self.version, "algo": self.algo.state_dict(),
                        "adam_steps": {name: _adam_step(model.optimizer) for name, model in self._models()}},
                       path / "learner.pt")
        self._barrier()

    def load(self, path: str | Path) -> None:
        """Resume from `save`'s folder; a checkpoint saved under another layout is refused."""
        from megatron.core import dist_checkpointing

        path = Path(path)
        saved = json.loads((path / "layout.json").read_text())
        run = torch.load(path / "learner.pt", weights_only=False)
        now = self._layout_record()
        for field in ("tensor_parallel", "pipeline_parallel", "expert_parallel", "data_parallel", "distributed_optimizer", "critic"):
            if saved.get(field) != now.get(field):
                raise LayoutError(f"{path}: saved with {field}={saved.get(field)!r}, this run has "
                                     f"learner.{field}={now.get(field)!r}; resume with the saved layout")
        for name, model in self._models():
            state = dist_checkpointing.load(self._sharded_state(model, loading=True), str(path / "megatron" / name))
            for i, chunk in enumerate(model.chunks):
                # the wrappers (DDP, bf16) name weights module.<name>; the model itself, <name>
                weights = {k[k.rindex("module.") + 7:] if k.startswith("module.") else k: v
                           for k, v in state[f"model{i}"].items()}
                mm._unwrap(chunk).load_state_dict(weights)
            _keep_torch_step(model.optimizer, state["optimizer"], run["adam_steps"][name])
            with torch.no_grad():  # copies into the main parameters, leaves that require grad
                model.optimizer.load_state_dict(state["optimizer"])
            _set_adam_step(model.optimizer, run["adam_steps"][name])
        self.step_count, self.version = run["step_count"], run["version"]
        self.algo.load_state_dict(run["algo"])
        rank = dist.get_rank() if dist.is_initialized() else 0
        _set_rng_state(torch.load(path / "rng" / f"rank_{rank}.pt", weights_only=False))

    def _models(self):
        return [("policy", self.policy)] + ([("critic", self.critic)] if self.critic is not None else [])

    def _sharded_state(self, model: _Model, loading: bool = False) -> dict:
        """One model's megatron state: its chunks and its optimizer (each model is its own
        distributed checkpoint: the optimizers' shard names would collide in one)."""
        _fresh_adam_state(model.optimizer)
        # each data-parallel rank's optimizer shard as it is (a resume keeps the layout)
        metadata = {"distrib_optim_sharding_type": "dp_reshardable"}
        state = {f"model{i}": chunk.sharded_state_dict() for i, chunk in enumerate(model.chunks)}
        merged = {k: v for sd in state.values() for k, v in sd.items()}
        state["optimizer"] = model.optimizer.sharded_state_dict(merged, is_loading=loading, metadata=metadata)
        return state

    @property
    def layout_summary(self) -> str:
        r = self._layout_record()
        return (f"tensor {r['tensor_parallel']} x pipeline {r['pipeline_parallel']} x data {r['data_parallel']}"
                + (f", expert {r['expert_parallel']}" if r["expert_parallel"] > 1 else ""))

    def _layout_record(self) -> dict:
        world = dist.get_world_size() if dist.is_initialized() else 1
        return {**self.layout.describe(world), "distributed_optimizer": self.policy.chunks[0].ddp_config.use_distributed_optimizer,
                "critic": self.critic is not None}

    def _barrier(self) -> None:
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()


# -- Adam's state across optimizers -------------------------------------------------------------
# megatron-core picks its Adam at import (megatron/core/optimizer/__init__.py): Transformer
# Engine's FusedAdam when TE imports, else Apex's, else torch's Adam/AdamW (this CPU path). They
# keep Adam's step count in different places, and TE's checkpoints only the state it knows:
# - torch: per parameter, state = {step (0-dim tensor), exp_avg, exp_avg_sq};
# - Apex FusedAdam: group["step"] (an int, made by the first step), state = {exp_avg, exp_avg_sq};
# - TE FusedAdam: group["step"] likewise, state = {exp_avg, exp_avg_sq} (+ master_param when it
#   keeps master weights), and its state_dict/load_state_dict look every state key up in a
#   dtype table of just those three: any other key (a per-parameter "step") is a KeyError.
def _inner_optimizers(optimizer) -> list:
    """The torch optimizers inside megatron's wrapper(s); none where a rank has no parameters."""
    inner = (opt.optimizer for opt in getattr(optimizer, "chained_optimizers", [optimizer]))
    return [o for o in inner if o is not None]


def _steps_per_param(inner) -> bool:
    """Whether this Adam counts steps per parameter (torch's) or per param group (the fused ones)."""
    return isinstance(inner, (torch.optim.Adam, torch.optim.AdamW))


def _fresh_adam_state(optimizer) -> None:
    """Give parameters an optimizer that never stepped (the policy in the critic's warm-up)
    the state that optimizer's own first step would make (zero moments; torch's step 0 per
    parameter; the fused Adams' step stays in the param group, absent until a first step):
    exactly a fresh state, and what megatron's distributed checkpoint needs to find."""
    for inner in _inner_optimizers(optimizer):
        for group in inner.param_groups:
            for p in group["params"]:
                if inner.state[p]:
                    continue
                if _steps_per_param(inner):
                    if group.get("capturable") or group.get("fused"):  # as torch's Adam makes it
                        step = torch.zeros((), dtype=torch.float32, device=p.device)
                    else:
                        step = torch.tensor(0.0, dtype=torch.float64 if torch.get_default_dtype() == torch.float64
                                            else torch.float32)
                    inner.state[p].update(step=step, exp_avg=torch.zeros_like(p, memory_format=torch.preserve_format),
                                          exp_avg_sq=torch.zeros_like(p, memory_format=torch.preserve_format))
                    if group.get("amsgrad"):
                        inner.state[p]["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                elif callable(getattr(inner, "initialize_state", None)):
                    # TE: its own initialisation (its state dtypes; master weights copied from p)
                    remainders = bool(getattr(inner, "store_param_remainders", False)) and p.dtype == torch.bfloat16
                    inner.initialize_state(p, remainders)
                else:  # Apex
                    inner.state[p].update(exp_avg=torch.zeros_like(p).float(), exp_avg_sq=torch.zeros_like(p).float())


def _adam_step(optimizer) -> float:
    """Adam's step count (every parameter of the optimizer has taken the same steps); 0 before
    the first step."""
    steps = set()
    for inner in _inner_optimizers(optimizer):
        if _steps_per_param(inner):
            steps |= {float(st["step"]) for st in inner.state.values() if "step" in st}
        else:
            steps |= {float(g["step"]) for g in inner.param_groups if g["params"] and "step" in g}
    assert len(steps) <= 1, steps
    return steps.pop() if steps else 0.0


def _set_adam_step(optimizer, step: float) -> None:
    """Put Adam's step count back after megatron's load, where each optimizer keeps it.
    torch's: megatron's dp_reshardable load copies the step the optimizer held before the load
    (0 for a new learner) over the one it read, and its non-distributed load restores none when
    it was 0, so each parameter with state gets the saved step, as its own tensor (Adam adds 1 to
    each in place). The fused Adams': megatron restores group["step"] from the checkpoint's
    param groups; set here too, the same count, so both loads end alike."""
    for inner in _inner_optimizers(optimizer):
        if _steps_per_param(inner):
            for st in inner.state.values():
                if st:
                    old = st.get("step")
                    st["step"] = torch.tensor(float(step), dtype=old.dtype, device=old.device) \
                        if isinstance(old, torch.Tensor) else torch.tensor(float(step))
        else:
            for group in inner.param_groups:
                if not group["params"] or (step == 0 and "step" not in group):
                    continue  # never stepped: the first step makes the count
                old = group.get("step")
                group["step"] = old.new_full(old.shape, int(step)) if isinstance(old, torch.Tensor) else int(step)


def _keep_torch_step(optimizer, loaded, step: float) -> None:
    """Give torch's Adam its step in a checkpoint read for megatron's non-distributed optimizers.
    They save the per-parameter step once, as `common_step`, and leave it out when it is 0 (a
    model that never stepped: `if step:`), and torch's Adam refuses to load state without a step
    (Adam.__setstate__): so the saved count goes in where megatron looks for it. The distributed
    optimizer's dict has no per-parameter state here; the fused Adams keep no per-parameter step."""
    wrappers = getattr(optimizer, "chained_optimizers", [optimizer])
    if len(wrappers) == 1:
        parts = [loaded]
    else:  # megatron's ChainedOptimizer: one dict per optimizer, a list or keyed by index
        parts = [v for _, v in sorted(loaded.items())] if isinstance(loaded, dict) else list(loaded)
    for wrapper, part in zip(wrappers, parts):
        if wrapper.optimizer is None or not _steps_per_param(wrapper.optimizer) or not isinstance(part, dict):
            continue
        inner = part.get("optimizer", part)  # the bf16/fp16 wrapper nests the torch optimizer's dict
        if isinstance(inner, dict) and isinstance(inner.get("state"), dict) and inner["state"] \
                and "common_step" not in inner["state"]:
            inner["state"]["common_step"] = torch.tensor(float(step))


def _ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _rng_state() -> dict:
    """This rank's generators: torch (and CUDA), numpy, python, and megatron's named
    model-parallel states (dropout in tensor-parallel regions, recomputation)."""
    from megatron.core import tensor_parallel

    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
             "megatron": tensor_parallel.get_cuda_rng_tracker().get_states()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict) -> None:
    from megatron.core import tensor_parallel

    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    tensor_parallel.get_cuda_rng_tracker().set_states(state["megatron"])
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])
