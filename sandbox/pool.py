"""Bounded concurrency for sandboxes, retries on infrastructure faults, leak-free cleanup, and
an optional warm pool of started containers."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import OrderedDict, deque
from typing import Iterator

import docker

from sandbox.base import Limits, SandboxError
from sandbox.docker import DockerSandbox, client, disk_bound_of, sweep

log = logging.getLogger(__name__)
# Warm containers are kept for the images asked for most recently, this many: a dataset with an
# image per task would otherwise keep idle containers of every task it has drawn.
WARM_IMAGES = 8
WARM_THREADS = 4  # warm containers started at once, at most


def limits(warm_pool: int = 0, **fields) -> Limits:
    """What conf/sandbox/*.yaml instantiates to: each sandbox's Limits. `warm_pool` sits in the
    same group for the user, but it is the pool's (`SandboxPool(warm=cfg.sandbox.warm_pool)`)."""
    return Limits(**fields)


class SandboxPool:
    """At most `max_live` sandboxes at once; a failed start is retried `retries` times.

    On creation it sweeps the leftovers of dead runs, so a crashed run never piles up
    containers across restarts. When the Docker engine stops answering (restarted, say), new
    sandboxes wait up to `engine_wait_s` for it to come back instead of failing one after
    another; sandboxes it took down with it fail as infrastructure errors.

    `warm` > 0 keeps up to that many started, unused containers of each image asked for (of the
    `WARM_IMAGES` asked for most recently), refilled in background threads, so a sandbox is
    handed out without waiting for its container to start. They are not counted in `max_live`;
    each sandbox handed out is still used once and removed. They carry the run's labels, so
    `close()` and the sweep of dead runs remove them with the others.
    """

    def __init__(self, run_id: str, limits: Limits = Limits(), max_live: int = 4, retries: int = 2,
                 engine_wait_s: float = 300.0, warm: int = 0):
        if isinstance(warm, bool) or not isinstance(warm, int) or warm < 0:
            raise ValueError(f"warm = {warm!r}: must be a whole number >= 0 (0: no warm pool)")
        self.run_id = run_id
        self.limits = limits
        self.retries = retries
        self.engine_wait_s = engine_wait_s
        self.warm = warm
        self._engine_lock = threading.Lock()
        self._state = threading.Condition()  # guards _closed, _creating and the warm pool below
        self._closed = False
        self._creating = 0  # containers being started now, warm ones included
        self._releasing = 0  # containers being removed now (a rollout's own, in the background)
        self._ready: dict[str, deque[DockerSandbox]] = {}  # image -> its warm containers, oldest first
        self._filling: dict[str, int] = {}  # image -> its warm containers being started
        self._wanted: OrderedDict[str, None] = OrderedDict()  # the images kept warm, most recent last
        self._discard: list[DockerSandbox] = []  # warm containers of images no longer kept warm
        self._refillers: list[threading.Thread] = []
        self.handed = {"warm": 0, "cold": 0}  # sandboxes handed out: taken warm, or started for the asker
        self._slots = threading.BoundedSemaphore(max_live)
        self._images: dict[str, SandboxError | None] = {}  # image -> None (here) or why it is not
        self._images_lock = threading.Lock()  # guards _image_locks and _pulling
        self._image_locks: dict[str, threading.Lock] = {}  # held while that image is checked or pulled
        self._pulling = 0
        self._client: docker.DockerClient = client()
        removed = sweep(docker_client=self._client)
        if removed:
            log.info("removed %d sandbox(es) left by dead runs", len(removed))

    @contextlib.contextmanager
    def sandbox(self, image: str) -> Iterator[DockerSandbox]:
        """A fresh sandbox from `image` (a warm one when one is ready), removed when the block
        ends, however it ends."""
        self.wait_for_engine()
        self.ensure_image(image)
        self._keep_warm(image)
        with self._slots:
            with self._state:
                if self._closed:
                    raise SandboxError(f"the sandbox pool of run {self.run_id} is closed (the run is ending)")
                self._creating += 1
            try:
                sb = self._take_warm(image)
                if sb is None:
                    sb = self._start(image)
                    with self._state:
                        self.handed["cold"] += 1
            finally:
                with self._state:
                    self._creating -= 1
                    self._state.notify_all()
            if self._closed:  # closed while this one started: its sweep may have run before it existed
                sb.close()
                raise SandboxError(f"the sandbox pool of run {self.run_id} is closed (the run is ending)")
            try:
                yield sb
            finally:
                with self._state:
                    self._releasing += 1
                try:
                    sb.close()
                finally:
                    with self._state:
                        self._releasing -= 1
                        self._state.notify_all()

    @property
    def disk_bound(self) -> str | None:
        """How the engine bounds what a sandbox writes: "quota" (the kernel refuses writes past
        `limits.disk_mb`), "watch" (a command is killed once past it), None before the first sandbox."""
        return disk_bound_of(self._client)

    def metrics(self) -> dict[str, float]:
        """The pool's numbers for a run's metrics: `sandbox/disk_quota` 1 where the disk limit
        is a quota, 0 where it is watched (absent before the first sandbox)."""
        bound = self.disk_bound
        return {} if bound is None else {"sandbox/disk_quota": float(bound == "quota")}

    def wait_for_engine(self) -> None:
        """Return once the Docker engine answers; wait for it (one thread asks, the others queue
        behind it) up to `engine_wait_s`, then a SandboxError that says where and how to fix it."""
        if self._answers(fresh=False):  # the usual case, on a kept-alive connection
            return
        with self._engine_lock:
            deadline = time.monotonic() + self.engine_wait_s
            if self._answers():  # it came back while this thread waited for the lock
                return
            log.warning("the Docker engine does not answer; new sandboxes wait up to %.0f s for it", self.engine_wait_s)
            while not self._answers():
                if time.monotonic() > deadline:
                    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
                    raise SandboxError(f"the Docker engine at {host} did not answer for {self.engine_wait_s:.0f} s. "
                                       "Start it again (`dockerd --iptables=false --bridge=none &`, or ./setup.sh)")
                time.sleep(1.0)
            log.warning("the Docker engine answers again")

    def _answers(self, fresh: bool = True) -> bool:
        """Whether the engine answers; `fresh`: on a new connection (one kept alive from before
        can still reach an engine that is shutting down and no longer accepts any)."""
        try:
            if not fresh:
                return bool(self._client.ping())
            fresh = docker.from_env(timeout=10)
            try:
                return bool(fresh.ping())
            finally:
                fresh.close()
        except Exception:  # connection refused, reset, timed out, no socket: not answering
            return False

    def ensure_image(self, image: str) -> None:
        """Pull `image` (with progress) the first time it is asked for and is missing; a failed
        pull is remembered, so every later task on that image fails at once with the reason.
        A pull holds only its image's lock: sandboxes of other images start meanwhile."""
        with self._images_lock:
            lock = self._image_locks.setdefault(image, threading.Lock())
        with lock:
            if image not in self._images:
                self._images[image] = self._fetch(image)
            error = self._images[image]
        if error is not None:
            raise SandboxError(str(error))

    def _fetch(self, image: str) -> SandboxError | None:
        """None when `image` is here or was pulled; the pull's error when it was not."""
        try:
            self._client.images.get(image)
            return None
        except docker.errors.ImageNotFound:
            pass
        except docker.errors.APIError as e:  # not remembered: the engine may answer next time
            raise SandboxError(f"cannot ask the Docker engine about image {image!r}: {e}") from e
        from sandbox.images import pull_image

        with self._images_lock:  # one progress bar at a time: concurrent live displays garble the terminal
            show_progress = not self._pulling
            self._pulling += 1
        try:
            pull_image(image, self._client, show_progress=show_progress)
            return None
        except SandboxError as e:
            return e
        finally:
            with self._images_lock:
                self._pulling -= 1

    def _start(self, image: str) -> DockerSandbox:
        failures = 0
        while True:
            try:
                return DockerSandbox(image, self.limits, self.run_id, docker_client=self._client)
            except SandboxError as e:
                # a missing image is the user's to fix, not a fault a retry mends
                if "is not on this Docker engine" in str(e) or failures == self.retries:
                    raise
                failures += 1
                log.warning("sandbox start failed (%s); retrying", e)
                time.sleep(1.0 * failures)
            except OSError as e:  # no answer at all (requests' ConnectionError): the engine went away
                if self._answers():  # it is there: a fault of this start, retried as the others are
                    if failures == self.retries:
                        raise SandboxError(f"could not start a container from {image!r}: {e}") from e
                    failures += 1
                    continue
                self.wait_for_engine()  # then start again; a SandboxError if it does not come back

    # -- the warm pool ----------------------------------------------------------------------
    def wait_warm(self, image: str, timeout: float = 120.0) -> int:
        """Wait until `image` (asked for before) has `warm` containers ready, the pool closes or
        `timeout` seconds pass; return how many are ready."""
        with self._state:
            self._state.wait_for(lambda: self._closed or len(self._ready.get(image, ())) >= self.warm, timeout)
            return len(self._ready.get(image, ()))

    def _keep_warm(self, image: str) -> None:
        """Mark `image` as asked for now; the warm containers of an image that falls out of the
        `WARM_IMAGES` most recent are removed (by a refill thread, not the asker)."""
        if not self.warm:
            return
        with self._state:
            if self._closed:
                return
            self._wanted[image] = None
            self._wanted.move_to_end(image)
            while len(self._wanted) > WARM_IMAGES:
                old, _ = self._wanted.popitem(last=False)
                self._discard.extend(self._ready.pop(old, ()))
            if not self._refillers:
                for i in range(min(self.warm, WARM_THREADS)):
                    t = threading.Thread(target=self._refill, daemon=True, name=f"warm-pool-{self.run_id}-{i}")
                    t.start()
                    self._refillers.append(t)
            self._state.notify_all()

    def _take_warm(self, image: str) -> DockerSandbox | None:
        """A ready warm container of `image` that is still running, or None."""
        while True:
            with self._state:
                ready = self._ready.get(image)
                if not ready:
                    return None
                sb = ready.popleft()
                self._state.notify_all()  # a refill thread starts its replacement
            if self._running(sb):
                with self._state:
                    self.handed["warm"] += 1
                return sb
            # stopped while it waited (taken down by an engine restart, say): never handed out
            log.warning("warm sandbox %s is no longer running; removed", sb.id[:12])
            self._remove_quietly(sb)

    def _running(self, sb: DockerSandbox) -> bool:
        try:
            return bool(self._client.api.inspect_container(sb.id)["State"]["Running"])
        except (docker.errors.APIError, OSError):  # gone, or no answer: not one to hand out
            return False

    @staticmethod
    def _remove_quietly(sb: DockerSandbox) -> None:
        try:
            sb.close()
        except OSError as e:  # no answer from the engine: the sweep removes it later
            log.warning("could not remove sandbox %s: %s", sb.id[:12], e)

    def _to_warm(self) -> str | None:
        """The most recently asked image with fewer than `warm` containers ready or starting."""
        for image in reversed(self._wanted):
            if len(self._ready.get(image, ())) + self._filling.get(image, 0) < self.warm:
                return image
        return None

    def _refill(self) -> None:
        """One refill thread: start warm containers while an image lacks some, until closed."""
        failures = 0
        while True:
            with self._state:
                self._state.wait_for(lambda: self._closed or self._discard or self._to_warm() is not None)
                if self._closed:
                    return
                discard, self._discard = self._discard, []
                image = self._to_warm()
                if image is not None:
                    self._creating += 1
                    self._filling[image] = self._filling.get(image, 0) + 1
            for sb in discard:
                self._remove_quietly(sb)
            if image is None:
                continue
            sb = None
            try:
                sb = self._start(image)
            except Exception as e:  # a fault, or an engine gone past engine_wait_s: tried again later
                log.warning("could not start a warm sandbox from %s (%s)", image, e)
            finally:
                with self._state:
                    keep = sb is not None and not self._closed and image in self._wanted
                    if keep:
                        self._ready.setdefault(image, deque()).append(sb)
                # one not kept is removed before it stops counting as being created: close() waits
                # for those, so none is still being removed when close() returns
                if sb is not None and not keep:
                    self._remove_quietly(sb)
                with self._state:
                    self._creating -= 1
                    self._filling[image] -= 1
                    self._state.notify_all()
            failures = 0 if sb is not None else failures + 1
            if failures:  # back off, so a broken engine is not asked for a container in a tight loop
                with self._state:
                    self._state.wait_for(lambda: self._closed, timeout=min(60.0, 2.0 ** failures))

    def close(self) -> None:
        """Remove every sandbox of this run, those still in use and the warm ones included; a
        sandbox asked for from now on is refused, and one being created meanwhile (warm ones
        too) is waited for (up to 120 s), so none is left behind by a process that exits right after."""
        with self._state:
            self._closed = True
            self._state.notify_all()  # the refill threads stop
            warm = [sb for ready in self._ready.values() for sb in ready] + self._discard
            self._ready, self._discard = {}, []
            # and one being removed (a rollout removes its own in the background) is waited for too
            self._state.wait_for(lambda: self._creating == 0 and self._releasing == 0, timeout=120)
        for sb in warm:
            self._remove_quietly(sb)
        sweep(run_id=self.run_id, docker_client=self._client)
