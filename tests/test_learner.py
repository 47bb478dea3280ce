"""The torch learner on the real tiny model: warm-up, frozen attention, accumulation, checkpoints."""

import random

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

from agent.tiny_model import build_tiny_model
from agent.trajectory import Trajectory
from training.algos import GRPO, GRPODIS, SAO
from training.batch import pack
from training.losses import sao_keep_mask, sao_policy_loss
from training.learners.torch import TorchLearner


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "m"))


def traj(reward, n=12, behaviour=-8.3):
    t = Trajectory("x", prompt_ids=list(range(5, 15)), reward=reward)
    t.append_sampled(list(range(30, 30 + n)), [behaviour] * n, 0)
    t.append_observation([7, 8, 9])
    t.append_sampled([40, 41], [behaviour] * 2, 0)
    return t


BATCH = [traj(1.0), traj(0.0, 20), traj(1.0, 5), traj(0.0, 8)]


def params(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_critic_warmup_then_policy_updates(tiny):
    learner = TorchLearner(tiny, SAO(critic_warmup_steps=2, lr_policy=1e-3, lr_critic=1e-3))
    p0, c0 = params(learner.policy), params(learner.critic)
    m = learner.step(BATCH)
    assert learner.version == 0 and "sao/loss" not in m and "value/loss" in m
    # no update, but the health of the batch is logged all the same (every step has these keys)
    assert {"sao/mask_frac_low", "sao/mask_frac_high", "sao/ratio_mean"} <= set(m)
    # every token was sampled by version 0, the weights the learner holds: all of them are fresh
    assert m["sao/logprob_mismatch_fresh"] == pytest.approx(m["sao/logprob_mismatch_pre"])
    assert all(torch.equal(p0[k], v) for k, v in params(learner.policy).items())  # warm-up: policy untouched
    c1 = params(learner.critic)
    assert any(not torch.equal(c0[k], c1[k]) for k in c0 if "mlp" in k)  # MLPs train
    assert all(torch.equal(c0[k], c1[k]) for k in c0 if "self_attn" in k)  # attention frozen
    learner.step(BATCH)
    m = learner.step(BATCH)
    assert learner.version == 1 and {"sao/mask_frac_low", "sao/mask_frac_high", "value/explained_var"} <= set(m)
    assert any(not torch.equal(p0[k], v) for k, v in params(learner.policy).items())


def test_critic_warmup_as_a_learning_rate_ramp(tiny):
    """algo.critic_warmup=lr: the policy updates from the first step; the critic's learning
    rate climbs lr/N, 2 lr/N, ... to lr_critic over the N warm-up steps, then stays."""
    learner = TorchLearner(tiny, SAO(critic_warmup_steps=4, critic_warmup="lr", lr_policy=1e-3, lr_critic=1e-3))
    lrs = []
    for _ in range(5):
        m = learner.step(BATCH)
        lrs.append(m["value/lr"])
    assert learner.version == 5 and "sao/loss" in m
    assert lrs == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])
    with pytest.raises(ValueError, match="critic_warmup"):
        SAO(critic_warmup="cosine")


def test_running_mean_baseline_has_no_critic_to_warm_up(tiny):
    learner = TorchLearner(tiny, SAO(baseline="running_mean", critic_warmup_steps=10, lr_policy=1e-3))
    m = learner.step(BATCH)
    assert learner.critic is None and learner.version == 1 and "sao/loss" in m and "value/loss" not in m


def test_micro_batches_accumulate_to_the_full_batch_update(tiny):
    a = TorchLearner(tiny, SAO(critic_warmup_steps=0, lr_policy=1e-3), micro_batch_tokens=10_000)
    b = TorchLearner(tiny, SAO(critic_warmup_steps=0, lr_policy=1e-3), micro_batch_tokens=40)
    b.critic.load_state_dict(a.critic.state_dict())  # the value heads start random: share them
    ma, mb = a.step(BATCH), b.step(BATCH)
    assert abs(ma["sao/loss"] - mb["sao/loss"]) < 1e-5 and abs(ma["value/loss"] - mb["value/loss"]) < 1e-4
    pa, pb = params(a.policy), params(b.policy)
    assert max((pa[k] - pb[k]).abs().max().item() for k in pa) < 1e-5


