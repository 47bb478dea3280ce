"""Losses and advantages against numbers worked out by hand (derivations in the comments)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from training.losses import (
    adaptive_lambda,
    broadcast_to_tokens,
    grpo_advantages,
    ppo_clip_loss,
    running_mean_advantages,
    sao_keep_mask,
    sao_policy_loss,
    skip_observation_gae,
    value_loss,
)


def leaf(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype, requires_grad=True)


# ---------------------------------------------------------------- SAO policy loss


@pytest.mark.parametrize("mean_over,n", [("kept", 1), ("sampled", 3)])
def test_sao_keeps_only_the_band(mean_over, n):
    # behaviour 0, logprobs [-2, 0, 1.5] -> r = [e^-2, 1, e^1.5] = [0.135, 1, 4.48]
    # eps 0.8 / 3.0 -> band (0.2, 4.0): token 0 dropped low, token 1 kept, token 2 dropped high
    # A = [2, -1, 3]; N = 1 kept token (or 3 sampled) -> loss = -(1 * -1) / N = 1/N
    # grad of a kept token: -r * A / N = -(1 * -1) / N = 1/N; dropped tokens: exactly 0
    logprobs = leaf([[-2.0, 0.0, 1.5]])
    loss, m = sao_policy_loss(logprobs, torch.zeros(1, 3), torch.tensor([[2.0, -1.0, 3.0]]), torch.ones(1, 3),
                              mean_over=mean_over)
    loss.backward()
    assert loss.item() == pytest.approx(1 / n)
    assert logprobs.grad.tolist() == [[0.0, pytest.approx(1 / n), 0.0]]
    assert m["sao/mask_frac_low"] == pytest.approx(1 / 3)
    assert m["sao/mask_frac_high"] == pytest.approx(1 / 3)
    assert m["sao/kept_frac"] == pytest.approx(1 / 3)
    assert m["sao/ratio_mean"] == pytest.approx((math.exp(-2) + 1 + math.exp(1.5)) / 3)
    assert m["sao/logprob_mismatch"] == pytest.approx((2 + 0 + 1.5) / 3)  # mean |logratio|


def test_sao_band_edges_are_dropped():
    # eps_low = 0.5, eps_high = 1.0 -> band (0.5, 2.0), open at both ends.
    # r = exp(log 0.5) and exp(log 2) round to exactly 0.5 and 2.0 in fp32 (asserted first),
    # so both tokens sit exactly on an edge and are dropped; r = 1 (logratio 0) is kept.
    logprobs = leaf([[math.log(0.5), math.log(2.0), 0.0]])
    assert logprobs.detach().exp().tolist() == [[0.5, 2.0, 1.0]]
    loss, m = sao_policy_loss(logprobs, torch.zeros(1, 3), torch.ones(1, 3), torch.ones(1, 3), eps_low=0.5, eps_high=1.0)
    loss.backward()
    # N = 1 kept token: loss = -(1 * 1 * 1) / 1; grad of the kept token = -r * A / N = -1
    assert loss.item() == pytest.approx(-1.0)
    assert logprobs.grad.tolist() == [[0.0, 0.0, pytest.approx(-1.0)]]
    assert (m["sao/mask_frac_low"], m["sao/mask_frac_high"]) == (pytest.approx(1 / 3), pytest.approx(1 / 3))


def test_sao_ratio_exactly_one_is_dropped_by_a_zero_width_side():
    # eps_low = 0: band (1, 1 + eps_high); r = exp(0) = 1 exactly is on the low edge -> dropped
    lp = leaf([[0.0]])
    loss, m = sao_policy_loss(lp, torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), eps_low=0.0)
    loss.backward()
    assert lp.grad.item() == 0.0 and m["sao/mask_frac_low"] == 1.0


@pytest.mark.parametrize("advantage", [1.0, -1.0])
@pytest.mark.parametrize("logratio", [-2.0, 1.5])  # below 0.2, above 4.0
def test_sao_dropped_token_gets_exactly_zero_gradient(advantage, logratio):
    # both sides, both signs: no clamp, no sign-dependent clip as in PPO -> grad is exactly 0
    logprobs = leaf([[logratio, 0.0]])
    loss, _ = sao_policy_loss(logprobs, torch.zeros(1, 2), torch.tensor([[advantage, 0.0]]), torch.ones(1, 2))
    loss.backward()
    assert logprobs.grad[0, 0].item() == 0.0
    assert loss.item() == 0.0  # the kept token has A = 0


@pytest.mark.parametrize("mean_over,n", [("kept", 2), ("sampled", 3)])
def test_sao_kept_gradient_is_r_times_a_over_n(mean_over, n):
    # row: [kept r=2 A=0.5, off-mask (in band, but loss_mask 0), dropped r=e^1.5 A=1, kept r=1 A=-2]
    # N = 2 kept tokens; or 3 sampled (loss_mask.sum(): the dropped token counts, the off-mask
    # one never does). loss = -(2 * 0.5 + 1 * -2) / N = 1/N; grads = -r*A/N = [-1/N, 0, 0, 2/N]
    logprobs = leaf([[math.log(2.0), 0.0, 1.5, 0.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    loss, m = sao_policy_loss(logprobs, torch.zeros(1, 4), torch.tensor([[0.5, 7.0, 1.0, -2.0]]), mask,
                              mean_over=mean_over)
    loss.backward()
    assert loss.item() == pytest.approx(1 / n)
    assert logprobs.grad.tolist() == [[pytest.approx(-1 / n), 0.0, 0.0, pytest.approx(2 / n)]]
    assert m["sao/kept_frac"] == pytest.approx(2 / 3)
    assert m["sao/ratio_mean"] == pytest.approx((2 + math.exp(1.5) + 1) / 3)  # off-mask token excluded


def test_seq_mean_token_mean_weighs_each_trajectory_alike():
    # row 0: 3 sampled tokens (r = 1 each, A = 1, all kept) -> its own token mean -1; row 1: 1
    # sampled token (r = 2, A = 1, kept) and a dropped one (r = e^2 > 4): sampled 2, sum -2 -> -1;
    # row 2: no sampled token (counts as no trajectory). The loss: (-1 + -1) / 2 = -1, where the
    # batch's kept-token mean is -(3 + 2) / 4. Gradients: -r * A / (n_row * rows):
    # row 0: -1 / 6 each; row 1: -2 / 4 on the kept token, 0 on the dropped one.
    logprobs = leaf([[0.0, 0.0, 0.0], [math.log(2.0), 2.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    loss, _ = sao_policy_loss(logprobs, torch.zeros(3, 3), torch.ones(3, 3), mask, mean_over="seq_mean_token_mean")
    loss.backward()
    assert loss.item() == pytest.approx(-1.0)
    assert logprobs.grad.tolist() == [[pytest.approx(-1 / 6)] * 3, [pytest.approx(-0.5), 0.0, 0.0], [0.0] * 3]
    kept, _ = sao_policy_loss(logprobs.detach(), torch.zeros(3, 3), torch.ones(3, 3), mask)
    assert kept.item() == pytest.approx(-5 / 4)
    # a learner's normalizer (the whole batch's trajectory count) replaces the local one
    split = sum(sao_policy_loss(logprobs.detach()[i:i + 1], torch.zeros(1, 3), torch.ones(1, 3), mask[i:i + 1],
                                normalizer=2, mean_over="seq_mean_token_mean")[0].item() for i in range(3))
    assert split == pytest.approx(-1.0)
    ppo, _ = ppo_clip_loss(logprobs.detach(), logprobs.detach(), torch.ones(3, 3), mask, mean_over="seq_mean_token_mean")
    assert ppo.item() == pytest.approx(-1.0)  # ratio 1 everywhere: each row's mean -1
    with pytest.raises(ValueError, match="mean_over"):
        ppo_clip_loss(logprobs, logprobs, torch.ones(3, 3), mask, mean_over="kept")
    with pytest.raises(ValueError, match="mean_over"):
        sao_policy_loss(logprobs, torch.zeros(3, 3), torch.ones(3, 3), mask, mean_over="tokens")


def test_sao_all_zero_mask_is_zero_loss_with_a_graph():
    logprobs = leaf([[0.3, -0.1]])
    loss, m = sao_policy_loss(logprobs, torch.zeros(1, 2), torch.ones(1, 2), torch.zeros(1, 2))
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    assert logprobs.grad.tolist() == [[0.0, 0.0]]
    assert m["sao/kept_frac"] == 0.0 and m["sao/ratio_mean"] == 0.0


def test_sao_overflowing_ratio_is_dropped_without_nan():
    # logratio 200 -> exp overflows fp32 to inf; so does padding garbage off-mask.
    # keep * inf would be NaN; the loss zeroes dropped log-ratios before exp instead.
    logprobs = leaf([[200.0, 0.0, 300.0]])
    loss, m = sao_policy_loss(logprobs, torch.zeros(1, 3), torch.ones(1, 3), torch.tensor([[1.0, 1.0, 0.0]]))
    loss.backward()
    assert loss.item() == pytest.approx(-1.0)  # only the r=1, A=1 token, the one kept: N = 1
    assert logprobs.grad.tolist() == [[0.0, pytest.approx(-1.0), 0.0]]
    assert m["sao/mask_frac_high"] == 0.5


def test_sao_trajectory_advantages_broadcast():
    logprobs, behaviour, mask = torch.randn(2, 5), torch.randn(2, 5) * 0.3, torch.ones(2, 5)
    adv = torch.tensor([1.5, -0.5])
    a, _ = sao_policy_loss(logprobs, behaviour, adv, mask)
    b, _ = sao_policy_loss(logprobs, behaviour, adv[:, None].expand(2, 5), mask)
    assert a.item() == pytest.approx(b.item())


def test_sao_normalizer_makes_micro_batches_add_up():
    # two micro-batches each divided by the whole batch's N sum to the full batch's loss
    torch.manual_seed(0)
    lp, beh, adv = torch.randn(4, 6) * 0.5, torch.randn(4, 6) * 0.5, torch.randn(4, 6)
    mask = (torch.rand(4, 6) > 0.3).float()
    full, _ = sao_policy_loss(lp, beh, adv, mask)
    n = sao_keep_mask(lp, beh, mask).sum().item()  # the whole batch's kept tokens
    parts = [sao_policy_loss(lp[r], beh[r], adv[r], mask[r], normalizer=n)[0] for r in (slice(0, 1), slice(1, 4))]
    assert sum(p.item() for p in parts) == pytest.approx(full.item(), abs=1e-6)


def test_sao_gradcheck_inside_the_band():
    torch.manual_seed(0)
    lp = (torch.rand(2, 4, dtype=torch.float64) - 0.5).requires_grad_()  # |logratio| < 0.5: inside (0.2, 4)
    beh, adv, mask = torch.zeros(2, 4, dtype=torch.float64), torch.randn(2, 4, dtype=torch.float64), torch.ones(2, 4)
    assert torch.autograd.gradcheck(lambda x: sao_policy_loss(x, beh, adv, mask)[0], (lp,))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 4), st.integers(1, 9))
def test_sao_gradient_property(seed, B, T):
    # for any inputs: grad = -r*A/N on kept tokens and exactly 0 everywhere else
    g = torch.Generator().manual_seed(seed)
    logprobs = (torch.randn(B, T, generator=g) * 2).requires_grad_()
    behaviour = torch.randn(B, T, generator=g)
    adv = torch.randn(B, T, generator=g)
    mask = (torch.rand(B, T, generator=g) > 0.3).float()
    loss, _ = sao_policy_loss(logprobs, behaviour, adv, mask)
    loss.backward()
    r = (logprobs.detach() - behaviour).exp()
    keep = mask.bool() & (r > 0.2) & (r < 4.0)
    n = max(keep.sum().item(), 1.0)
    assert torch.all(logprobs.grad[~keep] == 0)
    torch.testing.assert_close(logprobs.grad[keep], -r[keep] * adv[keep] / n)


# ---------------------------------------------------------------- PPO clip (GRPO baseline)


def test_ppo_clip_by_advantage_sign():
    # r = [0.5, 0.5, 2, 2], A = [1, -1, 1, -1], clip range [0.8, 1.28]
    #   r=0.5 A=+1: pg1 = -0.5, pg2 = -0.8  -> max -0.5 (unclipped, grad -r*A = -0.5)
    #   r=0.5 A=-1: pg1 =  0.5, pg2 =  0.8  -> max  0.8 (clipped, grad 0)
    #   r=2   A=+1: pg1 = -2,   pg2 = -1.28 -> max -1.28 (clipped, grad 0)
    #   r=2   A=-1: pg1 =  2,   pg2 =  1.28 -> max  2 (unclipped, grad -r*A = 2)
    # loss = (-0.5 + 0.8 - 1.28 + 2) / 4 = 0.255; grads / N = [-0.125, 0, 0, 0.5]
    # approx_kl = mean((r-1) - log r) = 2*(-0.5 + ln2) + 2*(1 - ln2) over 4 = 0.25
    half, two = math.log(0.5), math.log(2.0)
    logprobs = leaf([[half, half, two, two]])
    loss, m = ppo_clip_loss(logprobs, torch.zeros(1, 4), torch.tensor([[1.0, -1.0, 1.0, -1.0]]), torch.ones(1, 4))
    loss.backward()
    assert loss.item() == pytest.approx(0.255)
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-0.125, 0.0, 0.0, 0.5]]))
    assert m["ppo/clipfrac"] == 1.0
    assert m["ppo/ratio_mean"] == pytest.approx(1.25)
    assert m["ppo/approx_kl"] == pytest.approx(0.25)


def test_ppo_still_pushes_a_high_ratio_negative_advantage_token_where_sao_drops_it():
    # r = e^1.5 = 4.48 > 1.28, A = -1: PPO's max picks the unclipped -A*r = 4.48 -> grad r/N = e^1.5
    # SAO: r >= 4.0 is outside the band -> grad exactly 0
    ppo_lp, sao_lp = leaf([[1.5]]), leaf([[1.5]])
    args = (torch.zeros(1, 1), torch.tensor([[-1.0]]), torch.ones(1, 1))
    ppo_clip_loss(ppo_lp, *args)[0].backward()
    sao_policy_loss(sao_lp, *args)[0].backward()
    assert ppo_lp.grad.item() == pytest.approx(math.exp(1.5))
    assert sao_lp.grad.item() == 0.0


def test_ppo_masked_tokens_and_empty_mask():
    # off-mask token with a huge logratio (padding) neither contributes nor makes NaN
    logprobs = leaf([[0.0, 500.0]])
    loss, m = ppo_clip_loss(logprobs, torch.zeros(1, 2), torch.ones(1, 2), torch.tensor([[1.0, 0.0]]))
    loss.backward()
    assert loss.item() == pytest.approx(-1.0) and logprobs.grad.tolist() == [[-1.0, 0.0]]
    assert m["ppo/approx_kl"] == 0.0 and m["ppo/clipfrac"] == 0.0
    empty, _ = ppo_clip_loss(leaf([[0.1]]), torch.zeros(1, 1), torch.ones(1, 1), torch.zeros(1, 1))
    assert empty.item() == 0.0 and empty.requires_grad


# ---------------------------------------------------------------- value loss


def test_value_loss_by_hand():
    # sampled: values [0.5, 1], returns [1, 1]; off-mask token ignored
    # mse = ((0.5-1)^2 + 0) / 2 = 0.125; grad = 2(v - R)/N = [-0.5, 0, 0]
    # Var(returns) = 0 -> explained_var reported as 0.0; value/mean = 0.75
    values = leaf([[0.5, 1.0, 9.0]])
    loss, m = value_loss(values, torch.tensor([[1.0, 1.0, -9.0]]), torch.tensor([[1.0, 1.0, 0.0]]))
    loss.backward()
    assert loss.item() == pytest.approx(0.125) and m["value/loss"] == pytest.approx(0.125)
    assert values.grad.tolist() == [[-0.5, 0.0, 0.0]]
    assert m["value/explained_var"] == 0.0 and m["value/mean"] == pytest.approx(0.75)


def test_explained_variance():
    returns, mask = torch.tensor([[0.0, 2.0, 5.0]]), torch.tensor([[1.0, 1.0, 0.0]])
    # perfect predictions: Var(residual) = 0 -> 1
    assert value_loss(returns.clone(), returns, mask)[1]["value/explained_var"] == pytest.approx(1.0)
    # constant prediction 1: residual [-1, 1], Var = 1 = Var(returns [0, 2]) -> 0
    assert value_loss(torch.ones(1, 3), returns, mask)[1]["value/explained_var"] == pytest.approx(0.0)
    # prediction [0, 1]: residual [0, 1], Var = 0.25 -> 1 - 0.25/1 = 0.75
    assert value_loss(torch.tensor([[0.0, 1.0, 0.0]]), returns, mask)[1]["value/explained_var"] == pytest.approx(0.75)
    # empty mask: 0 loss, 0 explained variance, no NaN
    loss, m = value_loss(leaf([[1.0]]), torch.zeros(1, 1), torch.zeros(1, 1))
    assert loss.item() == 0.0 and m["value/explained_var"] == 0.0 and m["value/mean"] == 0.0


def test_value_loss_gradcheck():
    v = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    ret, mask = torch.randn(2, 3, dtype=torch.float64), torch.tensor([[1, 1, 0], [0, 1, 1]])
    assert torch.autograd.gradcheck(lambda x: value_loss(x, ret, mask)[0], (v,))


# ---------------------------------------------------------------- GRPO and running-mean advantages


def test_grpo_advantages():
    # group [1, 0, 0, 1]: mean 0.5, population std 0.5 -> (+-0.5) / 0.5 = [1, -1, -1, 1]
    # group [3, 3, 3, 3]: all equal -> 0 / (0 + eps) = 0
    adv = grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [3.0, 3.0, 3.0, 3.0]]))
    torch.testing.assert_close(adv, torch.tensor([[1.0, -1.0, -1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]), atol=1e-5, rtol=0)
    unscaled = grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), scale=False)
    assert unscaled.tolist() == [[0.5, -0.5, -0.5, 0.5]]
    # Bessel-corrected: std = sqrt(4 * 0.25 / 3) = 0.577 -> +-0.5 / 0.577 = +-0.866 (sqrt(3/4) of the above)
    unbiased = grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), std="unbiased")
    torch.testing.assert_close(unbiased, torch.tensor([[1.0, -1.0, -1.0, 1.0]]) * math.sqrt(3 / 4), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="groups of 2"):
        grpo_advantages(torch.tensor([[1.0]]), std="unbiased")
    with pytest.raises(ValueError, match="std"):
        grpo_advantages(torch.tensor([[1.0, 0.0]]), std="sample")


def test_algo_options_are_checked():
    from training.algos import GRPO, GRPODIS, SAO

    with pytest.raises(ValueError, match="algo.token_mean"):
        SAO(token_mean="tokens")
    with pytest.raises(ValueError, match="algo.token_mean"):
        GRPO(token_mean="kept")  # PPO has no kept tokens
    with pytest.raises(ValueError, match="algo.group_std"):
        GRPODIS(group_std="sample")
    with pytest.raises(ValueError, match="group_size of 2"):
        GRPODIS(group_size=1, group_std="unbiased")
    assert GRPODIS(group_std="unbiased", token_mean="seq_mean_token_mean").token_mean == "seq_mean_token_mean"


def test_running_mean_advantages_and_broadcast():
    # history [1, 0, 0, 0] -> baseline 0.25 -> A = [1 - 0.25, 0 - 0.25]
    adv = running_mean_advantages(torch.tensor([1.0, 0.0]), torch.tensor([1.0, 0.0, 0.0, 0.0]))
    assert adv.tolist() == [0.75, -0.25]
    assert running_mean_advantages(torch.tensor([1.0, 0.0]), torch.tensor([])).tolist() == [1.0, 0.0]
    tokens = broadcast_to_tokens(adv, torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]]))
    assert tokens.tolist() == [[0.75, 0.75, 0.0], [0.0, -0.25, -0.25]]


# ---------------------------------------------------------------- skip-observation GAE

# one row: [action, action, obs, obs, action], reward R = 1, gamma = 1
MASK = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0]])
VALUES = torch.tensor([[0.2, 0.4, 9.0, -9.0, 0.5]])  # observation values are never read


def test_gae_skips_observations_by_hand():
    # lam = 0.5. Walk the sampled tokens backwards (4, then 1, then 0):
    #   t=4 last action: delta = R + 0 - V4 = 1 - 0.5 = 0.5;          A4 = 0.5
    #   t=1 next is t=4: delta = 0 + V4 - V1 = 0.5 - 0.4 = 0.1;        A1 = 0.1 + 0.5 * 0.5 = 0.35
    #   t=0 next is t=1: delta = 0 + V1 - V0 = 0.4 - 0.2 = 0.2;        A0 = 0.2 + 0.5 * 0.35 = 0.375
    # returns = A + V = [0.575, 0.75, 0, 0, 1.0]
    adv, ret = skip_observation_gae(torch.tensor([1.0]), VALUES, MASK, gamma=1.0, lam=0.5)
    torch.testing.assert_close(adv, torch.tensor([[0.375, 0.35, 0.0, 0.0, 0.5]]))
    torch.testing.assert_close(ret, torch.tensor([[0.575, 0.75, 0.0, 0.0, 1.0]]))


def test_adaptive_lambda_and_default_gae():
    # l = 3 sampled tokens -> lam = 1 - 1/(1.5 * 3) = 1 - 1/4.5 = 7/9 = 0.777...
    lam = 7 / 9
    assert adaptive_lambda(MASK).item() == pytest.approx(lam)
    assert adaptive_lambda(torch.zeros(1, 4)).item() == pytest.approx(1 / 3)  # no tokens: l treated as 1
    # same deltas as above [0.2, 0.1, 0.5]: A4 = 0.5, A1 = 0.1 + lam * 0.5, A0 = 0.2 + lam * A1
    a1 = 0.1 + lam * 0.5
    adv, _ = skip_observation_gae(torch.tensor([1.0]), VALUES, MASK)
    torch.testing.assert_close(adv, torch.tensor([[0.2 + lam * a1, a1, 0.0, 0.0, 0.5]]))


def test_gae_lambda_one_returns_are_the_reward():
    # gamma = lam = 1: A_t telescopes to R - V_t, so returns = R at every sampled token, 0 elsewhere
    torch.manual_seed(0)
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0, 1.0, 0.0], [1.0, 0.0, 1.0, 1.0, 1.0, 1.0]])
    rewards = torch.tensor([1.0, -0.5])
    _, ret = skip_observation_gae(rewards, torch.randn(2, 6), mask, gamma=1.0, lam=1.0)
    torch.testing.assert_close(ret, rewards[:, None] * mask)


def test_gae_discounts_once_across_an_observation():
    # mask [1, 0, 0, 1], V = 0, R = 1, gamma = 0.5, lam = 1
    #   t=3: A = 1; t=0: delta = 0 + 0.5 * V3 - V0 = 0, A0 = 0 + 0.5 * 1 * 1 = 0.5 (one step, not three)
    adv, _ = skip_observation_gae(torch.tensor([1.0]), torch.zeros(1, 4), torch.tensor([[1.0, 0.0, 0.0, 1.0]]), 0.5, 1.0)
    assert adv.tolist() == [[0.5, 0.0, 0.0, 1.0]]


def test_gae_per_row_lambda_padding_and_no_grad():
    values = torch.randn(3, 5, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    rewards, lam = torch.tensor([1.0, 0.0, 2.0]), torch.tensor([0.3, 0.9, 0.5])
    adv, ret = skip_observation_gae(rewards, values, mask, lam=lam)
    assert not adv.requires_grad and not ret.requires_grad
    for b in range(3):  # a [B] lambda is the same as one call per row
        a_b, _ = skip_observation_gae(rewards[b : b + 1], values[b : b + 1], mask[b : b + 1], lam=lam[b].item())
        torch.testing.assert_close(adv[b : b + 1], a_b)
    assert torch.all(adv[mask == 0] == 0) and torch.all(ret[mask == 0] == 0)  # incl. the empty row


def plain_gae(reward: float, values: list[float], gamma: float, lam: float) -> list[float]:
    """cleanrl's GAE on a sequence with no observations, terminal reward on the last step."""
    adv, next_adv, next_value = [0.0] * len(values), 0.0, 0.0
    for t in reversed(range(len(values))):
        r = reward if t == len(values) - 1 else 0.0
        delta = r + gamma * next_value - values[t]
        next_adv = adv[t] = delta + gamma * lam * next_adv
        next_value = values[t]
    return adv


