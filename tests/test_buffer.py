"""The rollout stream: order, batching by count and tokens, staleness policy, backpressure."""

import asyncio

import pytest

from agent.trajectory import Trajectory
from training.buffer import RolloutStream, staleness


def traj(name, version, n_tokens=10):
    t = Trajectory(name, prompt_ids=[1] * (n_tokens - 4))
    t.append_sampled([2, 3], [-0.1, -0.2], version)
    t.append_observation([4])
    t.append_sampled([5], [-0.3], version + 1)
    return t


def test_staleness_counts_from_the_oldest_sampled_token():
    assert staleness(traj("a", 3), current_version=6) == 3


def test_take_by_count_and_by_token_budget():
    async def main():
        s = RolloutStream(max_in_flight=10)
        for i in range(5):
            await s.reserve()
            await s.push(traj(f"t{i}", 0, n_tokens=10 + i))
        first = await s.take(current_version=0, count=2)
        # budget 24: t2 (12 tokens) fits, t2 + t3 (13) = 25 would pass it, so t3 waits
        second = await s.take(current_version=0, token_budget=24)
        return [t.instance_id for t in first], [t.instance_id for t in second], s

    first, second, s = asyncio.run(main())
    assert first == ["t0", "t1"] and second == ["t2"] and s.depth == 2
    assert s.counts["taken"] == 3 and s.staleness_hist[0] == 3


@pytest.mark.parametrize("policy,kept", [("drop", ["fresh"]), ("keep", ["old", "fresh"])])
def test_stale_rollouts_are_dropped_or_kept_and_counted(policy, kept):
    async def main():
        s = RolloutStream(max_staleness=2, stale_policy=policy)
        for name, v in (("old", 0), ("fresh", 4)):
            await s.reserve()
            await s.push(traj(name, v))
        batch = await s.take(current_version=5, count=len(kept))
        return [t.instance_id for t in batch], s

    names, s = asyncio.run(main())
    assert names == kept
    assert s.counts["dropped_stale" if policy == "drop" else "kept_stale"] == 1


def test_backpressure_blocks_until_the_learner_takes():
    async def main():
        s = RolloutStream(max_in_flight=2)
        await s.reserve()
        await s.reserve()
        third = asyncio.create_task(s.reserve())
        await asyncio.sleep(0.05)
        blocked = not third.done()
        await s.push(traj("a", 0))
        await s.take(current_version=0, count=1)
        await asyncio.wait_for(third, 1.0)
        return blocked

    assert asyncio.run(main())


def test_a_take_with_hold_stops_starts_until_they_are_opened():
    """The learner takes with hold while a rollout started during its step would be dropped:
    a worker waiting for room (woken by that same take) does not get it until open_starts."""
    async def main():
        s = RolloutStream(max_in_flight=1)
        await s.reserve()
        waiting = asyncio.create_task(s.reserve())
        await s.push(traj("a", 0))
        await s.take(current_version=0, count=1, hold=True)
        await asyncio.sleep(0.05)
        held = not waiting.done()
        await s.open_starts()
        await asyncio.wait_for(waiting, 1.0)
        await s.push(traj("b", 0))
        await s.take(current_version=0, count=1)  # without hold: the next start goes through
        await asyncio.wait_for(s.reserve(), 1.0)
        return held

    assert asyncio.run(main())


def test_a_group_reserves_all_its_places_or_none_and_open_starts_can_allow_only_n_starts():
    async def main():
        s = RolloutStream(max_in_flight=8)
        await s.open_starts(starts=3)
        await s.reserve(2)
        group = asyncio.create_task(s.reserve(2))  # 2 + 2 > 3 starts: waits whole, takes no part
        await asyncio.sleep(0.05)
        waited, in_flight = not group.done(), s._in_flight
        await s.release()  # a failed rollout's start may be made again
        await asyncio.wait_for(group, 1.0)
        for name in "abc":
            await s.push(traj(name, 0))
        await s.take(current_version=0, count=3)  # room again, but no starts left
        blocked = asyncio.create_task(s.reserve())
        await asyncio.sleep(0.05)
        still_waiting = not blocked.done()
        await s.open_starts()  # as many as max_in_flight allows
        await asyncio.wait_for(blocked, 1.0)
        await asyncio.wait_for(s.reserve(7), 1.0)
        return waited, in_flight, still_waiting, s._in_flight

    assert asyncio.run(main()) == (True, 2, True, 8)


def test_take_waits_for_rollouts_to_arrive():
    async def main():
        s = RolloutStream()
        taker = asyncio.create_task(s.take(current_version=0, count=2))
        await s.reserve()
        await s.push(traj("a", 0))
        await asyncio.sleep(0.05)
        waiting = not taker.done()
        await s.reserve()
        await s.push(traj("b", 0))
        return waiting, [t.instance_id for t in await taker]

    waiting, names = asyncio.run(main())
    assert waiting and names == ["a", "b"]


def test_state_round_trip_keeps_queued_rollouts():
    async def main():
        s = RolloutStream()
        for name in ("a", "b", "c"):
            await s.reserve()
            await s.push(traj(name, 0))
        await s.take(current_version=1, count=1)
        restored = RolloutStream()
        restored.load_state_dict(s.state_dict())
        batch = await restored.take(current_version=1, count=2)
        return restored, [t.instance_id for t in batch]

    restored, names = asyncio.run(main())
    assert names == ["b", "c"] and restored.consumed_ids == {"a", "b", "c"}
    assert restored.counts["pushed"] == 3 and restored.staleness_hist[1] == 3


def test_metrics_give_the_batch_staleness_histogram_and_queue_depth():
    async def main():
        s = RolloutStream(max_staleness=2, stale_policy="keep")
        for name, v in (("v5", 5), ("v4", 4), ("v4b", 4), ("v0", 0), ("queued", 5)):
            await s.reserve()
            await s.push(traj(name, v))
        batch = await s.take(current_version=5, count=4)
        return s.metrics(batch, current_version=5)

    m = asyncio.run(main())
    # staleness 0, 1, 1 and 5 (kept past the bound of 2); one rollout still queued, in flight
    assert (m["staleness/hist_0"], m["staleness/hist_1"], m["staleness/hist_2"], m["staleness/hist_over"]) == (1, 2, 0, 1)
    assert m["staleness/mean"] == (0 + 1 + 1 + 5) / 4 and m["staleness/max"] == 5
    assert m["stream/queue_depth"] == 1 and m["stream/in_flight"] == 1 and m["stream/kept_stale"] == 1


def test_a_cancelled_take_puts_its_rollouts_back_for_the_checkpoint():
    """The run is stopped while the learner waits for a batch: the rollouts the take had
    gathered are queued again, in order, so the checkpoint keeps them."""
    async def main():
        s = RolloutStream(max_in_flight=10)
        for i in range(2):
            await s.reserve()
            await s.push(traj(f"t{i}", 0))
        take = asyncio.create_task(s.take(current_version=0, count=4))
        await asyncio.sleep(0.05)  # it holds t0 and t1, waiting for two more
        assert s.depth == 0
        take.cancel()
        await asyncio.gather(take, return_exceptions=True)
        return s

    s = asyncio.run(main())
    assert s.depth == 2 and s.counts["taken"] == 0
    assert [g[0]["instance_id"] for g in s.state_dict()["queue"]] == ["t0", "t1"]
