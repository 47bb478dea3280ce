"""Policy and value losses, and advantage estimators: pure functions of tensors.

Every per-token tensor is laid out by position, as in `training.batch`: `loss_mask[b, t] = 1`
exactly where the engine sampled the token predicted at position t. Losses are token-level
means over the sampled tokens (SAO's over the ones its band keeps); `normalizer` lets a
learner that splits a batch into micro-batches divide every micro-batch by the whole batch's
token count, so that the accumulated gradient equals the full batch's token mean.

Metrics come back as plain floats under namespaced keys (`sao/`, `ppo/`, `value/`).
"""

from __future__ import annotations

import torch

Metrics = dict[str, float]


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over mask-True entries (0 for an empty mask); where() so inf off-mask is harmless."""
    return torch.where(mask, x, torch.zeros_like(x)).sum() / mask.sum().clamp(min=1)


def _per_token(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """[B] advantages broadcast over tokens; [B, T] passed through."""
    return advantages.unsqueeze(-1) if advantages.dim() == like.dim() - 1 else advantages


def _denominator(loss_mask: torch.Tensor, normalizer: float | None) -> torch.Tensor | float:
    if normalizer is not None:
        return max(float(normalizer), 1.0)
    return loss_mask.float().sum().clamp(min=1.0)


MEANS = ("kept", "sampled", "seq_mean_token_mean")


def _check_mean(mean_over: str, allowed: tuple[str, ...] = MEANS) -> None:
    if mean_over not in allowed:
        raise ValueError(f"mean_over must be one of {', '.join(allowed)}, got {mean_over!r}")


def row_scale(loss_mask: torch.Tensor, mean_over: str) -> torch.Tensor:  # [B, 1]
    """Each row's factor on its per-token losses: 1 / its sampled tokens for the
    seq-mean-token-mean (each trajectory's own token mean, then the mean over trajectories),
    1 otherwise. Local to a row, so a learner can apply it micro-batch by micro-batch."""
    if mean_over != "seq_mean_token_mean":
        return torch.ones(loss_mask.shape[0], 1, device=loss_mask.device)
    return 1.0 / loss_mask.float().sum(dim=-1, keepdim=True).clamp(min=1.0)


def loss_units(keep: torch.Tensor, loss_mask: torch.Tensor, mean_over: str) -> float:
    """What a policy loss is a mean over (its denominator): the kept tokens, the sampled tokens,
    or the rows with a sampled token (seq-mean-token-mean). Summed over micro-batches and ranks,
    it is the whole batch's count."""
    _check_mean(mean_over)
    if mean_over == "kept":
        return float(keep.sum())
    if mean_over == "sampled":
        return float(loss_mask.sum())
    return float((loss_mask.sum(dim=-1) > 0).sum())


def sao_keep_mask(
    logprobs: torch.Tensor,  # [B, T] learner's log pi_theta(target)
    behaviour_logprobs: torch.Tensor,  # [B, T] the engine's logprob when it sampled the token
    loss_mask: torch.Tensor,  # [B, T] 1 (or True) on sampled tokens
    eps_low: float = 0.8,
    eps_high: float = 3.0,
) -> torch.Tensor:  # [B, T] bool, no grad
    """The sampled tokens SAO keeps: 1 - eps_low < r < 1 + eps_high, strict at both edges."""
    with torch.no_grad():
        ratio = (logprobs - behaviour_logprobs).exp()
        return loss_mask.bool() & (ratio > 1 - eps_low) & (ratio < 1 + eps_high)


def sao_policy_loss(
    logprobs: torch.Tensor,  # [B, T] learner's log pi_theta(target), requires grad
    behaviour_logprobs: torch.Tensor,  # [B, T] the engine's logprob when it sampled the token
    advantages: torch.Tensor,  # [B, T] (or [B], broadcast over tokens)
    loss_mask: torch.Tensor,  # [B, T] 1 (or True) on sampled tokens
    eps_low: float = 0.8,
    eps_high: float = 3.0,
    normalizer: float | None = None,
    mean_over: str = "kept",
) -> tuple[torch.Tensor, Metrics]:
    """SAO's policy loss: ratio against the sampler, strict two-sided token mask, no clamp.

    r = exp(logprobs - behaviour_logprobs). A sampled token is kept only when
    1 - eps_low < r < 1 + eps_high (strict: a ratio exactly on an edge is dropped); a dropped
    token gets exactly zero gradient whatever the sign of its advantage. The loss is
    -sum(keep * r * A) / N, so a kept token's gradient w.r.t. its logprob is -r * A / N.
    N is what the mean is over: the kept tokens (`mean_over="kept"`, a token-level mean over
    the batch's unmasked tokens; docs/design.md says why this is a choice), every sampled token
    (`"sampled"`: dropped tokens count, so a batch with many of them takes a smaller step), or
    the trajectories (`"seq_mean_token_mean"`: each row's sum over its kept tokens divided by its
    sampled tokens, then the mean over rows, so a long trajectory weighs as much as a short one);
    `normalizer`, when given, replaces N (a learner's whole-batch count, for micro-batches).
    An empty keep mask gives loss 0 that still backpropagates (zeros).
    """
    _check_mean(mean_over)
    sampled = loss_mask.bool()
    logratio = logprobs - behaviour_logprobs
    keep = sao_keep_mask(logprobs, behaviour_logprobs, loss_mask, eps_low, eps_high)
    with torch.no_grad():
        ratio_seen = logratio.exp()
        low = sampled & (ratio_seen <= 1 - eps_low)
        high = sampled & (ratio_seen >= 1 + eps_high)
    # Zero the log-ratio of dropped tokens before exp: keep * exp(x) would give 0 * inf = NaN
    # (forward and backward) for a ratio that overflows; where() passes them exactly zero grad.
    ratio = torch.where(keep, logratio, torch.zeros_like(logratio)).exp()
    scale = row_scale(loss_mask, mean_over).to(ratio.dtype)
    pg_loss = -(keep.to(ratio.dtype) * ratio * _per_token(advantages, ratio) * scale).sum()
    loss = pg_loss / (max(float(normalizer), 1.0) if normalizer is not None
                      else max(loss_units(keep, loss_mask, mean_over), 1.0))
    n = sampled.sum().clamp(min=1).item()
    metrics = {
        "sao/loss": loss.item(),
        "sao/mask_frac_low": low.sum().item() / n,
        "sao/mask_frac_high": high.sum().item() / n,
        "sao/kept_frac": keep.sum().item() / n,
        "sao/ratio_mean": _masked_mean(ratio_seen, sampled).item(),
        "sao/logprob_mismatch": _masked_mean(logratio.detach().abs(), sampled).item(),
    }
    return loss, metrics


def ppo_clip_loss(
    logprobs: torch.Tensor,  # [B, T] learner's log pi_theta(target), requires grad
    old_logprobs: torch.Tensor,  # [B, T] log pi_old(target), the policy before this update
    advantages: torch.Tensor,  # [B, T] (or [B], broadcast over tokens)
    loss_mask: torch.Tensor,  # [B, T] 1 (or True) on sampled tokens
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    normalizer: float | None = None,
    mean_over: str = "sampled",
) -> tuple[torch.Tensor, Metrics]:
    """The GRPO/PPO baseline: -min(r * A, clamp(r, 1 - eps_low, 1 + eps_high) * A), a token
    mean over sampled tokens, or the seq-mean-token-mean (N and `normalizer` as in
    `sao_policy_loss`); eps_high > eps_low is DAPO's clip-higher. `ppo/clipfrac` is cleanrl's: the fraction of sampled tokens whose ratio lies
    outside the clip range (whether or not the clip binds for that advantage's sign).
    """
    sampled = loss_mask.bool()
    logratio = torch.where(sampled, logprobs - old_logprobs, torch.zeros_like(logprobs))
    ratio = logratio.exp()
    adv = _per_token(advantages, ratio)
    pg_loss1 = -adv * ratio
    pg_loss2 = -adv * torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    _check_mean(mean_over, ("sampled", "seq_mean_token_mean"))
    scale = row_scale(loss_mask, mean_over).to(ratio.dtype)
    pg_loss = (torch.where(sampled, torch.max(pg_loss1, pg_loss2), torch.zeros_like(ratio)) * scale).sum()
    loss = pg_loss / (max(float(normalizer), 1.0) if normalizer is not None
                      else max(loss_units(sampled, loss_mask, mean_over), 1.0))
    with torch.no_grad():
        clipped = (ratio < 1 - eps_low) | (ratio > 1 + eps_high)
        approx_kl = (ratio - 1) - logratio  # cleanrl's low-variance k3 estimator
        metrics = {
            "ppo/loss": loss.item(),
            "ppo/clipfrac": _masked_mean(clipped.float(), sampled).item(),
            "ppo/ratio_mean": _masked_mean(ratio, sampled).item(),
            "ppo/approx_kl": _masked_mean(approx_kl, sampled).item(),
        }
    return loss, metrics


def explained_variance(pred: torch.Tensor, target: torch.Tensor) -> float:
    """1 - Var(target - pred) / Var(target), population variances, in float64; 0.0 for constant
    targets (up to rounding: returns = A + V carries ~1e-9 noise) or none, where it is undefined."""
    y_pred, y_true = pred.detach().double(), target.detach().double()
    var_y = y_true.var(unbiased=False) if y_true.numel() else torch.tensor(0.0)
    return 0.0 if var_y <= 1e-12 else (1 - (y_true - y_pred).var(unbiased=False) / var_y).item()


def value_loss(
    values: torch.Tensor,  # [B, T] critic's per-token values, requires grad
    returns: torch.Tensor,  # [B, T] targets (detached)
    loss_mask: torch.Tensor,  # [B, T] 1 (or True) on sampled tokens
    normalizer: float | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """Plain MSE (no 1/2, no value clipping), a token mean over sampled tokens.

    `value/explained_var` = 1 - Var(returns - values) / Var(returns) over sampled tokens
    (population variances); it is reported as 0.0 when Var(returns) is 0 (constant targets,
    or no sampled tokens), where the ratio is undefined.
    """
    sampled = loss_mask.bool()
    sq_err = (values - returns.detach()) ** 2
    loss = torch.where(sampled, sq_err, torch.zeros_like(sq_err)).sum() / _denominator(loss_mask, normalizer)
    with torch.no_grad():
        metrics = {
            "value/loss": loss.item(),
            "value/explained_var": explained_variance(values[sampled], returns[sampled]),
            "value/mean": _masked_mean(values, sampled).item(),
        }
    return loss, metrics


def grpo_advantages(
    rewards: torch.Tensor,  # [P, G] one row per prompt, G rollouts each
    eps: float = 1e-6,
    scale: bool = True,
    std: str = "population",
) -> torch.Tensor:  # [P, G]
    """Group-normalised advantages: (r - mean_g) / (std_g + eps), std_g the Bessel-corrected
    standard deviation (`std="unbiased"`, divisor G - 1, as verl, TRL and slime compute it) or
    the population one (`"population"`, divisor G: advantages larger by sqrt(G / (G - 1)));
    `scale=False` keeps only the mean subtraction (Dr. GRPO). A group of equal rewards gets
    advantage 0 everywhere."""
    if std not in ("unbiased", "population"):
        raise ValueError(f"std must be 'unbiased' or 'population', got {std!r}")
    centred = rewards - rewards.mean(dim=-1, keepdim=True)
    if not scale:
        return centred
    if std == "unbiased" and rewards.shape[-1] < 2:
        raise ValueError("the unbiased standard deviation needs groups of 2 or more")
    return centred / (rewards.std(dim=-1, unbiased=std == "unbiased", keepdim=True) + eps)


def running_mean_advantages(
    rewards: torch.Tensor,  # [B] this batch's rewards
    history: torch.Tensor,  # [W] the last W rewards seen before this batch (may be empty)
) -> torch.Tensor:  # [B]
    """The running-mean baseline: A = r - mean(history); an empty history gives baseline 0."""
    baseline = history.float().mean() if history.numel() else 0.0
    return rewards - baseline


def broadcast_to_tokens(
    adv: torch.Tensor,  # [B] one advantage per trajectory
    loss_mask: torch.Tensor,  # [B, T]
) -> torch.Tensor:  # [B, T] adv on sampled tokens, 0 elsewhere
    """A per-trajectory advantage placed on each of its sampled tokens."""
    return adv.unsqueeze(-1) * loss_mask.to(adv.dtype)


def adaptive_lambda(loss_mask: torch.Tensor) -> torch.Tensor:  # loss_mask [B, T] -> [B]
    """SAO's length-adaptive policy lambda: 1 - 1 / (1.5 * l), l = the row's sampled tokens
    (a row with none is treated as l = 1; it has no advantages to weight anyway)."""
    length = loss_mask.float().sum(dim=-1).clamp(min=1.0)
    return 1 - 1 / (1.5 * length)


def _discounted_reverse_sum(x: torch.Tensor, c: torch.Tensor, n: torch.Tensor, block: int = 64) -> torch.Tensor:
    """y[b, t] = sum over j >= t (within the row's first n[b] entries) of c[b]^(j - t) x[b, j]:
    A_t = delta_t + c A_(t+1), computed in blocks of `block` entries from each row's end: inside a
    block one [block x block] product of powers of c (exponents below `block`, so no power
    overflows whatever c and the length), across blocks the carried sum. float64; a Python loop
    of S / block iterations instead of one per token."""
    B, S = x.shape
    # each row reversed within its own length: its last entry first (entries past n stay 0)
    idx = torch.arange(S, device=x.device)[None]
    rev = (n[:, None] - 1 - idx).clamp(min=0)
    inside = idx < n[:, None]
    xr = torch.where(inside, x.gather(1, rev), 0.0)
    pad = (-S) % block
    if pad:
        xr = torch.cat([xr, xr.new_zeros(B, pad)], dim=1)
    k = torch.arange(block, device=x.device, dtype=torch.float64)
    expo = k[:, None] - k[None, :]  # [block, block]: i - j
    powers = torch.where(expo >= 0, c[:, None, None] ** expo.clamp(min=0), 0.0)  # [B, block, block]
    carry_pow = c[:, None] ** (k + 1)[None]  # [B, block]: c^(i + 1)
    out = torch.empty_like(xr)
    carry = xr.new_zeros(B)
    for start in range(0, xr.shape[1], block):
        chunk = torch.bmm(powers, xr[:, start:start + block, None])[..., 0] + carry_pow * carry[:, None]
        out[:, start:start + block] = chunk
        carry = chunk[:, -1]
    out = out[:, :S]
    return torch.where(inside, out.gather(1, rev), 0.0)  # back in each row's own order


def skip_observation_gae(
    rewards: torch.Tensor,  # [B] terminal reward of each trajectory
    values: torch.Tensor,  # [B, T] critic's per-token values
    loss_mask: torch.Tensor,  # [B, T] 1 on sampled (action) tokens, 0 on prompt/tool output/pad
    gamma: float = 1.0,
    lam: float | torch.Tensor | None = None,  # float, [B], or None for adaptive_lambda
) -> tuple[torch.Tensor, torch.Tensor]:  # advantages [B, T], returns [B, T]
    """GAE over sampled tokens only, skipping observations.

    The recursion runs over mask-1 tokens: the next state of the last token of one assistant
    turn is the first token of the next turn (tool output in between is skipped, undiscounted).
    The reward is paid at the last sampled token of each row, whose next value is 0 (terminal):
        delta_t = r_t + gamma * V(next sampled token) - V(t)
        A_t     = delta_t + gamma * lam * A(next sampled token)
    returns = A + V on sampled tokens. Both outputs are 0 off-mask and carry no gradient. With
    lam = 1 the returns are Monte-Carlo targets (gamma = 1: the reward at every sampled token).
    """
    values = values.detach().float()
    sampled = loss_mask.bool()
    B, T = values.shape
    if lam is None:
        lam = adaptive_lambda(loss_mask)
    lam = torch.as_tensor(lam, dtype=torch.float64, device=values.device).expand(B)
    # Each row's sampled tokens, gathered in order into [B, S] (S: the most any row has): the
    # recursion over them is ordinary GAE, with no observation in between to skip.
    n = sampled.sum(dim=-1)  # [B]
    S = int(n.max()) if B else 0
    advantages = torch.zeros_like(values)
    if S == 0:
        return advantages, torch.zeros_like(values)
    positions = torch.arange(T, device=values.device).expand(B, T)
    order = torch.where(sampled, positions, positions + T).argsort(dim=-1)[:, :S]  # sampled positions first, in order
    present = torch.arange(S, device=values.device)[None] < n[:, None]  # [B, S]
    v = torch.where(present, values.gather(1, order).double(), 0.0)
    next_v = torch.cat([v[:, 1:], v.new_zeros(B, 1)], dim=1)  # 0 past a row's last token (terminal)
    last = present & ~torch.cat([present[:, 1:], present.new_zeros(B, 1)], dim=1)
    delta = torch.where(last, rewards.double()[:, None], 0.0) + gamma * next_v - v
    delta = torch.where(present, delta, 0.0)
    adv = _discounted_reverse_sum(delta, gamma * lam, n)
    advantages.scatter_(1, order, torch.where(present, adv, 0.0).float())
    advantages = torch.where(sampled, advantages, 0.0)
    returns = torch.where(sampled, advantages + values, 0.0)
    return advantages, returns
