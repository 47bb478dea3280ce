"""`Batch`: trajectories packed into tensors for one optimizer step, and token-budget
micro-batches of it.

Alignment: for a sequence s = prompt_ids + completion_ids, position i's logits (and the
critic's value) are for predicting s[i + 1]. Every per-token field is therefore laid out by
*position*: `targets[i] = s[i + 1]`, and `loss_mask[i] = 1` exactly when s[i + 1] is a token
the engine sampled. The value at position i is the value of the state in which s[i + 1] is
about to be sampled.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields
from typing import Iterator

import torch

from agent.trajectory import Trajectory


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, L] long, right-padded with pad_id
    attention_mask: torch.Tensor  # [B, L] long, 1 on real tokens
    targets: torch.Tensor  # [B, L] long, input_ids shifted left by one (pad at the end)
    loss_mask: torch.Tensor  # [B, L] float, 1 where targets[i] was sampled by the engine
    behaviour_logprobs: torch.Tensor  # [B, L] float, the engine's logprob of targets[i]; 0 off-mask
    policy_version: torch.Tensor  # [B, L] long, the version that sampled targets[i]; -1 off-mask
    rewards: torch.Tensor  # [B] float
    group_ids: torch.Tensor  # [B] long, rollouts of the same prompt share an id (GRPO)
    prompt_keys: torch.Tensor  # [B] long, a stable id of each row's task (source and instance id), across batches

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum())

    @property
    def num_sampled(self) -> int:
        return int(self.loss_mask.sum())

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, rows: list[int]) -> "Batch":
        """The sub-batch of `rows`, trimmed to its own longest sequence."""
        idx = torch.tensor(rows, dtype=torch.long)
        length = int(self.attention_mask[idx].sum(1).max())
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)[idx]
            out[f.name] = value[:, :length] if value.dim() == 2 else value
        return Batch(**out)


def pack(trajectories: list[Trajectory], pad_id: int = 0, group_ids: list[int] | None = None) -> Batch:
    """Pack trajectories into one right-padded Batch (see the module docstring for alignment)."""
    assert trajectories, "pack needs at least one trajectory"
    length = max(t.num_tokens for t in trajectories)
    B = len(trajectories)
    input_ids = torch.full((B, length), pad_id, dtype=torch.long)
    attention = torch.zeros((B, length), dtype=torch.long)
    targets = torch.full((B, length), pad_id, dtype=torch.long)
    loss_mask = torch.zeros((B, length))
    behaviour = torch.zeros((B, length))
    version = torch.full((B, length), -1, dtype=torch.long)
    for b, t in enumerate(trajectories):
        t.check()
        seq = torch.tensor(t.prompt_ids + t.completion_ids, dtype=torch.long)
        n, p = len(seq), len(t.prompt_ids)
        assert p >= 1, f"{t.instance_id}: a trajectory needs a prompt"
        input_ids[b, :n] = seq
        attention[b, :n] = 1
        targets[b, : n - 1] = seq[1:]
        # completion token j sits at sequence index p + j and is predicted from position p + j - 1
        span = slice(p - 1, p - 1 + len(t.completion_ids))
        loss_mask[b, span] = torch.tensor(t.loss_mask, dtype=torch.float)
        behaviour[b, span] = torch.tensor(t.logprobs, dtype=torch.float)
        version[b, span] = torch.tensor(t.policy_version, dtype=torch.long)
    rewards = torch.tensor([t.reward for t in trajectories], dtype=torch.float)
    groups = torch.tensor(group_ids if group_ids is not None else list(range(B)), dtype=torch.long)
    keys = torch.tensor([prompt_key(t) for t in trajectories], dtype=torch.long)
    return Batch(input_ids, attention, targets, loss_mask, behaviour, version, rewards, groups, keys)


def prompt_key(t: Trajectory) -> int:
    """The same int64 for every rollout of one task of one source, in any batch or process."""
    name = f"{t.info.get('source', '')}/{t.instance_id}".encode()
    return int.from_bytes(hashlib.blake2b(name, digest_size=8).digest(), "little", signed=True)


def micro_batch_rows(batch: Batch, token_budget: int) -> list[list[int]]:
    """Consecutive rows grouped so that rows x padded length stays within `token_budget`
    (a single longer row still forms its own micro-batch)."""
    lengths = batch.attention_mask.sum(1).tolist()
    groups: list[list[int]] = []
    rows: list[int] = []
    longest = 0
    for i, n in enumerate(lengths):
        if rows and max(longest, n) * (len(rows) + 1) > token_budget:
            groups.append(rows)
            rows, longest = [], 0
        rows.append(i)
        longest = max(longest, n)
    if rows:
        groups.append(rows)
    return groups


def micro_batches(batch: Batch, token_budget: int) -> Iterator[Batch]:
    for rows in micro_batch_rows(batch, token_budget):
        yield batch.select(rows)
