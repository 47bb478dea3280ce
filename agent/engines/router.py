"""Several engine replicas behind one engine: `engine.replicas` copies of the model, each with
its own tensor-parallel size, and a router in front.

Routing: a rollout's first request goes to the replica with the fewest requests outstanding;
its later turns go to the same replica, so the prefix cache there (its whole history so far)
is reused. The rollout is known by the session the agent opens for it (`agent.engines.base.session`).

Faults: a replica whose call fails as a dead engine is set aside; its request goes to another
live replica (the rollout goes on; nothing is counted twice), and the replica is rebuilt
(`restart`) and given the latest weights before it serves again.

`Balancer` is the choice alone (no engines, no threads), shared by the in-process router here
and the Ray router (`training/runtime/ray.py`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable

import torch

from agent.engines.base import Completion, SamplingParams, current_session

log = logging.getLogger(__name__)


class NoReplicaLeft(RuntimeError):
    """Every replica is down and none came back."""


class ReplicaRestarted(RuntimeError):
    """A replica its runtime restarted behind the router's back: it holds the weights it started
    with, not the run's, and serves again only once the router has given it the latest."""


class Balancer:
    """Least outstanding requests, sticky per session, dead replicas skipped."""

    def __init__(self, n: int, max_sessions: int = 65_536):
        self.outstanding = [0] * n
        self.served = [0] * n
        self.alive = [True] * n
        self.sessions: OrderedDict[str, int] = OrderedDict()  # session -> replica, oldest first
        self.max_sessions = max_sessions
        self.sticky_hits = 0
        self.restarts = 0  # replicas brought back
        self.retried = 0  # requests sent again to another replica after theirs died

    def pick(self, session: str | None = None) -> int:
        live = [i for i, up in enumerate(self.alive) if up]
        if not live:
            raise NoReplicaLeft("no engine replica is alive")
        i = self.sessions.get(session) if session is not None else None
        if i is not None and self.alive[i]:
            self.sticky_hits += 1
            self.sessions.move_to_end(session)
        else:
            i = min(live, key=lambda r: (self.outstanding[r], self.served[r], r))
            if session is not None:
                self.sessions[session] = i
                while len(self.sessions) > self.max_sessions:
                    self.sessions.popitem(last=False)
        self.outstanding[i] += 1
        return i

    def done(self, i: int) -> None:
        self.outstanding[i] -= 1
        self.served[i] += 1

    def down(self, i: int) -> None:
        self.alive[i] = False

    def up(self, i: int) -> None:
        self.alive[i] = True

    def metrics(self) -> dict[str, float]:
        out = {"engine/replicas_alive": float(sum(self.alive)), "engine/restarts": float(self.restarts),
               "engine/requests_retried": float(self.retried), "engine/requests": float(sum(self.served))}
        for i in range(len(self.alive)):
            out[f"engine/replica{i}/requests"] = float(self.served[i])
            out[f"engine/replica{i}/outstanding"] = float(self.outstanding[i])
        return out


def is_dead_engine(e: BaseException) -> bool:
    """A replica that can serve no more: vLLM's engine died, or (under Ray) its actor did."""
    names = {c.__name__ for c in type(e).__mro__}
    return bool(names & {"EngineDeadError", "RayActorError", "ActorDiedError", "ActorUnavailableError",
                         "ReplicaRestarted"})


