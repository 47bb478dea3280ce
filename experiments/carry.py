"""A long run carried from one machine to the next: its newest checkpoint and its logs in one
compressed file per run, which a later machine unpacks and goes on from.

A 1,000-step run on two CPU cores takes longer than one session, and a session's machine is
not always handed to the next one. `pack` writes `<run folder name>.tar.xz` (the newest
checkpoint whole, with the engine's lagged weights, and metrics.jsonl and rollouts.jsonl cut to
its step) and a small `<name>.json` beside it (the step, size and SHA-256); `unpack` puts them
back into a run folder whose own newest checkpoint is older, or that has none. xz at preset 9
has a 64 MiB window, so the copies that a checkpoint holds twice (the newest lagged version is
the policy; a tied lm_head is saved beside its embedding) cost little.

`pack_model` and `unpack_model` do the same for the model a run started from (the tiny model's
SFT warm start, cached under a name that hashes its base, recipe and settings): a machine that
has it does not spend the runs' first minutes making it again. Where the name differs (another
recipe), the run makes its own as before.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path

from training.checkpoint import Checkpoints, jsonl_rows

SUFFIX = ".tar.xz"
LOGS = ("metrics.jsonl", "rollouts.jsonl")
MODEL = "model"  # model.tar.xz, model.json: the model the runs started from


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _xz(source: Path, arcname: str, dest: Path, extra: dict[str, bytes] | None = None) -> dict:
    """`source` (a folder) as `arcname` in the xz tar `dest`, with `extra` files beside it; written
    beside and renamed. Returns {"bytes", "sha256"} of the file written."""
    tmp = dest.with_name(f".{dest.name}.tmp")
    with tarfile.open(tmp, "w:xz", preset=9) as tar:
        tar.add(source, arcname=arcname)
        for name, data in (extra or {}).items():
            member = tarfile.TarInfo(name)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    tmp.replace(dest)
    return {"bytes": dest.stat().st_size, "sha256": _sha256(dest)}


def _checked(source: Path, record_path: Path) -> dict:
    record = json.loads(record_path.read_text())
    if not source.exists() or _sha256(source) != record["sha256"]:
        raise ValueError(f"{source} is missing or does not match {record_path} "
                         "(a pack cut short, or a Git LFS pointer in its place)")
    return record


def _extract(source: Path, staging: Path) -> None:
    shutil.rmtree(staging, ignore_errors=True)
    with tarfile.open(source, "r:xz") as tar:
        tar.extractall(staging, filter="data")


def packed_step(dest_dir: Path, name: str) -> int | None:
    """The step of the pack of run `name` in `dest_dir`, or None when there is none."""
    info = dest_dir / f"{name}.json"
    return json.loads(info.read_text())["step"] if info.exists() else None


def pack(folder: Path, dest_dir: Path) -> dict:
    """Pack run `folder`'s newest checkpoint and its logs up to that step into `dest_dir`
    (written beside and renamed: a pack cut short leaves the previous one). Returns the pack's
    record ({"step", "bytes", "sha256"}). A ValueError when the run has no checkpoint."""
    latest = Checkpoints(folder).latest()
    if latest is None:
        raise ValueError(f"{folder} has no checkpoint to pack yet")
    step = Checkpoints.step_of(latest)
    dest_dir.mkdir(parents=True, exist_ok=True)
    logs = {}
    for log in LOGS:
        if (folder / log).exists():
            logs[log] = "".join(json.dumps(row) + "\n" for row in jsonl_rows(folder / log) if row["step"] <= step).encode()
    record = {"step": step, **_xz(latest, f"checkpoints/{latest.name}", dest_dir / f"{folder.name}{SUFFIX}", logs)}
    (dest_dir / f"{folder.name}.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def unpack(dest_dir: Path, folder: Path) -> int | None:
    """Put the pack of run `folder` (by its name) from `dest_dir` back into `folder` when it is
    newer than the folder's own newest checkpoint: the checkpoint goes beside the others and the
    logs are replaced by the pack's (they end at its step, where the run goes on). Returns the
    step unpacked, or None when there is no pack or the folder is as far or further. A pack
    whose bytes do not match its record is refused (ValueError)."""
    step = packed_step(dest_dir, folder.name)
    if step is None:
        return None
    latest = Checkpoints(folder).latest()
    if latest is not None and Checkpoints.step_of(latest) >= step:
        return None
    _checked(dest_dir / f"{folder.name}{SUFFIX}", dest_dir / f"{folder.name}.json")
    staging = folder / ".carry_unpack"
    _extract(dest_dir / f"{folder.name}{SUFFIX}", staging)
    (folder / "checkpoints").mkdir(parents=True, exist_ok=True)
    final = folder / "checkpoints" / f"step_{step}"
    shutil.rmtree(final, ignore_errors=True)
    (staging / "checkpoints" / f"step_{step}").rename(final)
    for log in LOGS:
        if (staging / log).exists():
            (staging / log).replace(folder / log)
    shutil.rmtree(staging)
    return step


def pack_model(model_dir: Path, dest_dir: Path) -> dict:
    """Pack the model folder `model_dir` (its name kept) into `dest_dir/model.tar.xz`."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    record = {"name": model_dir.name, **_xz(model_dir, model_dir.name, dest_dir / f"{MODEL}{SUFFIX}")}
    (dest_dir / f"{MODEL}.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def unpack_model(dest_dir: Path, models_root: Path) -> Path | None:
    """Put the packed model into `models_root` under its name where no folder of that name is
    there; returns where it went, or None (no pack, or already there)."""
    info = dest_dir / f"{MODEL}.json"
    if not info.exists():
        return None
    record = _checked(dest_dir / f"{MODEL}{SUFFIX}", info)
    final = models_root / record["name"]
    if final.exists():
        return None
    staging = models_root / f".{record['name']}.carry"
    _extract(dest_dir / f"{MODEL}{SUFFIX}", staging)
    models_root.mkdir(parents=True, exist_ok=True)
    (staging / record["name"]).rename(final)
    shutil.rmtree(staging)
    return final