@settings(max_examples=60, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=12), st.floats(0.5, 1.0), st.floats(0.0, 1.0), st.floats(-2, 2))
def test_gae_equals_plain_gae_on_the_sampled_tokens(mask_bits, gamma, lam, reward):
    # skipping observations == running ordinary GAE on the sequence of sampled tokens alone
    values = torch.linspace(-1, 1, len(mask_bits))[None]
    mask = torch.tensor([mask_bits], dtype=torch.float32)
    adv, _ = skip_observation_gae(torch.tensor([reward]), values, mask, gamma, lam)
    kept = values[mask.bool()].tolist()
    expected = torch.tensor(plain_gae(reward, kept, gamma, lam), dtype=torch.float32)
    torch.testing.assert_close(adv[mask.bool()], expected, atol=1e-5, rtol=1e-5)


def test_running_mean_baseline_per_prompt_and_global():
    """The paper's running mean: per prompt, the mean of that prompt's last 8 rewards; globally,
    of the last W rewards of any prompt. A prompt not seen yet has baseline 0."""
    from training.algos import SAO

    per_prompt = SAO(baseline="running_mean", baseline_window=2)
    per_prompt.observe_rewards(torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([7, 9, 7, 7]))  # prompt 7 keeps its last 2
    state = per_prompt.state_dict()
    resumed = SAO(baseline="running_mean", baseline_window=2)
    resumed.load_state_dict(state)
    for algo in (per_prompt, resumed):
        adv, _ = algo.advantages(_rows([0.0, 1.0, 1.0], [7, 9, 5]), None)
        assert adv[:, 0].tolist() == [-1.0, 1.0, 1.0]  # 0 - mean(1, 1); 1 - 0; 1 - (nothing yet: 0)
    globally = SAO(baseline="running_mean", baseline_scope="global", baseline_window=3)
    globally.observe_rewards(torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([7, 9, 7, 7]))  # last 3: 0, 1, 1
    adv, _ = globally.advantages(_rows([0.0, 1.0], [7, 5]), None)
    assert torch.allclose(adv[:, 0], torch.tensor([-2 / 3, 1 / 3]))
    with pytest.raises(ValueError, match="baseline_scope"):
        SAO(baseline="running_mean", baseline_scope="task")


