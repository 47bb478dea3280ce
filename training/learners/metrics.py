"""What every learner logs, one copy for all: the batch's health before an update, the policy's
health in a step that does not update it, and micro-batch metrics summed into the batch's."""

from __future__ import annotations

import torch

from training import losses
from training.batch import Batch


def batch_metrics(batch: Batch, old_logp: torch.Tensor, advantages: torch.Tensor, values, returns,
                  version: int) -> dict[str, float]:
    """Rewards, token counts, mean advantage, engine-vs-learner logprob gap and (with a critic)
    explained variance, over the whole batch; `old_logp`, `advantages`, `values`, `returns`
    are [B, L] by position (values/returns None without a critic), `version` the learner's."""
    n_sampled = max(batch.num_sampled, 1)
    gap = (old_logp - batch.behaviour_logprobs).abs()
    metrics = {
        "reward/mean": float(batch.rewards.mean()),
        "tokens/sampled": float(batch.num_sampled),
        "tokens/total": float(batch.num_tokens),
        "advantage/mean": float((advantages * batch.loss_mask).sum() / n_sampled),
        # learner vs engine on the same tokens, before this step's update
        "sao/logprob_mismatch_pre": float((gap * batch.loss_mask).sum() / n_sampled),
    }
    # the same on the tokens sampled by the weights the learner holds now (staleness 0): the
    # numeric mismatch between engine and learner alone, without the policy's drift
    fresh = batch.loss_mask * (batch.policy_version == version)
    if fresh.sum() > 0:
        metrics["sao/logprob_mismatch_fresh"] = float((gap * fresh).sum() / fresh.sum())
    if values is not None:
        # cleanrl's explained variance: the values that made the advantages, whole batch
        metrics["value/explained_var"] = losses.value_loss(values, returns, batch.loss_mask)[1]["value/explained_var"]
    return metrics


def policy_health(algo, batch: Batch, advantages: torch.Tensor, old_logp: torch.Tensor, n_sampled: float) -> dict[str, float]:
    """A step without a policy update (the critic's warm-up) logs the same mask fractions and
    ratio as one with it, at the current weights; no loss, since none is optimised."""
    with torch.no_grad():
        health = algo.policy_loss(old_logp, batch, advantages, old_logp, n_sampled)[1]
    return {k: v for k, v in health.items() if not k.endswith("/loss")}


def accumulate(acc: dict[str, float], metrics: dict[str, float], weight: float) -> None:
    """Token-weighted mean of per-micro-batch metrics; losses, already divided by the whole
    batch's token count, are summed."""
    for k, v in metrics.items():
        acc[k] += float(v) * (1.0 if k.endswith("/loss") else weight)