def test_grpo_step_and_engine_weights(tiny):
    # one optimizer step: pi_old is the weights it starts from, so the ratio is exactly 1
    learner = TorchLearner(tiny, GRPO(group_size=2, lr_policy=1e-3, policy_minibatches=1))
    assert learner.critic is None
    m = learner.step(BATCH, group_ids=[0, 0, 1, 1])
    assert learner.version == 1 and m["ppo/ratio_mean"] == pytest.approx(1.0)
    # four, one row each, all against the same pi_old: after the first the ratio moves (and the
    # clip can bind); still one new policy version for the engine
    learner = TorchLearner(tiny, GRPO(group_size=2, lr_policy=1e-2, policy_minibatches=4))
    m = learner.step(BATCH, group_ids=[0, 0, 1, 1])
    assert learner.version == 1 and abs(m["ppo/ratio_mean"] - 1.0) > 1e-3 and m["ppo/clipfrac"] > 0
    names = [n for n, _ in learner.state_dict_for_engine()]
    assert "lm_head.weight" in names and "model.embed_tokens.weight" in names


def test_grpo_dis_takes_group_advantages_and_sao_s_mask_against_the_sampler(tiny):
    learner = TorchLearner(tiny, GRPODIS(group_size=2, lr_policy=1e-3))
    assert learner.critic is None
    p0 = params(learner.policy)
    m = learner.step(BATCH, group_ids=[0, 0, 1, 1])
    assert learner.version == 1 and "ppo/clipfrac" not in m and "value/loss" not in m
    assert m["sao/kept_frac"] == pytest.approx(1.0) and any(not torch.equal(p0[k], v) for k, v in params(learner.policy).items())
    # the sampler gave every token logprob -1 (the learner's are near -8.3): each ratio is far
    # below 1 - eps_low, every token is dropped, and the policy does not move
    learner = TorchLearner(tiny, GRPODIS(group_size=2, lr_policy=1e-3))
    p0 = params(learner.policy)
    far = [traj(1.0, behaviour=-1.0), traj(0.0, 20, behaviour=-1.0), traj(1.0, 5, behaviour=-1.0), traj(0.0, 8, behaviour=-1.0)]
    m = learner.step(far, group_ids=[0, 0, 1, 1])
    assert m["sao/mask_frac_low"] == pytest.approx(1.0) and m["sao/kept_frac"] == 0.0
    assert all(torch.equal(p0[k], v) for k, v in params(learner.policy).items())


def test_save_and_load_round_trip(tiny, tmp_path):
    learner = TorchLearner(tiny, SAO(critic_warmup_steps=0, lr_policy=1e-3))
    learner.step(BATCH)
    learner.save(tmp_path / "ckpt")
    policy = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt" / "policy")
    critic = AutoModelForTokenClassification.from_pretrained(tmp_path / "ckpt" / "critic")
    assert torch.equal(policy.lm_head.weight, learner.policy.lm_head.weight)
    assert torch.equal(critic.score.weight, learner.critic.score.weight)
    other = TorchLearner(tiny, SAO(critic_warmup_steps=0, lr_policy=1e-3))
    other.load(tmp_path / "ckpt")
    assert other.version == learner.version == 1 and other.step_count == 1
    # the same next step from the same state gives the same weights
    learner.step(BATCH)
    other.step(BATCH)
    pa, pb = params(learner.policy), params(other.policy)
    assert max((pa[k] - pb[k]).abs().max().item() for k in pa) < 1e-6


def test_shard_rows_balances_tokens_and_covers_every_row():
    from training.collectives import shard_rows

    # longest first, each to the least-loaded rank: 10 -> r0, 8 -> r1, 5 -> r1 (8 < 10), 3 -> r0 (10 < 13)
    assert shard_rows([5, 10, 3, 8], 0, 2) == [1, 2] and shard_rows([5, 10, 3, 8], 1, 2) == [0, 3]
    assert shard_rows([5, 10], 0, 1) == [0, 1]
    assert [shard_rows([4, 4], r, 3) for r in range(3)] == [[0], [1], []]  # a rank may get no rows


def _replica(rank, world, init_file, tiny, batch, out, minibatches, options):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    learner = TorchLearner(tiny, SAO(critic_warmup_steps=0, lr_policy=1e-3, lr_critic=1e-3,
                                     policy_minibatches=minibatches, **options), micro_batch_tokens=40)
    metrics = [learner.step(batch) for _ in range(2)]
    torch.save({"policy": params(learner.policy), "critic": params(learner.critic), "metrics": metrics}, f"{out}.{rank}")
    dist.destroy_process_group()


SEQ_AFTER = {"token_mean": "seq_mean_token_mean", "values_after_critic": True}


