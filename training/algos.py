"""The algorithms, each one small object chosen once when the config is built: how
advantages are estimated and which policy loss is used. The learner only calls them.

SAO (docs/design.md, "The algorithm"): single rollout per prompt, ratio against the sampler's
logprobs, strict two-sided token mask, a token-level critic with skip-observation GAE (or a
running-mean baseline, the simple alternative). GRPO: G rollouts per prompt, group-normalised
advantages, PPO clip against pi_old (the learner's weights at the start of the step).
GRPO + DIS, the paper's fair baseline: GRPO's group advantages with SAO's policy loss (the
ratio against the sampler's logprobs, the strict two-sided mask, no pi_old).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from training import losses
from training.batch import Batch


@dataclass
class SAO:
    eps_low: float = 0.8  # coding / SWE defaults: keep tokens with 0.2 < r < 4.0
    eps_high: float = 3.0
    gamma: float = 1.0
    policy_lambda: float | None = None  # None: length-adaptive 1 - 1/(1.5 l)
    critic_lambda: float = 1.0  # Monte-Carlo value targets
    baseline: str = "critic"  # or "running_mean"
    baseline_scope: str = "prompt"  # running mean: of each prompt's own last rewards, or "global" (all prompts')
    baseline_window: int = 8  # rewards in the running mean (the paper: 8 per prompt; 128 global online)
    critic_steps: int = 2  # K critic updates per policy update
    critic_warmup_steps: int = 10  # the critic's warm-up, in learner steps
    critic_warmup: str = "steps"  # "steps": that many critic-only steps; "lr": the policy updates from
    # the first step and the critic's learning rate rises linearly to lr_critic over them
    freeze_critic_attention: bool = True
    lr_policy: float = 1e-6
    lr_critic: float = 5e-6
    mask: bool = True  # ablation switch: False keeps every token (no band)
    policy_minibatches: int = 1  # optimizer steps per learner step, each on its share of the batch
    # what the policy loss is a mean over: each trajectory's mean over its sampled tokens, then the
    # mean over trajectories (measured best: BENCHMARKS.md, SAO's stability), the batch's kept
    # tokens (DESIGN's reading), or its sampled tokens
    token_mean: str = "seq_mean_token_mean"
    values_after_critic: bool = False  # advantages from the values after the K critic updates
    name: str = "sao"
    group_size: int = 1
    _history: deque = field(default_factory=deque, repr=False)

    def __post_init__(self):
        if self.baseline not in ("critic", "running_mean"):
            raise ValueError(f"algo.baseline must be 'critic' or 'running_mean', got {self.baseline!r}")
        _check_token_mean(self.token_mean, losses.MEANS)
        if self.critic_warmup not in ("steps", "lr"):
            raise ValueError(f"algo.critic_warmup must be 'steps' or 'lr', got {self.critic_warmup!r}")
        if self.baseline_scope not in ("prompt", "global"):
            raise ValueError(f"algo.baseline_scope must be 'prompt' or 'global', got {self.baseline_scope!r}")
        self._history = deque(maxlen=self.baseline_window)
        self._by_prompt: dict[int, deque] = {}

    @property
    def uses_critic(self) -> bool:
        return self.baseline == "critic"

    def policy_updates_at(self, step: int) -> bool:
        """Whether learner step `step` (from 0) updates the policy, with a critic to warm up."""
        return self.critic_warmup == "lr" or step >= self.critic_warmup_steps

    def critic_lr_at(self, step: int) -> float:
        """The critic's learning rate at learner step `step` (from 0)."""
        if self.critic_warmup == "lr" and self.critic_warmup_steps > 0:
            return self.lr_critic * min(1.0, (step + 1) / self.critic_warmup_steps)
        return self.lr_critic

    def advantages(self, mb: Batch, values: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(advantages [B, L], value targets [B, L] or None) for a whole batch."""
        if not self.uses_critic:
            if self.baseline_scope == "global":
                adv = losses.running_mean_advantages(mb.rewards, torch.tensor(list(self._history), dtype=torch.float))
            else:  # each row against its own prompt's recent rewards (none yet: baseline 0)
                adv = torch.stack([losses.running_mean_advantages(
                    r.view(1), torch.tensor(list(self._by_prompt.get(int(k), ())), dtype=torch.float))[0]
                    for r, k in zip(mb.rewards, mb.prompt_keys)]) if len(mb) else mb.rewards
            return losses.broadcast_to_tokens(adv, mb.loss_mask), None
        adv, _ = losses.skip_observation_gae(mb.rewards, values, mb.loss_mask, self.gamma, self.policy_lambda)
        _, returns = losses.skip_observation_gae(mb.rewards, values, mb.loss_mask, self.gamma, self.critic_lambda)
        return adv, returns

    def observe_rewards(self, rewards: torch.Tensor, prompt_keys: torch.Tensor | None = None) -> None:
        """After a step: the running-mean baseline sees this batch's rewards."""
        self._history.extend(rewards.tolist())
        if prompt_keys is not None:
            for r, k in zip(rewards.tolist(), prompt_keys.tolist()):
                self._by_prompt.setdefault(k, deque(maxlen=self.baseline_window)).append(r)

    @property
    def _band(self) -> tuple[float, float]:
        return (self.eps_low, self.eps_high) if self.mask else (float("inf"), float("inf"))

    def loss_units(self, batch: Batch, rows: list[int], old_logprobs: torch.Tensor) -> float:
        """What `rows`' loss is a mean over (`token_mean`): their kept tokens, judged with the
        weights at the start of the step (exact for the first policy mini-batch, the only one
        by default), their sampled tokens, or their rows with a sampled token."""
        mask = batch.loss_mask[rows]
        keep = (losses.sao_keep_mask(old_logprobs[rows], batch.behaviour_logprobs[rows], mask, *self._band)
                if self.token_mean == "kept" else mask)
        return losses.loss_units(keep, mask, self.token_mean)

    def policy_loss(self, logprobs, mb: Batch, advantages, old_logprobs, normalizer):
        return losses.sao_policy_loss(logprobs, mb.behaviour_logprobs, advantages, mb.loss_mask,
                                      *self._band, normalizer=normalizer, mean_over=self.token_mean)

    def state_dict(self) -> dict:
        return {"history": list(self._history), "by_prompt": {str(k): list(v) for k, v in self._by_prompt.items()}}

    def load_state_dict(self, state: dict) -> None:
        self._history.extend(state.get("history", []))
        for k, v in state.get("by_prompt", {}).items():
            self._by_prompt.setdefault(int(k), deque(maxlen=self.baseline_window)).extend(v)


@dataclass
class GRPO:
    group_size: int = 8  # rollouts per prompt
    eps_low: float = 0.2
    eps_high: float = 0.28  # clip-higher (DAPO); eps_high = eps_low is plain PPO
    lr_policy: float = 1e-6
    mask: bool = False  # ablation: True drops out-of-band tokens as SAO does, on top of the clip
    mask_eps_low: float = 0.8
    mask_eps_high: float = 3.0
    # optimizer steps per learner step, each on a share of the batch, all against the same pi_old
    # (verl's ppo_mini_batch_size): with one the ratio is exactly 1 and the clip never binds
    policy_minibatches: int = 4
    token_mean: str = "sampled"  # or seq_mean_token_mean: each trajectory's token mean, then their mean
    group_std: str = "unbiased"  # the group's standard deviation: unbiased (divisor G - 1) or population (G)
    name: str = "grpo"
    uses_critic: bool = False
    critic_steps: int = 0
    critic_warmup_steps: int = 0
    values_after_critic: bool = False

    def __post_init__(self):
        _check_token_mean(self.token_mean, ("sampled", "seq_mean_token_mean"))
        _check_group_std(self.group_std, self.group_size)

    def advantages(self, mb: Batch, values) -> tuple[torch.Tensor, None]:
        # a whole batch: groups are contiguous runs of group_size rows (the orchestrator keeps them so)
        rewards = mb.rewards.view(-1, self.group_size)
        adv = losses.grpo_advantages(rewards, std=self.group_std).view(-1)
        return losses.broadcast_to_tokens(adv, mb.loss_mask), None

    def observe_rewards(self, rewards, prompt_keys=None) -> None:
        pass

    def loss_units(self, batch: Batch, rows: list[int], old_logprobs: torch.Tensor) -> float:
        """PPO's mean is over every sampled token of `rows` (or over their rows)."""
        mask = batch.loss_mask[rows]
        return losses.loss_units(mask, mask, self.token_mean)

    def policy_loss(self, logprobs, mb: Batch, advantages, old_logprobs, normalizer):
        if self.mask:  # the band against the sampler, as SAO's, then PPO's clip against pi_old: a
            # token outside it gets advantage 0, so no gradient (and still counts as sampled)
            ratio = torch.exp((logprobs.detach() - mb.behaviour_logprobs).clamp(max=50.0))
            inside = (ratio > 1 - self.mask_eps_low) & (ratio < 1 + self.mask_eps_high)
            advantages = advantages * inside
        return losses.ppo_clip_loss(logprobs, old_logprobs, advantages, mb.loss_mask, self.eps_low, self.eps_high,
                                    normalizer=normalizer, mean_over=self.token_mean)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@dataclass
class GRPODIS:
    """GRPO's group-normalised advantages, SAO's DIS loss: each token's ratio is against the
    logprob its sampler gave it, tokens outside 1 - eps_low < r < 1 + eps_high are dropped (no
    clip, no pi_old), and the loss is averaged as SAO's is (`token_mean`)."""

    group_size: int = 8  # rollouts per prompt
    eps_low: float = 0.8  # SAO's coding / SWE band
    eps_high: float = 3.0
    mask: bool = True  # False: no band (the ratio unbounded): an ablation, not a baseline
    token_mean: str = "seq_mean_token_mean"  # as SAO
    group_std: str = "unbiased"
    lr_policy: float = 1e-6
    policy_minibatches: int = 1  # the ratio is against the sampler either way
    name: str = "grpo_dis"
    uses_critic: bool = False
    critic_steps: int = 0
    critic_warmup_steps: int = 0
    values_after_critic: bool = False

    def __post_init__(self):
        _check_token_mean(self.token_mean, losses.MEANS)
        _check_group_std(self.group_std, self.group_size)

    advantages = GRPO.advantages
    observe_rewards = GRPO.observe_rewards
    state_dict = GRPO.state_dict
    load_state_dict = GRPO.load_state_dict
    _band = SAO._band
    loss_units = SAO.loss_units
    policy_loss = SAO.policy_loss


def _check_token_mean(value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"algo.token_mean must be one of {', '.join(allowed)}, got {value!r}")


def _check_group_std(value: str, group_size: int) -> None:
    if value not in ("unbiased", "population"):
        raise ValueError(f"algo.group_std must be 'unbiased' or 'population', got {value!r}")
    if value == "unbiased" and group_size < 2:
        raise ValueError(f"algo.group_std=unbiased needs algo.group_size of 2 or more, got {group_size}")
