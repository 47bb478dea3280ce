"""Checkpoints that a killed run resumes from, and the metrics a person reads.

`output_dir/checkpoints/step_N/` holds `policy/` and `critic/` (HF format, loadable with
`from_pretrained`), `learner.pt` (optimizers, step, version, RNG) and `run_state.json` (the
task sampler and the stream: queued rollouts, counters, consumed keys), and with
`trainer.engine_lag` = k `engine_lag.pt` (the k + 1 policy versions the engine samples with
and has queued: k + 1 copies of the policy's weights). A checkpoint is
written to a temporary folder and renamed, so a crash mid-write leaves the previous one.
Metrics go to `output_dir/metrics.jsonl` (one JSON object per step) and TensorBoard events.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any


LAG_FILE = "engine_lag.pt"


def jsonl_rows(path: str | Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines log (metrics.jsonl, rollouts.jsonl), blank lines skipped.
    A last line with no newline after it is one a writer is still writing, or was killed while
    writing: it is left out. Any other line that does not parse raises (the file is damaged)."""
    text = Path(path).read_text()
    lines = text.split("\n")
    torn = lines.pop()  # "" when the file ends with a newline
    rows = [json.loads(line) for line in lines if line.strip()]
    if torn.strip():
        try:  # a whole object that only lacks its newline is kept (a file written by hand)
            rows.append(json.loads(torn))
        except json.JSONDecodeError:
            pass
    return rows


class Checkpoints:
    """The newest `keep` checkpoints, and with `keep_every` = n > 0 also every one whose step is a
    multiple of n (a long run's policy over time, for probes and evals after it)."""

    def __init__(self, output_dir: str | Path, keep: int = 3, keep_every: int = 0):
        self.root = Path(output_dir) / "checkpoints"
        self.keep = keep
        self.keep_every = keep_every

    def save(self, step: int, learner, run_state: dict[str, Any], lagged: list | None = None) -> Path:
        final = self.root / f"step_{step}"
        tmp = self.root / f".tmp_step_{step}"
        shutil.rmtree(tmp, ignore_errors=True)
        learner.save(tmp)
        if lagged:
            import torch

            torch.save(lagged, tmp / LAG_FILE)
        (tmp / "run_state.json").write_text(json.dumps(run_state))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in self.all()[: -self.keep]:
            if not (self.keep_every and self.step_of(old) % self.keep_every == 0):
                shutil.rmtree(old, ignore_errors=True)
        return final

    def all(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        done = [p for p in self.root.glob("step_*") if self.is_step(p) and (p / "run_state.json").exists()]
        return sorted(done, key=self.step_of)

    @staticmethod
    def step_of(path: Path) -> int:
        return int(path.name.split("_")[1])

    @staticmethod
    def is_step(path: Path) -> bool:
        """Whether `path` is named `step_N` (a checkpoint's folder, or a policy copied out of one)."""
        return path.name.startswith("step_") and path.name[5:].isdigit()

    def latest(self) -> Path | None:
        found = self.all()
        return found[-1] if found else None


class MetricsLog:
    """metrics.jsonl plus TensorBoard, and rollouts.jsonl (each trained rollout: step, key,
    source, task, reward, exit; with `log_tokens` also its token ids, loss mask, sampler
    logprobs and policy versions); on resume, lines past the checkpoint's step are cut so a step
    is never logged twice."""

    def __init__(self, output_dir: str | Path, resume_step: int = 0, log_tokens: bool = False):
        self.log_tokens = log_tokens
        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "metrics.jsonl"
        self.rollouts_path = self.dir / "rollouts.jsonl"
        for path in (self.path, self.rollouts_path):
            if path.exists():
                kept = [row for row in jsonl_rows(path) if row["step"] <= resume_step]
                # a new file renamed over the old: a crash here leaves the old log whole
                tmp = path.with_name(f".{path.name}.cut")
                tmp.write_text("".join(json.dumps(row) + "\n" for row in kept))
                tmp.replace(path)
        self._writer = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step: events a killed run wrote past its checkpoint are dropped, as in the JSONL
            self._writer = SummaryWriter(str(self.dir / "tensorboard"), purge_step=resume_step + 1 if resume_step else None)
        except ImportError:  # tensorboard is a dependency; without it, the JSONL log still works
            pass

    def log(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: (float(v) if math.isfinite(float(v)) else None) for k, v in metrics.items()}
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **clean}) + "\n")
        if self._writer is not None:
            for k, v in clean.items():
                if v is not None:
                    self._writer.add_scalar(k, v, step)
            self._writer.flush()

    def log_rollouts(self, step: int, batch) -> None:
        with self.rollouts_path.open("a") as f:
            for t in batch:
                row = {"step": step, "key": t.info.get("rollout_key"), "source": t.info.get("source"),
                       "instance_id": t.instance_id, "reward": t.reward, "exit": t.exit_reason,
                       "agent": t.info.get("agent", "default")}
                if self.log_tokens:  # what the learner trained on, token for token
                    row.update(prompt_ids=t.prompt_ids, completion_ids=t.completion_ids, loss_mask=t.loss_mask,
                               logprobs=t.logprobs, policy_version=t.policy_version)
                f.write(json.dumps(row) + "\n")

    def read(self) -> list[dict[str, Any]]:
        return jsonl_rows(self.path)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