@pytest.mark.parametrize("world,batch,minibatches,options", [(2, BATCH + [traj(1.0, 3)], 1, {}), (3, BATCH[:2], 1, {}),
                                                             (2, BATCH + [traj(1.0, 3)], 2, SEQ_AFTER)],
                         ids=["2ranks", "idle-rank", "2ranks-2minibatches-seqmean-after"])
def test_data_parallel_ranks_step_exactly_as_one_process(tiny, tmp_path, world, batch, minibatches, options):
    import torch.multiprocessing as mp

    out = tmp_path / "state"
    mp.spawn(_replica, args=(world, tmp_path / "init", tiny, batch, str(out), minibatches, options), nprocs=world)
    one = TorchLearner(tiny, SAO(critic_warmup_steps=0, lr_policy=1e-3, lr_critic=1e-3, policy_minibatches=minibatches,
                                 **options), micro_batch_tokens=40)
    expected = [one.step(batch) for _ in range(2)]
    states = [torch.load(f"{out}.{r}") for r in range(world)]
    for part in ("policy", "critic"):
        ref = params(one.policy if part == "policy" else one.critic)
        for state in states:  # every replica equals the one-process learner (so each other)
            assert max((state[part][k] - ref[k]).abs().max().item() for k in ref) < 1e-5
    for got, want in zip(states[0]["metrics"], expected):
        assert got.keys() == want.keys()
        for k in ("sao/loss", "sao/mask_frac_low", "value/loss", "policy/grad_norm", "value/explained_var"):
            assert abs(got[k] - want[k]) < 1e-4 * max(1.0, abs(want[k])), k


def test_critic_learns_per_token_values_with_frozen_attention(tiny):
    # The sampled token d decides the reward (d = 100 -> 1, d = 200 -> 0). Monte-Carlo targets
    # (critic lambda 1, gamma 1) are the reward at every sampled token. The three positions that
    # predict 50, 51 and d cannot know it (their target variance stays: 3 of 6 tokens); the three
    # after d can see it. So a perfect critic explains 1 - 3/6 = 0.5 of the variance, and one
    # that only learns the mean (a running-mean baseline) explains 0.
    rng = random.Random(0)

    def decided(d):
        t = Trajectory("x", prompt_ids=[5, 6, 7, 8, 9, 10], reward=1.0 if d == 100 else 0.0)
        t.append_sampled([50, 51, d, 60, 61, 62], [-5.0] * 6, 0)
        return t

    learner = TorchLearner(tiny, SAO(critic_warmup_steps=10**6, lr_critic=1e-3))  # critic only, attention frozen
    for _ in range(30):
        m = learner.step([decided(rng.choice([100, 200])) for _ in range(16)])
    assert m["value/explained_var"] > 0.35, m
    with torch.no_grad():
        batch = learner._to(pack([decided(100), decided(200)], pad_id=0))
        values = learner._values(batch)
    after_d = batch.loss_mask.bool() & (torch.arange(batch.input_ids.shape[1]) >= 8)  # positions that have seen d
    high, low = values[0][after_d[0]], values[1][after_d[1]]
    assert (high > low + 0.5).all(), (high, low)


@pytest.mark.parametrize("token_mean", ["kept", "sampled", "seq_mean_token_mean"])
def test_policy_loss_is_the_whole_batchs_mean_in_micro_batches(tiny, token_mean):
    # half the sampled tokens carry a behaviour logprob of 0 (r = p_theta, far below the band's
    # 0.2: dropped low), half -8.3 (about the tiny model's own: kept). In 40-token micro-batches
    # the learner's loss must equal the loss over the whole batch at once: a mean over its kept
    # tokens, its sampled tokens, or its trajectories' own token means (running-mean baseline:
    # no critic, advantages = rewards on the first step)
    def mixed(reward, n):
        t = Trajectory("x", prompt_ids=list(range(5, 15)), reward=reward)
        t.append_sampled(list(range(30, 30 + n)), [0.0 if i % 2 else -8.3 for i in range(n)], 0)
        return t

    trajectories = [mixed(1.0, 12), mixed(0.0, 20), mixed(1.0, 6)]
    learner = TorchLearner(tiny, SAO(baseline="running_mean", lr_policy=1e-3, token_mean=token_mean),
                           micro_batch_tokens=40)
    batch = pack(trajectories)
    with torch.no_grad():
        logprobs = learner._logprobs(batch)
    advantages = batch.rewards[:, None] * batch.loss_mask
    expected, _ = sao_policy_loss(logprobs, batch.behaviour_logprobs, advantages, batch.loss_mask,
                                  mean_over=token_mean)
    kept = sao_keep_mask(logprobs, batch.behaviour_logprobs, batch.loss_mask)
    assert 0 < kept.sum() < batch.loss_mask.sum()  # some dropped, some kept
    m = learner.step(trajectories)
    assert m["sao/loss"] == pytest.approx(expected.item(), rel=1e-4)
    assert m["sao/kept_frac"] == pytest.approx(float(kept.sum() / batch.loss_mask.sum()), rel=1e-4)


