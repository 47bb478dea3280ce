"""Where a step's wall time goes: the phases each part measures, put into a step's metrics.

Three views, all under `time/` in metrics.jsonl and TensorBoard:

- **per rollout** (`time/rollout/<phase>_mean_s` and `_p95_s` over the step's batch): `sandbox`
  (waiting for a pool slot and starting the container, in a thread beside the rollout),
  `sandbox_blocked` (how long the rollout itself waited for it), `reset` (the env's set-up),
  `generate` (the engine, all turns), `tools` (tool calls in the sandbox), `grade`, and
  `rollout` (all of it, end to end; the sandbox's removal runs after, in the background);
  with `time/rollout/generate_per_turn_s` and `time/rollout/tokens_per_s` (sampled tokens over
  engine seconds, each rollout's own);
- **per learner step** (`time/learner/<phase>_s`, from the learner itself): each model's no-grad
  forward, its update's forward and backward, its optimizer step (`policy_forward`,
  `critic_forward`, `critic_backward`, `critic_optimizer`, `policy_backward`,
  `policy_optimizer`; `pack` for the batch's set-up);
- **per step** (`time/step/<phase>_s`, the orchestrator's): `batch_wait` (the learner waiting for
  the batch), `learner`, `weight_sync`, and the previous step's `checkpoint` and `log` (they
  run between two steps' learner calls, so they are inside this step's wall time); `wall_s`
  from the end of the previous step's learner call and sync to the end of this one's, and
  `time/share/<phase>` = each phase over it, `unaccounted` what no phase measured.

In async mode rollouts run beside the learner, so their times overlap the step's; the step's
phases are the learner side's own and add up to the step's wall time.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence

ROLLOUT_PHASES = ("sandbox", "sandbox_blocked", "reset", "generate", "tools", "grade", "rollout")
STEP_PHASES = ("batch_wait", "learner", "weight_sync", "checkpoint", "log")


class Phases:
    """Seconds per named phase, summed over its `with phases("name"):` blocks. `sync` runs at
    each block's end before the clock is read (a GPU learner passes torch.cuda.synchronize, so
    a phase holds its kernels, not just their launch)."""

    def __init__(self, sync: Callable[[], None] | None = None):
        self.seconds: dict[str, float] = defaultdict(float)
        self._sync = sync

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self._sync is not None:
                self._sync()
            self.seconds[name] += time.perf_counter() - t0

    def metrics(self, prefix: str) -> dict[str, float]:
        return {f"{prefix}/{k}_s": v for k, v in self.seconds.items()}


def p95(values: Sequence[float]) -> float:
    """The 95th percentile, nearest rank (an actual sample: with 16 rollouts, the 16th)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)] if ordered else 0.0


def rollout_metrics(batch) -> dict[str, float]:
    """Each phase's mean and p95 over the batch's rollouts (those that measured it), the engine's
    seconds per turn and sampled tokens per engine second."""
    out: dict[str, float] = {}
    for phase in ROLLOUT_PHASES:
        seen = [t.timings[phase] for t in batch if phase in t.timings]
        if seen:
            out[f"time/rollout/{phase}_mean_s"] = sum(seen) / len(seen)
            out[f"time/rollout/{phase}_p95_s"] = p95(seen)
    per_turn = [t.timings["generate"] / t.turns for t in batch if t.turns and "generate" in t.timings]
    if per_turn:
        out["time/rollout/generate_per_turn_s"] = sum(per_turn) / len(per_turn)
    rates = [t.num_sampled / t.timings["generate"] for t in batch if t.timings.get("generate", 0.0) > 0]
    if rates:
        out["time/rollout/tokens_per_s"] = sum(rates) / len(rates)
    return out


def step_metrics(phases: dict[str, float], wall_s: float) -> dict[str, float]:
    """`time/step/<phase>_s`, the step's wall time, and each phase's share of it."""
    wall = max(wall_s, 1e-9)
    out = {f"time/step/{k}_s": v for k, v in phases.items()}
    out["time/step/wall_s"] = wall_s
    out.update({f"time/share/{k}": v / wall for k, v in phases.items()})
    out["time/share/unaccounted"] = max(0.0, wall - sum(phases.values())) / wall
    return out
