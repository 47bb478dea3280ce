"""One engine shared by many rollout threads: requests that arrive while the engine is busy
are sent together as one batch when it is free (vLLM then decodes them side by side), weight
updates are serialised with generation, and busy time is measured.

No request waits for company: the first caller runs at once; callers that come while a
batch is running queue up, and whichever of them gets the engine next takes the whole queue.
An engine without `generate_batch` (hf) serves one request at a time.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Iterable

import torch

from agent.engines.base import Completion, SamplingParams


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    done: threading.Event = field(default_factory=threading.Event)
    result: Completion | None = None
    error: BaseException | None = None


class SharedEngine:
    def __init__(self, engine, max_batch: int = 256):
        self.engine = engine
        self.max_batch = max_batch
        self._lock = threading.Lock()  # held while the engine generates or loads weights
        self._queue: list[_Request] = []
        self._queue_lock = threading.Lock()
        self.busy_s = 0.0
        self.requests = 0
        self.batches = 0

    @property
    def version(self) -> int:
        return self.engine.version

    def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        request = _Request(list(prompt_ids), sampling)
        with self._queue_lock:
            self._queue.append(request)
        while not request.done.is_set():
            with self._lock:
                if request.done.is_set():  # another thread's batch carried it
                    break
                with self._queue_lock:
                    batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
                self._run(batch)
        if request.error is not None:
            raise request.error
        return request.result

    def _run(self, batch: list[_Request]) -> None:
        t0 = time.monotonic()
        try:
            if hasattr(self.engine, "generate_batch") and len(batch) > 1:
                try:
                    results = self.engine.generate_batch([(r.prompt_ids, r.sampling) for r in batch])
                    for r, c in zip(batch, results):
                        r.result = c
                except BaseException as e:  # one call for all: every waiter hears of it
                    for r in batch:
                        r.error = e
            else:
                for r in batch:  # one call each: an error is that request's alone
                    try:
                        r.result = self.engine.generate(r.prompt_ids, r.sampling)
                    except BaseException as e:
                        r.error = e
        finally:
            self.busy_s += time.monotonic() - t0
            self.requests += len(batch)
            self.batches += 1
            for r in batch:
                r.done.set()

    @property
    def batch_size_mean(self) -> float:
        """Requests decoded together, on average."""
        return self.requests / max(self.batches, 1)

    def metrics(self) -> dict[str, float]:
        return {"engine/requests": float(self.requests)}

    def close(self) -> None:
        if hasattr(self.engine, "close"):
            self.engine.close()

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        with self._lock:
            self.engine.update_weights(named_tensors, version)


def shareable(engine):
    """An engine that many rollout threads may call at once: one that batches continuously
    itself (vLLM's async engine: it has `agenerate`) as it is, any other behind a SharedEngine."""
    return engine if hasattr(engine, "agenerate") else SharedEngine(engine)
