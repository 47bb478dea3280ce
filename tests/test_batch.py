"""Packing trajectories into position-aligned tensors, and token-budget micro-batches."""

import torch

from agent.trajectory import Trajectory
from training.batch import micro_batches, pack


def make(prompt, sampled, obs, sampled2, version=2, reward=1.0):
    t = Trajectory("x", prompt_ids=prompt, reward=reward)
    t.append_sampled(sampled, [-0.5] * len(sampled), version)
    t.append_observation(obs)
    t.append_sampled(sampled2, [-0.25] * len(sampled2), version + 1)
    return t


def test_pack_aligns_targets_masks_and_logprobs_by_position():
    # sequence: 10 11 | 20 21 | 30 | 40   (prompt | sampled | tool output | sampled)
    b = pack([make([10, 11], [20, 21], [30], [40]), make([10], [20], [], [])], pad_id=0)
    assert b.input_ids.tolist() == [[10, 11, 20, 21, 30, 40], [10, 20, 0, 0, 0, 0]]
    assert b.targets.tolist() == [[11, 20, 21, 30, 40, 0], [20, 0, 0, 0, 0, 0]]
    # position 1 predicts 20, position 2 predicts 21, position 3 predicts 30 (tool), position 4 predicts 40
    assert b.loss_mask.tolist() == [[0, 1, 1, 0, 1, 0], [1, 0, 0, 0, 0, 0]]
    assert b.behaviour_logprobs.tolist()[0] == [0, -0.5, -0.5, 0, -0.25, 0]
    assert b.policy_version.tolist()[0] == [-1, 2, 2, -1, 3, -1]
    assert b.attention_mask.sum(1).tolist() == [6, 2] and b.num_sampled == 4
    # every masked-in target is exactly a sampled token
    assert b.targets[b.loss_mask.bool()].tolist() == [20, 21, 40, 20]


def test_micro_batches_respect_the_token_budget():
    trajs = [make([1] * n, [2], [], []) for n in (3, 3, 7, 2)]
    b = pack(trajs)
    parts = list(micro_batches(b, token_budget=8))
    assert [len(p) for p in parts] == [2, 1, 1]
    assert [p.input_ids.shape[1] for p in parts] == [4, 8, 3]
    assert sum(p.num_sampled for p in parts) == b.num_sampled
    assert torch.equal(parts[0].input_ids, b.input_ids[:2, :4])