class EngineRouter:
    def __init__(self, replicas: list, restart: Callable[[int], object] | None = None, restart_wait_s: float = 600.0):
        """`restart(i)` builds replica i anew (None: a dead replica stays down)."""
        if not replicas:
            raise ValueError("engine.replicas must be at least 1")
        self.replicas = list(replicas)
        self.balancer = Balancer(len(self.replicas))
        self.restart = restart
        self.restart_wait_s = restart_wait_s
        self._lock = threading.Lock()
        self._revived = threading.Condition(self._lock)
        self._latest: tuple[list[tuple[str, torch.Tensor]], int] | None = None

    @property
    def version(self) -> int:
        """The oldest weights a live replica serves (a dead one is brought up to date first)."""
        live = [r.version for i, r in enumerate(self.replicas) if self.balancer.alive[i]]
        return min(live or [r.version for r in self.replicas])

    def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        session = current_session()
        deadline = time.monotonic() + self.restart_wait_s
        while True:
            with self._lock:
                while not any(self.balancer.alive):  # all down: wait for a restart
                    if self.restart is None or not self._revived.wait(timeout=max(0.0, deadline - time.monotonic())):
                        raise NoReplicaLeft("every engine replica died and none came back")
                i = self.balancer.pick(session)
            try:
                return self.replicas[i].generate(prompt_ids, sampling)
            except Exception as e:
                if not is_dead_engine(e):
                    raise
                self._replica_died(i, e)
                self.balancer.retried += 1  # the same request again, elsewhere: the rollout goes on
            finally:
                with self._lock:
                    self.balancer.done(i)

    def _replica_died(self, i: int, error: BaseException) -> None:
        with self._lock:
            if not self.balancer.alive[i]:
                return  # another request already found it dead
            self.balancer.down(i)
        log.warning("engine replica %d died (%s: %s)%s", i, type(error).__name__, error,
                    "; restarting it" if self.restart else "")
        if self.restart is not None:
            threading.Thread(target=self._revive, args=(i,), name=f"revive-{i}", daemon=True).start()

    def _revive(self, i: int) -> None:
        dead = self.replicas[i]
        if hasattr(dead, "close"):  # what is left of it (its loop, its engine's processes)
            try:
                dead.close()
            except Exception as e:
                log.warning("closing dead engine replica %d: %s", i, e)
        try:
            replica = self.restart(i)
            while self._latest is not None:  # the weights the others serve; again if a sync passed meanwhile
                tensors, version = self._latest
                replica.update_weights(tensors, version)
                if self._latest[1] == version:
                    break
        except Exception as e:
            log.error("engine replica %d could not be restarted: %s", i, e)
            return
        with self._lock:
            self.replicas[i] = replica
            self.balancer.restarts += 1
            self.balancer.up(i)
            self._revived.notify_all()
        log.warning("engine replica %d is back (version %d)", i, replica.version)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Every live replica at once; the tensors are kept for a replica that restarts later."""
        tensors = [(n, t.detach()) for n, t in named_tensors]
        self._latest = (tensors, version)
        live = [r for i, r in enumerate(self.replicas) if self.balancer.alive[i]]
        with ThreadPoolExecutor(len(live)) as ex:
            list(ex.map(lambda r: r.update_weights(tensors, version), live))

    # ---- colocated on GPUs: the replicas free their memory while the learner steps ----

    @property
    def sleep_during_step(self) -> bool:
        return any(getattr(r, "sleep_during_step", False) for r in self.replicas)

    def sleep(self) -> None:
        self._each_live("sleep")

    def wake_up(self) -> None:
        self._each_live("wake_up")

    def _each_live(self, method: str) -> None:
        live = [r for i, r in enumerate(self.replicas) if self.balancer.alive[i] and hasattr(r, method)]
        if live:
            with ThreadPoolExecutor(len(live)) as ex:
                list(ex.map(lambda r: getattr(r, method)(), live))

    # ---- what the metrics read ----

    @property
    def busy_s(self) -> float:
        return sum(getattr(r, "busy_s", 0.0) for r in self.replicas) / len(self.replicas)

    @property
    def batch_size_mean(self) -> float:
        return sum(getattr(r, "batch_size_mean", 0.0) for r in self.replicas) / len(self.replicas)

    def metrics(self) -> dict[str, float]:
        out = self.balancer.metrics()
        syncs = [getattr(r, "last_sync", {}) for r in self.replicas]
        if any(syncs):
            out["engine/sync_s"] = max(s.get("engine/sync_s", 0.0) for s in syncs)
            out["engine/sync_bytes"] = sum(s.get("engine/sync_bytes", 0.0) for s in syncs)
        for i in range(len(self.replicas)):
            out[f"engine/replica{i}/version"] = float(self.replicas[i].version)
        return out

    def close(self) -> None:
        for r in self.replicas:
            if hasattr(r, "close"):
                r.close()