@pytest.mark.parametrize("algo", ["sao_sampled", "sao_seq_mean", "grpo"])
def test_pi_old_from_the_update_s_own_forward_changes_nothing_but_the_pass(tiny, algo):
    """With one policy mini-batch and a mean that does not count kept tokens, the learner takes
    pi_old from its update's own forward instead of a pass of its own: the same update, the same
    metrics, one forward fewer (no policy_forward phase)."""
    def make():
        if algo == "grpo":
            return TorchLearner(tiny, GRPO(group_size=2, lr_policy=1e-3, policy_minibatches=1), micro_batch_tokens=40)
        mean = "sampled" if algo == "sao_sampled" else "seq_mean_token_mean"
        return TorchLearner(tiny, SAO(critic_warmup_steps=0, lr_policy=1e-3, token_mean=mean), micro_batch_tokens=40)

    saved, apart = make(), make()
    apart._pi_old_first = lambda updates_policy: True  # the separate pass, as with a mean over kept tokens
    if saved.critic is not None:
        apart.critic.load_state_dict(saved.critic.state_dict())
    groups = [0, 0, 1, 1] if algo == "grpo" else None
    for _ in range(2):
        ms, ma = saved.step(BATCH, groups), apart.step(BATCH, groups)
        ps, pa = params(saved.policy), params(apart.policy)
        assert max((ps[k] - pa[k]).abs().max().item() for k in ps) < 1e-6
        for key, value in ma.items():
            if not key.startswith("time/"):
                assert ms[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
        assert "time/learner/policy_forward_s" in ma and "time/learner/policy_forward_s" not in ms


def test_process_group_is_made_with_the_rank_timeout(monkeypatch):
    """torchrun's followers wait in a broadcast from start-up to rank 0's first command (engine
    start, datasets, a batch of rollouts): the group takes `local.rank_timeout_s`, not NCCL's
    10-minute default, which would kill them first. (init_process_group is replaced: this test
    checks what it is given; the torchrun tests run the real one.)"""
    from datetime import timedelta

    import torch.distributed as dist

    from training import collectives

    given = {}
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: given.update(backend=backend, **kw))
    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    monkeypatch.setattr(collectives, "current", lambda: collectives.Rank())
    collectives.init_from_env(14400)
    assert given == {"backend": "gloo", "timeout": timedelta(hours=4)}
    given.clear()
    collectives.init_from_env()
    assert given == {"backend": "gloo"}  # torch's own default


def test_values_after_critic_gives_advantages_from_the_updated_critic(tiny, monkeypatch):
    """algo.values_after_critic: the K critic updates first, then a second pass of the critic,
    and the advantages the policy update uses are the algorithm's on those values."""
    seen = []
    learner = TorchLearner(tiny, SAO(critic_warmup_steps=0, lr_policy=1e-3, lr_critic=1e-2, values_after_critic=True))
    real = learner.algo.advantages

    def spy(batch, values):
        seen.append(values.clone())
        return real(batch, values)

    monkeypatch.setattr(learner.algo, "advantages", spy)
    used = []
    real_update = learner._policy_update
    monkeypatch.setattr(learner, "_policy_update", lambda b, adv, old, **kw: used.append(adv.clone()) or real_update(b, adv, old, **kw))
    m = learner.step(BATCH)
    batch = learner._to(pack(BATCH))
    with torch.no_grad():  # the critic's values now (the policy update does not touch it)
        now = learner._values(batch) * batch.loss_mask
    assert len(seen) == 2 and not torch.allclose(seen[0], seen[1])  # before and after the critic moved
    assert torch.allclose(seen[1][:, : now.shape[1]] * batch.loss_mask, now, atol=1e-5)
    assert torch.equal(used[0], real(batch, seen[1])[0])
    assert "value/explained_var_after" in m and "value/explained_var" in m
