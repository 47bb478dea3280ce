"""training/timings.py: the phases of a step and of its rollouts, as metrics."""

import pytest

from agent.trajectory import Trajectory
from training.timings import Phases, p95, rollout_metrics, step_metrics


def test_p95_is_a_sample_by_nearest_rank():
    assert p95([]) == 0.0 and p95([3.0]) == 3.0
    assert p95([float(i) for i in range(1, 17)]) == 16.0  # 16 rollouts: ceil(15.2) = the 16th
    assert p95([float(i) for i in range(1, 101)]) == 95.0


def test_phases_sum_their_blocks_and_run_the_sync_at_each_end():
    synced = []
    phases = Phases(sync=lambda: synced.append(1))
    for _ in range(3):
        with phases("a"):
            pass
    with pytest.raises(RuntimeError), phases("b"):  # a phase that raises is still counted
        raise RuntimeError
    assert set(phases.metrics("time/x")) == {"time/x/a_s", "time/x/b_s"} and len(synced) == 4


def test_rollout_metrics_mean_p95_per_turn_and_tokens_per_second():
    batch = []
    for i, (gen, turns, n) in enumerate([(1.0, 2, 10), (3.0, 3, 30)]):
        t = Trajectory(f"t{i}", prompt_ids=[1], turns=turns, timings={"generate": gen, "sandbox": 0.5 * (i + 1)})
        t.append_sampled(list(range(n)), [0.0] * n, 0)
        batch.append(t)
    m = rollout_metrics(batch)
    assert m["time/rollout/generate_mean_s"] == 2.0 and m["time/rollout/generate_p95_s"] == 3.0
    assert m["time/rollout/sandbox_mean_s"] == 0.75 and "time/rollout/grade_mean_s" not in m  # none measured it
    assert m["time/rollout/generate_per_turn_s"] == pytest.approx((0.5 + 1.0) / 2)
    assert m["time/rollout/tokens_per_s"] == pytest.approx(10.0)


def test_step_shares_and_what_no_phase_measured():
    m = step_metrics({"batch_wait": 1.0, "learner": 2.0}, 4.0)
    assert m["time/share/batch_wait"] == 0.25 and m["time/share/learner"] == 0.5
    assert m["time/share/unaccounted"] == 0.25 and m["time/step/wall_s"] == 4.0