def _rows(rewards, keys):
    from training.batch import Batch

    n = len(rewards)
    z = torch.zeros(n, 2)
    return Batch(z.long(), z.long(), z.long(), torch.ones(n, 2), z, z.long(), torch.tensor(rewards), torch.arange(n),
                 torch.tensor(keys))


def test_gae_over_long_rows_in_blocks_equals_plain_gae_row_by_row():
    # the blocked computation crosses several 64-token blocks: rows of up to 300 positions, about
    # half sampled (in runs, as turns are), each row its own length-adaptive lambda
    g = torch.Generator().manual_seed(0)
    B, T = 5, 300
    mask = (torch.rand(B, T, generator=g) < 0.5).float()
    mask[3] = 0.0  # a row with no sampled token
    mask[4, :] = 0.0
    mask[4, 7] = 1.0  # and one with a single one
    values = torch.randn(B, T, generator=g)
    rewards = torch.tensor([1.0, 0.0, -0.5, 1.0, 2.0])
    for gamma, lam in ((1.0, None), (0.99, 0.95)):
        adv, ret = skip_observation_gae(rewards, values, mask, gamma, lam)
        lams = adaptive_lambda(mask) if lam is None else torch.full((B,), lam)
        for b in range(B):
            kept = values[b][mask[b].bool()].tolist()
            expected = torch.tensor(plain_gae(rewards[b].item(), kept, gamma, lams[b].item()), dtype=torch.float32)
            torch.testing.assert_close(adv[b][mask[b].bool()], expected, atol=1e-5, rtol=1e-5)
        assert (adv[mask == 0] == 0).all() and (ret[mask == 0] == 0).all()
        torch.testing.assert_close(ret[mask.bool()], (adv + values)[mask.bool()])
