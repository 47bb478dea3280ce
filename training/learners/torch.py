"""The torch learner: policy and token-level critic (same architecture, same checkpoint),
AdamW, gradient clipping, token-budget micro-batches with accumulation, K critic steps per
policy step, critic-only warm-up, chunked logprobs. One process (CPU or one GPU), or one
replica per rank under torch.distributed (`training/collectives.py`, started by `training/runtime/local.py`): each rank steps on its
share of the batch's rows and gradients are summed over ranks.

A step, in order: pack the batch; one no-grad pass for values and pi_old logprobs; the
algorithm's advantages over the whole batch; K critic updates (with `algo.values_after_critic`,
a second no-grad pass of the critic and the advantages from its new values); then (after
warm-up) one policy update, which makes a new policy version.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer
from transformers.utils import logging as hf_logging

from agent.trajectory import Trajectory
from training import collectives, losses
from training.batch import Batch, micro_batch_rows, pack
from training.learners.metrics import accumulate, batch_metrics, policy_health
from training.logprobs import token_logprobs
from training.timings import Phases


def _rows(t: torch.Tensor, rows: list[int], length: int) -> torch.Tensor:
    return t[torch.tensor(rows)][:, :length]


class TorchLearner:
    collective = False  # each rank holds a replica: only the step runs on every rank
    layout_summary = None  # data parallel only

    def __init__(
        self,
        model_path: str,
        algo,
        value_checkpoint: str | None = None,
        device: str = "cpu",
        dtype: str = "float32",
        weight_decay: float = 0.0,
        grad_clip: float = 1.0,
        micro_batch_tokens: int = 8192,
        logprob_chunk: int = 1024,
        sampling_temperature: float = 1.0,
        seed: int = 0,
    ):
        torch.manual_seed(seed)
        self.dist = collectives.current()
        if device == "cuda" and self.dist.world > 1:
            device = f"cuda:{self.dist.local_rank}"
        self.algo = algo
        self.device = device
        self.grad_clip = grad_clip
        self.micro_batch_tokens = micro_batch_tokens
        self.logprob_chunk = logprob_chunk
        self.temperature = sampling_temperature
        torch_dtype = getattr(torch, dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.pad_id = self.tokenizer.pad_token_id or 0
        self.policy = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype).to(device).train()
        self.policy_opt = torch.optim.AdamW(self.policy.parameters(), lr=algo.lr_policy, weight_decay=weight_decay)
        self.critic = self.critic_opt = None
        if algo.uses_critic:
            # a per-token scalar head on the policy's own architecture, from the same checkpoint
            # (or from a value checkpoint: "value pretraining")
            source = value_checkpoint or model_path
            config = AutoConfig.from_pretrained(source, num_labels=1)
            config.classifier_dropout = 0.0  # the head's default dropout (0.1) would make values noisy
            self.critic = _load_critic(source, config, torch_dtype, fresh_head=value_checkpoint is None).to(device).train()
            if algo.freeze_critic_attention:
                for name, p in self.critic.named_parameters():
                    if "self_attn" in name:
                        p.requires_grad_(False)
            trainable = [p for p in self.critic.parameters() if p.requires_grad]
            self.critic_opt = torch.optim.AdamW(trainable, lr=algo.lr_critic, weight_decay=weight_decay)
        self._phase = Phases()  # the current step's time per phase (training/timings.py)
        self.step_count = 0  # learner steps taken (critic-only warm-up steps included)
        self.version = 0  # policy updates made: the version the engine samples with after a sync

    # -- forward passes ---------------------------------------------------------------------
    def _logprobs(self, mb: Batch) -> torch.Tensor:
        """[B, L] log pi_theta(targets) at temperature, in chunks (no full fp32 logits)."""
        hidden = self.policy.base_model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).last_hidden_state
        weight = self.policy.get_output_embeddings().weight
        return token_logprobs(hidden, weight, mb.targets, self.logprob_chunk, self.temperature)

    def _values(self, mb: Batch) -> torch.Tensor:
        return self.critic(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits[..., 0].float()

    def _to(self, mb: Batch) -> Batch:
        return Batch(**{k: v.to(self.device) for k, v in vars(mb).items()})

    # -- one step ---------------------------------------------------------------------------
    def step(self, trajectories: list[Trajectory], group_ids: list[int] | None = None) -> dict[str, float]:
        t0 = time.perf_counter()
        self._phase = Phases(torch.cuda.synchronize if str(self.device).startswith("cuda") else None)
        with self._phase("pack"):
            batch = self._to(pack(trajectories, self.pad_id, group_ids))
            # this rank's rows (all of them in one process), in token-budget micro-batches
            mine = collectives.shard_rows(batch.attention_mask.sum(1).tolist(), self.dist.rank, self.dist.world)
            parts = self._micro_batches(batch, mine)
        n_sampled = max(batch.num_sampled, 1)  # of the whole batch, on every rank
        B, L = batch.input_ids.shape
        updates_policy = self.critic is None or self.algo.policy_updates_at(self.step_count)
        old_logp = torch.zeros(B, L, device=self.device)
        ahead = self._pi_old_first(updates_policy)
        if ahead:
            with self._phase("policy_forward"), torch.no_grad():
                for rows in parts:
                    mb = batch.select(rows)
                    old_logp[torch.tensor(rows), : mb.input_ids.shape[1]] = self._logprobs(mb)
                # every rank filled its own rows (zeros elsewhere): the sum is the whole batch's
                collectives.sum_(old_logp)
        values = self._critic_values(batch, parts) if self.critic is not None else None
        with self._phase("advantages"):
            advantages, returns = self.algo.advantages(batch, values)
        metrics: dict[str, float] = {}
        if self.critic is not None:
            lr = self.algo.critic_lr_at(self.step_count)
            for group in self.critic_opt.param_groups:
                group["lr"] = lr
            metrics["value/lr"] = lr
            for _ in range(self.algo.critic_steps):
                update = self._critic_update(batch, parts, returns, n_sampled)
                update.pop("value/explained_var")
                metrics.update(update)
            if self.algo.values_after_critic:  # advantages from the values the K updates left
                after = self._critic_values(batch, parts)
                with self._phase("advantages"):
                    advantages, _ = self.algo.advantages(batch, after)
                metrics["value/explained_var_after"] = losses.value_loss(
                    after, returns, batch.loss_mask)[1]["value/explained_var"]
        # the critic-only warm-up exists for a critic; the running-mean baseline has none to wait for
        if updates_policy:
            update = self._policy_update(batch, advantages, old_logp, fill=not ahead)
            if not ahead:
                collectives.sum_(old_logp)  # (each rank filled its rows in the update's forward)
        # the explained variance is the values' before this batch's critic updates (out of sample)
        metrics.update(batch_metrics(batch, old_logp, advantages, values, returns, self.version))
        if updates_policy:
            metrics.update(update)
            self.version += 1
        else:  # no update (so no loss logged), but the same health metrics: mask fractions, ratio
            metrics.update(policy_health(self.algo, batch, advantages, old_logp, n_sampled))
        self.algo.observe_rewards(batch.rewards, batch.prompt_keys)
        self.step_count += 1
        metrics["learner/step"] = float(self.step_count)
        metrics["learner/version"] = float(self.version)
        metrics.update(self._phase.metrics("time/learner"))
        metrics["time/learner/total_s"] = time.perf_counter() - t0
        return metrics

    def _pi_old_first(self, updates_policy: bool) -> bool:
        """Whether pi_old (the policy's logprobs before this step's update) takes a forward pass
        of its own: where the update needs it before it starts (a mean over kept tokens counts
        them first; a second policy mini-batch's pi_old is the weights before the first) or makes
        none. Else the update's own forward, detached, gives the same numbers for the metrics
        (and GRPO's ratio), and the pass is saved."""
        return (not updates_policy or getattr(self.algo, "policy_minibatches", 1) > 1
                or getattr(self.algo, "token_mean", "sampled") == "kept")

    def _critic_values(self, batch: Batch, parts: list[list[int]]) -> torch.Tensor:
        """[B, L] the critic's values for the whole batch: this rank's rows, summed over ranks."""
        values = torch.zeros(batch.input_ids.shape, device=self.device)
        with self._phase("critic_forward"), torch.no_grad():
            for rows in parts:
                mb = batch.select(rows)
                values[torch.tensor(rows), : mb.input_ids.shape[1]] = self._values(mb)
            collectives.sum_(values)
        return values

    def _critic_update(self, batch, parts, returns, n_sampled) -> dict[str, float]:
        def loss_of(rows, mb):
            target = _rows(returns, rows, mb.input_ids.shape[1])
            return losses.value_loss(self._values(mb), target, mb.loss_mask, normalizer=n_sampled)

        return self._update("critic", self.critic, self.critic_opt, batch, parts, loss_of, n_sampled)

    def _update(self, name: str, model, opt, batch, parts, loss_of, n_sampled) -> dict[str, float]:
        """One optimizer step of `model` (the policy or the critic) over this rank's micro-batches:
        each one's `loss_of(rows, mb)` backpropagated, gradients summed over ranks, clipped;
        metrics weighted by each micro-batch's share of the sampled tokens."""
        opt.zero_grad(set_to_none=True)
        acc: dict[str, float] = defaultdict(float)
        with self._phase(f"{name}_backward"):  # forward and backward, gradients summed over ranks
            for rows in parts:
                mb = batch.select(rows)
                loss, m = loss_of(rows, mb)
                loss.backward()
                accumulate(acc, m, mb.num_sampled / n_sampled)
            collectives.sum_gradients(model)
            acc = collectives.sum_metrics(acc)
        with self._phase(f"{name}_optimizer"):
            key = "value/grad_norm" if name == "critic" else "policy/grad_norm"
            acc[key] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), self.grad_clip))
            opt.step()
        return dict(acc)

    def _micro_batches(self, batch: Batch, rows: list[int]) -> list[list[int]]:
        """`rows` of the batch in token-budget micro-batches (batch row indices)."""
        if not rows:
            return []
        return [[rows[i] for i in part] for part in micro_batch_rows(batch.select(rows), self.micro_batch_tokens)]

    def _policy_update(self, batch, advantages, old_logp, fill: bool = False) -> dict[str, float]:
        """`algo.policy_minibatches` optimizer steps, each over its share of the batch's rows
        (one: the whole batch), each share split over the ranks as a batch is. pi_old stays the
        weights at the start of the step, so from the second mini-batch on the ratio moves and
        PPO's clip (GRPO) can bind. Metrics: their mean over the mini-batches."""
        M = getattr(self.algo, "policy_minibatches", 1)
        lengths = batch.attention_mask.sum(1).tolist()
        acc: dict[str, float] = defaultdict(float)
        for i in range(M):
            share = list(range(i, len(batch), M))
            mine = [share[j] for j in collectives.shard_rows([lengths[r] for r in share], self.dist.rank, self.dist.world)]
            n_loss = max(self.algo.loss_units(batch, share, old_logp), 1.0)  # the share's token-mean denominator
            n_sampled = max(float(batch.loss_mask[share].sum()), 1.0)  # metrics are means over sampled tokens
            for k, v in self._policy_step(batch, self._micro_batches(batch, mine), advantages, old_logp,
                                          n_loss, n_sampled, fill).items():
                acc[k] += v / M
        return dict(acc)

    def _policy_step(self, batch, parts, advantages, old_logp, n_loss, n_sampled, fill=False) -> dict[str, float]:
        """`fill`: pi_old is this forward's own logprobs (one mini-batch: the weights are still
        those at the start of the step), written into `old_logp` for the step's metrics."""
        def loss_of(rows, mb):
            n = mb.input_ids.shape[1]
            logp = self._logprobs(mb)
            if fill:
                old_logp[torch.tensor(rows), :n] = logp.detach()
            return self.algo.policy_loss(logp, mb, _rows(advantages, rows, n), _rows(old_logp, rows, n), n_loss)

        return self._update("policy", self.policy, self.policy_opt, batch, parts, loss_of, n_sampled)

    def release_memory(self) -> None:
        """After a step, before a colocated engine wakes: the gradients go (each update sets
        them to None before its first backward anyway), and on CUDA the caching allocator hands
        its free blocks back (the step's activations and logits chunks), so this rank keeps only
        its weights and AdamW's moments while the engine takes its share again."""
        for model in (self.policy, self.critic):
            if model is not None:
                model.zero_grad(set_to_none=True)
        if str(self.device).startswith("cuda"):
            torch.cuda.empty_cache()

    # -- weights out, checkpoints -----------------------------------------------------------------
    def state_dict_for_engine(self) -> list[tuple[str, torch.Tensor]]:
        """The policy's weights by HF name, the tied output head included (vLLM needs it)."""
        return [(k, v.detach()) for k, v in self.policy.state_dict().items()]

    def weights_for_engine(self) -> Iterator[tuple[str, torch.Tensor]]:
        """As `state_dict_for_engine`, one at a time (every data-parallel rank holds them all)."""
        return iter(self.state_dict_for_engine())

    def save(self, path: str | Path) -> None:
        """HF-format `policy/` and `critic/` (loadable with from_pretrained) plus `learner.pt`."""
        path = Path(path)
        self.policy.save_pretrained(path / "policy")
        self.tokenizer.save_pretrained(path / "policy")
        state = {
            "policy_opt": self.policy_opt.state_dict(), "step_count": self.step_count, "version": self.version,
            "algo": self.algo.state_dict(),
            "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()},
        }
        if self.critic is not None:
            self.critic.save_pretrained(path / "critic")
            self.tokenizer.save_pretrained(path / "critic")
            state["critic_opt"] = self.critic_opt.state_dict()
        torch.save(state, path / "learner.pt")

    def load(self, path: str | Path) -> None:
        path = Path(path)
        dtype = next(self.policy.parameters()).dtype
        self.policy.load_state_dict(AutoModelForCausalLM.from_pretrained(path / "policy", dtype=dtype).state_dict())
        state = torch.load(path / "learner.pt", weights_only=False)
        self.policy_opt.load_state_dict(state["policy_opt"])
        if self.critic is not None:
            critic = AutoModelForTokenClassification.from_pretrained(path / "critic", dtype=dtype)
            self.critic.load_state_dict(critic.state_dict())
            self.critic_opt.load_state_dict(state["critic_opt"])
        self.step_count, self.version = state["step_count"], state["version"]
        self.algo.load_state_dict(state["algo"])
        torch.set_rng_state(state["rng"]["torch"])
        np.random.set_state(state["rng"]["numpy"])
        random.setstate(state["rng"]["python"])


def _load_critic(source: str, config, dtype, fresh_head: bool):
    """The critic from `source`. From the policy's checkpoint its value head is new by design,
    so transformers' report of those missing weights (a warning table) is left out; from a
    value checkpoint a missing head would be a mistake, and is reported."""
    verbosity = hf_logging.get_verbosity()
    if fresh_head:
        hf_logging.set_verbosity_error()
    try:
        return AutoModelForTokenClassification.from_pretrained(source, config=config, dtype=dtype)
    finally:
        hf_logging.set_verbosity(verbosity)
