"""Sequence packing for megatron: a micro-batch's rows laid end to end in one row, no padding
to the longest. Attention stays inside each sequence: with Transformer Engine through
`PackedSeqParams` (THD, cumulative lengths); with megatron's local attention through a
block-diagonal causal mask. Position ids restart at each sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from training.batch import Batch


def token_budget_parts(lengths: list[int], rows: list[int], budget: int) -> list[list[int]]:
    """`rows` in order, grouped so each group's *summed* length stays within `budget` (a
    longer row forms its own group). At least one (possibly empty) group, so a rank with no
    rows still runs one micro-batch and joins the gradient reduction."""
    parts: list[list[int]] = []
    cur: list[int] = []
    total = 0
    for r in rows:
        if cur and total + lengths[r] > budget:
            parts.append(cur)
            cur, total = [], 0
        cur.append(r)
        total += lengths[r]
    if cur or not parts:
        parts.append(cur)
    return parts


@dataclass
class Packed:
    rows: list[int]  # batch row of each packed sequence
    lengths: list[int]  # their token counts
    input_ids: torch.Tensor  # [1, T] long
    position_ids: torch.Tensor  # [1, T] long
    targets: torch.Tensor  # [1, T] long: the token each position predicts (pad past a sequence)
    attention_mask: torch.Tensor | None  # [1, 1, T, T] bool, True = masked (local attention)
    packed_seq_params: object | None  # megatron PackedSeqParams (Transformer Engine)

    def unpack(self, flat: torch.Tensor) -> torch.Tensor:
        """[1, T] (or [T]) per-token values -> [len(rows), L] rows, right-padded with zeros, L the
        longest of these rows: the layout of `batch.select(rows)`. Differentiable."""
        flat = flat.reshape(-1)
        L = max(self.lengths, default=1)
        row_idx = torch.cat([torch.full((n,), i, dtype=torch.long) for i, n in enumerate(self.lengths)]) \
            if self.lengths else torch.zeros(0, dtype=torch.long)
        col_idx = torch.cat([torch.arange(n) for n in self.lengths]) if self.lengths else torch.zeros(0, dtype=torch.long)
        out = flat.new_zeros(len(self.lengths), L)
        return out.index_put((row_idx.to(flat.device), col_idx.to(flat.device)), flat[: int(sum(self.lengths))])


def pack_rows(batch: Batch, rows: list[int], multiple_of: int = 1, thd: bool = False, device="cpu") -> Packed:
    """The rows of `batch` packed into one sequence, padded at the end to a multiple of
    `multiple_of` (tensor parallel size, for sequence parallel). No rows: one pad token."""
    lengths = [int(n) for n in batch.attention_mask[rows].sum(1).tolist()] if rows else []
    ids = [batch.input_ids[r, :n].cpu() for r, n in zip(rows, lengths)]
    tgt = [batch.targets[r, :n].cpu() for r, n in zip(rows, lengths)]
    pos = [torch.arange(n) for n in lengths]
    total = sum(lengths)
    padded = max(multiple_of, -(-max(total, 1) // multiple_of) * multiple_of)
    pad = padded - total
    if pad:
        ids.append(torch.zeros(pad, dtype=torch.long))
        tgt.append(torch.zeros(pad, dtype=torch.long))
        pos.append(torch.arange(pad))
    seqs = lengths + ([pad] if pad else [])
    input_ids = torch.cat(ids)[None].to(device)
    position_ids = torch.cat(pos)[None].to(device)
    targets = torch.cat(tgt)[None].to(device)
    if thd:
        from megatron.core.packed_seq_params import PackedSeqParams

        cu = torch.tensor([0] + list(torch.tensor(seqs).cumsum(0).tolist()), dtype=torch.int32, device=device)
        params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,
                                 max_seqlen_q=max(seqs), max_seqlen_kv=max(seqs))
        return Packed(list(rows), lengths, input_ids, position_ids, targets, None, params)
    # block-diagonal causal: a token sees the earlier tokens of its own sequence only
    seq_id = torch.cat([torch.full((n,), i) for i, n in enumerate(seqs)])
    allowed = (seq_id[:, None] == seq_id[None, :]) & torch.ones(padded, padded, dtype=torch.bool).tril()
    return Packed(list(rows), lengths, input_ids, position_ids, targets, (~allowed)[None, None].to(device), None)
