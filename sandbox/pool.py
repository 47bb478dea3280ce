"""Bounded concurrency for sandboxes, retries on infrastructure faults, leak-free cleanup."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Iterator

import docker

from sandbox.base import Limits, SandboxError
from sandbox.docker import DockerSandbox, client, sweep

log = logging.getLogger(__name__)


class SandboxPool:
    """At most `max_live` sandboxes at once; a failed start is retried `retries` times.

    On creation it sweeps the leftovers of dead runs, so a crashed run never piles up
    containers across restarts. When the Docker engine stops answering (restarted, say), new
    sandboxes wait up to `engine_wait_s` for it to come back instead of failing one after
    another; sandboxes it took down with it fail as infrastructure errors.
    """

    def __init__(self, run_id: str, limits: Limits = Limits(), max_live: int = 4, retries: int = 2,
                 engine_wait_s: float = 300.0):
        self.run_id = run_id
        self.limits = limits
        self.retries = retries
        self.engine_wait_s = engine_wait_s
        self._engine_lock = threading.Lock()
        self._state = threading.Condition()  # guards _closed and _creating
        self._closed = False
        self._creating = 0  # containers being started now
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
        """A fresh sandbox from `image`, removed when the block ends, however it ends."""
        self.wait_for_engine()
        self.ensure_image(image)
        with self._slots:
            with self._state:
                if self._closed:
                    raise SandboxError(f"the sandbox pool of run {self.run_id} is closed (the run is ending)")
                self._creating += 1
            try:
                sb = self._start(image)
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
                sb.close()

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

    def close(self) -> None:
        """Remove every sandbox of this run, those still in use included; a sandbox asked for
        from now on is refused, and one being created meanwhile is waited for (up to 120 s), so
        none is left behind by a process that exits right after."""
        with self._state:
            self._closed = True
            self._state.wait_for(lambda: self._creating == 0, timeout=120)
        sweep(run_id=self.run_id, docker_client=self._client)
