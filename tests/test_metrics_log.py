"""metrics.jsonl and TensorBoard after a resume: what a killed run logged past its checkpoint
is dropped from both, so each step appears once, a line it was killed half-way through too;
and which checkpoints a run keeps."""

import json
import shutil
import time

import pytest

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from training.checkpoint import Checkpoints, MetricsLog, jsonl_rows


class _Learner:  # what Checkpoints.save asks of a learner: write its state into a folder
    def save(self, folder):
        folder.mkdir(parents=True)
        (folder / "learner.pt").write_text("state")


def test_checkpoints_keep_the_newest_and_every_nth(tmp_path):
    checkpoints = Checkpoints(tmp_path, keep=2, keep_every=20)
    for step in range(10, 80, 10):
        checkpoints.save(step, _Learner(), {"step": step})
    assert [Checkpoints.step_of(p) for p in checkpoints.all()] == [20, 40, 60, 70]
    assert checkpoints.latest().name == "step_70"
    assert not list(checkpoints.root.glob(".tmp_*"))
    newest = Checkpoints(tmp_path / "other", keep=2)  # keep_every 0: the newest only
    for step in (1, 2, 3):
        newest.save(step, _Learner(), {"step": step})
    assert [p.name for p in newest.all()] == ["step_2", "step_3"]
    # a copy a person made beside them (named step_N-something) is not a checkpoint of the run
    shutil.copytree(newest.root / "step_3", newest.root / "step_3-backup")
    assert [p.name for p in newest.all()] == ["step_2", "step_3"]


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


def test_a_line_half_written_is_left_out_and_a_resume_drops_it(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "x": 1.0}\n{"step": 2, "x": 2.0}\n{"step": 3, "x"')  # killed mid-write
    assert [r["step"] for r in jsonl_rows(path)] == [1, 2]
    log = MetricsLog(tmp_path, resume_step=2)
    log.log(3, {"x": 3.5})
    log.close()
    assert [(r["step"], r["x"]) for r in jsonl_rows(path)] == [(1, 1.0), (2, 2.0), (3, 3.5)]
    assert not list(tmp_path.glob(".*.cut"))
    # a whole last object without its newline is kept; a broken line before the last is damage
    path.write_text('{"step": 1}\n{"step": 2}')
    assert [r["step"] for r in jsonl_rows(path)] == [1, 2]
    path.write_text('{"step": 1}\n{"step"\n{"step": 3}\n')
    with pytest.raises(json.JSONDecodeError):
        jsonl_rows(path)
