"""experiments/carry.py: a run's newest checkpoint and logs packed into one file and put back
on another machine, only where the pack is newer; a pack that does not match its record is
refused; the model the runs started from, put back only where that name is missing."""

import json

import pytest

from experiments import carry
from training.checkpoint import Checkpoints, jsonl_rows


class _Learner:  # writes a learner's files: a weights blob, a tied copy of part of it
    def __init__(self, step):
        self.step = step

    def save(self, folder):
        (folder / "policy").mkdir(parents=True)
        blob = bytes(range(256)) * 4096 * (1 + self.step % 3)
        (folder / "policy" / "model.safetensors").write_bytes(blob)
        (folder / "learner.pt").write_bytes(blob[: len(blob) // 2])


def _run(folder, steps, log_to):
    checkpoints = Checkpoints(folder, keep=2)
    for step in steps:
        checkpoints.save(step, _Learner(step), {"step": step})
    with (folder / "metrics.jsonl").open("w") as f:
        f.writelines(json.dumps({"step": s, "reward/mean": s / 10}) + "\n" for s in range(1, log_to + 1))
        f.write('{"step": ')  # a line the run is half-way through
    (folder / "rollouts.jsonl").write_text("".join(json.dumps({"step": s, "key": f"k{s}"}) + "\n"
                                                   for s in range(1, log_to + 1)))


def test_a_packed_run_goes_back_where_it_is_newer(tmp_path):
    run, dest = tmp_path / "a" / "sao-lag4-s0", tmp_path / "carry"
    _run(run, [10, 20, 30], log_to=34)  # logged past its newest checkpoint
    record = carry.pack(run, dest)
    assert record["step"] == 30 == carry.packed_step(dest, run.name)
    assert (dest / f"{run.name}.tar.xz").stat().st_size == record["bytes"] < 200_000  # repeats cost little
    # another machine: nothing there yet
    there = tmp_path / "b" / run.name
    assert carry.unpack(dest, there) == 30
    assert [p.name for p in Checkpoints(there).all()] == ["step_30"]
    for f in ("policy/model.safetensors", "learner.pt", "run_state.json"):
        assert (there / "checkpoints/step_30" / f).read_bytes() == (run / "checkpoints/step_30" / f).read_bytes()
    # the logs end at the checkpoint's step, where the run goes on
    assert [r["step"] for r in jsonl_rows(there / "metrics.jsonl")] == list(range(1, 31))
    assert [r["step"] for r in jsonl_rows(there / "rollouts.jsonl")] == list(range(1, 31))
    assert not (there / ".carry_unpack").exists()
    # as far or further along: left alone
    assert carry.unpack(dest, there) is None
    Checkpoints(there, keep=2).save(40, _Learner(40), {"step": 40})
    assert carry.unpack(dest, there) is None and Checkpoints(there).latest().name == "step_40"
    assert carry.unpack(dest, tmp_path / "b" / "other-run") is None  # no pack of that run


def test_a_pack_that_does_not_match_its_record_is_refused(tmp_path):
    run, dest = tmp_path / "a" / "r", tmp_path / "carry"
    _run(run, [5], log_to=5)
    carry.pack(run, dest)
    (dest / "r.tar.xz").write_text("version https://git-lfs.github.com/spec/v1\n")  # a pointer, not the pack
    with pytest.raises(ValueError, match="does not match"):
        carry.unpack(dest, tmp_path / "b" / "r")
    with pytest.raises(ValueError, match="no checkpoint"):
        carry.pack(tmp_path / "empty", dest)


def test_the_model_goes_back_only_where_its_name_is_missing(tmp_path):
    model = tmp_path / "models" / "tiny-sft-abc"
    model.mkdir(parents=True)
    (model / "model.safetensors").write_bytes(b"w" * 1000)
    (model / "stage.json").write_text("{}")
    assert carry.pack_model(model, tmp_path / "carry")["name"] == "tiny-sft-abc"
    root = tmp_path / "elsewhere" / "models"
    assert carry.unpack_model(tmp_path / "carry", root) == root / "tiny-sft-abc"
    assert (root / "tiny-sft-abc" / "model.safetensors").read_bytes() == b"w" * 1000
    assert [p.name for p in root.iterdir()] == ["tiny-sft-abc"]
    assert carry.unpack_model(tmp_path / "carry", root) is None  # there already
    assert carry.unpack_model(tmp_path / "none", root) is None  # nothing packed
