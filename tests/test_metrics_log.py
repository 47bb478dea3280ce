"""metrics.jsonl and TensorBoard after a resume: what a killed run logged past its checkpoint
is dropped from both, so each step appears once."""

import json
import time

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from training.checkpoint import MetricsLog


def test_a_resumed_log_drops_the_steps_past_the_checkpoint(tmp_path):
    log = MetricsLog(tmp_path)
    for step in (1, 2, 3):  # the killed run got to step 3; its checkpoint is step 1
        log.log(step, {"reward/mean": float(step)})
    log.close()
    time.sleep(1.1)  # a new event file (their names carry the second)
    log = MetricsLog(tmp_path, resume_step=1)
    for step in (2, 3):
        log.log(step, {"reward/mean": 10.0 + step})
    log.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["reward/mean"]) for r in rows] == [(1, 1.0), (2, 12.0), (3, 13.0)]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("reward/mean")] == [(1, 1.0), (2, 12.0), (3, 13.0)]
