"""The stream: rollouts enter as they finish; the learner takes a batch by count or token budget.

Each token carries the policy version that sampled it, so a rollout's staleness is the
learner's current version minus the oldest version among its sampled tokens. A staleness
bound with a policy (`drop` or `keep`, both counted) decides what is too old. Backpressure:
at most `max_in_flight` rollouts are started and not yet taken by the learner, none while
starts are held (a take with `hold`, until `open_starts`: the learner steps, and a rollout
started meanwhile would be too old when it could be taken), and after `open_starts(n)` only n
more (the next batch, when a rollout that misses its take is too old for the one after).

Everything here runs on one asyncio event loop (rollout workers push from it; the learner
awaits `take`), so no locks are needed beyond asyncio's.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from dataclasses import asdict
from typing import Any

from agent.trajectory import Trajectory


def staleness(traj: Trajectory, current_version: int) -> int:
    """Versions between the learner now and the oldest policy that sampled a token of `traj`."""
    versions = [v for v, m in zip(traj.policy_version, traj.loss_mask) if m]
    return current_version - min(versions) if versions else 0


class RolloutStream:
    def __init__(self, max_staleness: int = 4, stale_policy: str = "drop", max_in_flight: int = 8):
        if stale_policy not in ("drop", "keep"):
            raise ValueError(f"stale_policy must be 'drop' or 'keep', got {stale_policy!r}")
        self.max_staleness = max_staleness
        self.stale_policy = stale_policy
        self.max_in_flight = max_in_flight
        self._queue: deque[list[Trajectory]] = deque()  # groups, in arrival order
        self._changed = asyncio.Condition()
        self._in_flight = 0  # started, not yet taken (running or queued)
        self._held = False  # no rollout starts (from a take with hold to open_starts)
        self._starts_left: int | None = None  # from open_starts(n): starts allowed until the next call
        self.counts = Counter()  # pushed, taken, dropped_stale, kept_stale, started
        self.staleness_hist: Counter = Counter()  # of taken rollouts
        self.consumed_ids: set[str] = set()  # rollout keys the learner has trained on

    # -- rollout workers --------------------------------------------------------------------
    async def reserve(self, n: int = 1) -> None:
        """Wait for room to start `n` more rollouts (a group: all or none, so workers holding
        parts of groups never wait on each other), and for starts not to be held."""
        async with self._changed:
            await self._changed.wait_for(lambda: not self._held and self._in_flight + n <= self.max_in_flight
                                         and (self._starts_left is None or n <= self._starts_left))
            self._in_flight += n
            self.counts["started"] += n
            if self._starts_left is not None:
                self._starts_left -= n

    async def release(self, n: int = 1) -> None:
        """`n` reserved rollouts ended without producing trajectories (their starts may be made again)."""
        async with self._changed:
            self._in_flight -= n
            if self._starts_left is not None:
                self._starts_left += n
            self._changed.notify_all()

    async def push(self, traj: Trajectory) -> None:
        """A finished rollout enters the stream at once."""
        await self.push_group([traj])

    async def push_group(self, group: list[Trajectory]) -> None:
        """Rollouts of one prompt (GRPO's group) enter together and leave together; each
        counts against `max_in_flight` (reserve once per rollout)."""
        async with self._changed:
            self._queue.append(list(group))
            self.counts["pushed"] += len(group)
            self._changed.notify_all()

    # -- learner ----------------------------------------------------------------------------
    async def take(self, current_version: int, count: int | None = None, token_budget: int | None = None,
                   hold: bool = False) -> list[Trajectory]:
        """The next batch, oldest first: `count` rollouts, or as many as fit `token_budget`
        (at least one group). Waits until enough rollouts have arrived. Too-stale groups are
        dropped or kept according to the policy, and counted either way. With `hold`, no
        rollout starts from the moment the batch is taken (in the same step, so no worker slips
        in between) until `open_starts`."""
        assert count or token_budget, "take needs a count or a token budget"
        batch: list[Trajectory] = []
        groups: list[list[Trajectory]] = []  # put back if the take is cancelled (the run stops)
        tokens = 0
        async with self._changed:
            try:
                while True:
                    await self._changed.wait_for(lambda: bool(self._queue))
                    while self._queue:
                        group = self._queue[0]
                        size = sum(t.num_tokens for t in group)
                        if batch and token_budget and tokens + size > token_budget:
                            return self._taken(batch, current_version, hold)
                        self._queue.popleft()
                        self._in_flight -= len(group)
                        if max(staleness(t, current_version) for t in group) > self.max_staleness:
                            if self.stale_policy == "drop":
                                self.counts["dropped_stale"] += len(group)
                                continue
                            self.counts["kept_stale"] += len(group)
                        batch.extend(group)
                        groups.append(group)
                        tokens += size
                        if (count and len(batch) >= count) or (token_budget and tokens >= token_budget):
                            return self._taken(batch, current_version, hold)
                    self._changed.notify_all()  # dropped rollouts freed room for workers
            except asyncio.CancelledError:
                for group in reversed(groups):  # queued again, oldest first, for the checkpoint
                    self._queue.appendleft(group)
                    self._in_flight += len(group)
                raise

    def _taken(self, batch: list[Trajectory], current_version: int, hold: bool) -> list[Trajectory]:
        self._held = hold
        for traj in batch:
            self.staleness_hist[staleness(traj, current_version)] += 1
            self.counts["taken"] += 1
            self.consumed_ids.add(traj.info.get("rollout_key", traj.instance_id))
        self._changed.notify_all()
        return batch

    async def open_starts(self, starts: int | None = None) -> None:
        """Rollouts may start again (after a take with `hold`): `starts` of them until the next
        call (None: as many as `max_in_flight` allows)."""
        async with self._changed:
            self._held = False
            self._starts_left = starts
            self._changed.notify_all()

    # -- metrics and checkpoints ----------------------------------------------------------------
    @property
    def depth(self) -> int:
        return sum(len(g) for g in self._queue)

    def metrics(self, batch: list[Trajectory], current_version: int) -> dict[str, float]:
        """This batch's staleness (mean, max, and a histogram: `staleness/hist_k` rollouts k
        versions old for k up to the bound, `staleness/hist_over` for kept ones past it), the
        queue depth, rollouts in flight, and the stale counters so far."""
        values = [staleness(t, current_version) for t in batch]
        hist = {f"staleness/hist_{k}": float(values.count(k)) for k in range(self.max_staleness + 1)}
        hist["staleness/hist_over"] = float(sum(v > self.max_staleness for v in values))
        return {
            "staleness/mean": sum(values) / len(values) if values else 0.0,
            "staleness/max": float(max(values, default=0)),
            **hist,
            "stream/queue_depth": float(self.depth),
            "stream/in_flight": float(self._in_flight),
            "stream/dropped_stale": float(self.counts["dropped_stale"]),
            "stream/kept_stale": float(self.counts["kept_stale"]),
        }

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: counters, the histogram, consumed keys, and queued rollouts
        (finished but not yet trained on, so a resumed run loses none)."""
        return {
            "counts": dict(self.counts),
            "staleness_hist": {str(k): v for k, v in self.staleness_hist.items()},
            "consumed_ids": sorted(self.consumed_ids),
            "queue": [[asdict(t) for t in group] for group in self._queue],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.counts = Counter(state["counts"])
        self.staleness_hist = Counter({int(k): v for k, v in state["staleness_hist"].items()})
        self.consumed_ids = set(state["consumed_ids"])
        self._queue = deque([Trajectory(**t) for t in group] for group in state["queue"])
        self._in_flight = self.depth
