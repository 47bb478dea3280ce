"""Docker backend of the Sandbox protocol: one real container per rollout, on the docker SDK.

Every container runs with no network, memory / CPU / pids limits and a fixed workdir, and
carries labels (`sao.sandbox`, `sao.run_id`, `sao.host`, `sao.pid`) so `sweep()` can remove
the leftovers of runs that died. A container is removed on `close()`, on leaving its `with`
block (exceptions and Ctrl-C included) and at interpreter exit.

What a sandbox writes is bounded by `Limits.disk_mb` one of two ways (`DockerSandbox.disk_bound`):
"quota" where the kernel refuses a write past the limit (ENOSPC, or EDQUOT on btrfs): overlay2
on btrfs under simple quotas, what scripts/docker_quota.sh starts where the kernel has no XFS
quota, with each sandbox's writable layer made a limited subvolume here (LAYER_SUBVOLUME,
sandbox/btrfs.py); or an engine that takes `--storage-opt size=` (overlay2 on XFS mounted with
project quotas, the btrfs driver). "watch" elsewhere (overlay2 on ext4, the usual case): the
writable layer is measured every DISK_POLL_S while a command runs and the command is killed
once it is past the limit, so a fast writer gets somewhat past it first.
"""

from __future__ import annotations

import atexit
import io
import logging
import os
import posixpath
import shlex
import signal
import socket
import subprocess
import tarfile
import threading
import time
import uuid
from pathlib import Path

import docker
import docker.errors

from sandbox import btrfs
from sandbox.base import WORKDIR, ExecResult, Limits, OutputCap, SandboxError, SandboxKilled, valid_user

log = logging.getLogger(__name__)
# The capabilities a sandbox keeps (Docker's default set has 14): CHOWN, DAC_OVERRIDE, FOWNER
# and FSETID for root's work on files another user owns (package managers, repositories cloned
# by another uid, git setting modes), KILL to stop what a command left behind whoever owns it.
CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL")

LABEL = "sao.sandbox"
DEFAULT_IMAGE = "sao-sandbox:bookworm"
KEEPALIVE_LOOKS = 40  # about 40 s of looks for init's first child (a loaded host)
# The host waits this long past a command's own timeout before it kills every process itself.
DISK_POLL_S = 1.0
# Under the watch, what a command that starts with the sandbox already past its limit may add
# before it is stopped: its own wrapper writes a small file (the process group's id) and a
# directory copied up counts a block.
WATCH_SLACK = 2**20
HOST_GRACE_S = 10.0
_TIMEOUT_EXIT = 124  # GNU timeout's status when it had to stop the command
_DIFF_LIMIT = 20_000_000

# Under a quota, a failed write says one of these; seen in a command's output, the sandbox is
# probed (a write of QUOTA_PROBE_KB as root): refused, it is full.
_QUOTA_MESSAGES = (b"No space left on device", b"Disk quota exceeded")
QUOTA_PROBE_KB = 1024
_QUOTA_PROBE = (f"dd if=/dev/zero of=/.sao-disk-probe bs=64k count={QUOTA_PROBE_KB // 64} 2>/dev/null; "
                "s=$?; rm -f /.sao-disk-probe; exit $s")

_live: dict[str, "DockerSandbox"] = {}
_live_lock = threading.Lock()
# engine (its API address) -> the filesystem whose quota bounds a container's writes there
# ("xfs", LAYER_SUBVOLUME, "btrfs-squota", "btrfs": full qgroups), or "" where none does: found out once per process and engine
_quota_fs: dict[str, str] = {}
# overlay2 on btrfs under simple quotas: each sandbox's writable layer made a subvolume with a limit
# by this process (sandbox/btrfs.py), the engine's removal left a plain directory removal
LAYER_SUBVOLUME = "btrfs-squota-layer"
_quota_why: dict[str, str] = {}  # engine -> why it has no quota ("" where it has one)
_quota_lock = threading.Lock()


def client() -> docker.DockerClient:
    """The local (or DOCKER_HOST) engine, or a SandboxError that says how to start one."""
    try:
        c = docker.from_env(timeout=120)
        c.ping()
        return c
    except docker.errors.DockerException as e:
        host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        raise SandboxError(
            f"no Docker engine answers at {host} ({e}). Start one with "
            "`dockerd --iptables=false --bridge=none &` or run ./setup.sh, which installs it."
        ) from e


def quota_fs(docker_client: docker.DockerClient, image: str = DEFAULT_IMAGE) -> str:
    """The filesystem ("xfs", "btrfs-squota", or "btrfs" with full qgroups) whose quota bounds what a container of this engine
    writes (`--storage-opt size=`), or "" where it does not (the disk is watched). Asked once
    per process and engine: the engine's storage driver, then one container created (not
    started) from `image` with a size, to see the engine take it. SAO_DISK_BOUND=watch skips
    the quota wherever it could be had."""
    key = _engine_key(docker_client)
    with _quota_lock:
        if key not in _quota_fs:
            fs, why = _find_quota_fs(docker_client, image)
            _quota_fs[key], _quota_why[key] = fs, why
            if fs:
                how = "each sandbox's layer a limited subvolume" if fs == LAYER_SUBVOLUME else "--storage-opt size"
                log.info("sandbox disk limit: a %s quota (%s) at %s: a write past it fails", fs, how, key)
            else:
                log.warning("sandbox disk limit: watched, not a quota (%s); a command is killed within about "
                            "%.0f s of passing it, so a fast writer gets past it first", why, DISK_POLL_S)
        return _quota_fs[key]


def disk_bound_of(docker_client: docker.DockerClient) -> str | None:
    """"quota" or "watch" for an engine this process has started a sandbox on; None before."""
    fs = _quota_fs.get(_engine_key(docker_client))
    return None if fs is None else ("quota" if fs else "watch")


def no_quota_why(docker_client: docker.DockerClient) -> str:
    """Why the disk limit is watched on this engine ("" under a quota, or not yet asked)."""
    return _quota_why.get(_engine_key(docker_client), "")


def _engine_key(docker_client: docker.DockerClient) -> str:
    """Where the engine answers: its socket's path (docker-py names every socket's URL
    http+docker://localhost), else its URL."""
    api = docker_client.api
    return getattr(getattr(api, "_custom_adapter", None), "socket_path", None) or api.base_url


def _find_quota_fs(docker_client: docker.DockerClient, image: str) -> tuple[str, str]:
    if os.environ.get("SAO_DISK_BOUND", "auto") == "watch":
        return "", "SAO_DISK_BOUND=watch"
    info = docker_client.info()  # no answer: raised, and asked again at the next sandbox
    driver = info.get("Driver") or "?"
    backing = dict((row + ["", ""])[:2] for row in info.get("DriverStatus") or []).get("Backing Filesystem", "")
    if driver == "overlay2" and backing == "btrfs":
        return _layer_subvolume_ok(docker_client, info.get("DockerRootDir") or "")
    if driver == "overlay2" and backing == "xfs":
        fs = "xfs"
    elif driver == "btrfs":
        fs = "btrfs"
    else:
        return "", (f"storage driver {driver}" + (f" on {backing}" if backing else "")
                    + " takes no --storage-opt size; scripts/docker_quota.sh starts an engine that does")
    try:  # overlay2 on XFS takes it only when mounted with pquota: ask the engine
        if fs == "btrfs":  # and on btrfs, whether the limit counts the image: see _btrfs_mode
            size, cmd = f"{_PROBE_LIMIT_MB}M", ["sh", "-c", f"head -c {_PROBE_WRITE_MB * 2**20} /dev/zero > /.sao-probe"]
        else:
            size, cmd = f"{_quota_size_mb(docker_client, fs, image, 64)}M", ["true"]
        ct = docker_client.containers.create(
            image, cmd, network_mode="none", storage_opt={"size": size},
            labels={LABEL: "1", "sao.run_id": "disk-bound-check", "sao.host": socket.gethostname(), "sao.pid": str(os.getpid())})
    except docker.errors.ImageNotFound:
        raise
    except docker.errors.APIError as e:
        if fs == "btrfs" and "quota exceeded" in str(e.explanation or e).lower():
            # full qgroups: the probe's limit, under the image's size, is passed as the engine
            # writes the container's first files (resolv.conf): the engine takes sizes
            _warn_full_qgroups()
            return "btrfs", ""
        return "", f"the engine ({driver} on {backing or fs}) refused --storage-opt size: {e.explanation or e}"
    try:
        if fs == "btrfs":
            fs = _btrfs_mode(ct)
    finally:
        try:
            ct.remove(force=True)
        except docker.errors.APIError:
            pass  # the sweep removes it
    if fs == "btrfs":
        _warn_full_qgroups()
    return fs, ""


def _warn_full_qgroups() -> None:
    log.warning("sandbox disk limit: btrfs with full qgroups: every removed sandbox leaves the kernel a costly "
                "clean-up that grows with the count (RELIABILITY.md, \"Disk\"); ./setup.sh (scripts/docker_quota.sh) "
                "moves an engine it started to overlay2 on simple quotas")


def _layer_subvolume_ok(docker_client: docker.DockerClient, root: str) -> tuple[str, str]:
    """(LAYER_SUBVOLUME, "") where this process can bound each sandbox's layer itself: the engine
    is on this machine (a unix socket), its data root is here, on btrfs under simple quotas, and
    this process is root (it makes the subvolumes); else ("", why)."""
    local = _engine_key(docker_client).startswith("/")
    if not local or not Path(root).is_dir():
        return "", f"overlay2 on btrfs at {root or '?'}, but the engine is not on this machine: its layers cannot be bounded from here"
    if os.geteuid() != 0:
        return "", f"overlay2 on btrfs at {root}: bounding each sandbox's layer takes root, and this process is uid {os.geteuid()}"
    try:
        mode = btrfs.quota_mode(root)
    except OSError as e:
        return "", f"overlay2 on btrfs at {root}: its quota mode cannot be read ({e})"
    if mode != "squota":
        return "", (f"overlay2 on btrfs at {root} with quotas {mode}, not simple quotas: "
                    "python3 scripts/btrfs_squota.py ROOT turns them on")
    return LAYER_SUBVOLUME, ""


# A probe container's limit (MiB), under any image's size, and what it writes (MiB): refused under
# full qgroups (the limit counts the image's files the snapshot refers to), taken under simple
# quotas (the limit counts the extents the container itself writes).
_PROBE_LIMIT_MB, _PROBE_WRITE_MB = 8, 2


def _btrfs_mode(ct) -> str:
    """"btrfs-squota" where the btrfs engine's filesystem has simple quotas, "btrfs" where it has
    full qgroups: `ct` (created with a size) writes past its limit but not past what it wrote."""
    try:
        ct.start()
        if ct.wait(timeout=120).get("StatusCode") == 0:
            return "btrfs-squota"
    except (docker.errors.APIError, OSError) as e:  # no verdict: the size that never lets a write past the limit
        log.warning("could not tell the btrfs engine's quota mode (%s): taken as full qgroups", e)
    return "btrfs"


def _quota_size_mb(docker_client: docker.DockerClient, fs: str, image: str, disk_mb: int) -> int:
    """The `--storage-opt size` (MiB) that lets a container of `image` write `disk_mb`. On XFS the
    project quota covers the writable layer alone: `disk_mb`; so does a btrfs simple quota (it
    counts the extents the container's subvolume wrote). A btrfs qgroup limit under full qgroups
    counts all the subvolume refers to, the image's files too: `disk_mb` plus the image's size
    (its file bytes; btrfs also counts their metadata and block rounding, so a little less than
    `disk_mb` can be written: never more)."""
    if fs != "btrfs":
        return disk_mb
    size = docker_client.images.get(image).attrs.get("Size") or 0
    return disk_mb + -(-int(size) // 2**20)


class _QuotaMessages:
    """Watches a command's output for the messages of a write the quota refused (split across
    chunks included); `new()` says whether one came since it was last asked."""

    def __init__(self) -> None:
        self.seen = False
        self._new = False
        self._tail = b""

    def feed(self, chunk: bytes) -> None:
        text = self._tail + chunk
        if any(m in text for m in _QUOTA_MESSAGES):
            self.seen = self._new = True
        self._tail = text[-max(len(m) for m in _QUOTA_MESSAGES):]

    def new(self) -> bool:
        new, self._new = self._new, False
        return new


class DockerSandbox:
    """A running container with a workspace at `workdir`. Use as a context manager.

    `disk_bound`: "quota" when the engine refuses writes past `limits.disk_mb` itself, "watch"
    when the writable layer is measured while commands run (see the module's docstring)."""

    def __init__(
        self,
        image: str = DEFAULT_IMAGE,
        limits: Limits = Limits(),
        run_id: str = "default",
        env: dict[str, str] | None = None,
        docker_client: docker.DockerClient | None = None,
        workdir: str = WORKDIR,
    ):
        self.image = image
        self.limits = limits
        self.workdir = workdir
        self._client = docker_client or client()
        self._oom_seen = 0
        self._n_exec = 0
        self._layer_bytes = 0  # the writable layer's size when last measured (the watch's)
        self._user = "root"  # whom commands run as: `limits.user` once `drop_privileges` is called
        if not valid_user(limits.user):
            raise SandboxError(f"sandbox.user = {limits.user!r}: a numeric uid or uid:gid other than 0 (e.g. '1000:1000'), "
                               "or null to run as root")
        ulimits = [docker.types.Ulimit(name="nofile", soft=limits.nofile, hard=limits.nofile)]
        if limits.user is not None:  # root is exempt from RLIMIT_NPROC: it bounds only the user
            ulimits.append(docker.types.Ulimit(name="nproc", soft=limits.nproc, hard=limits.nproc))
        labels = {
            LABEL: "1",
            "sao.run_id": run_id,
            "sao.host": socket.gethostname(),
            "sao.pid": str(os.getpid()),
        }
        environment = {"PYTHONDONTWRITEBYTECODE": "1", "PAGER": "cat", "GIT_PAGER": "cat", "LC_ALL": "C.UTF-8"}
        environment.update(env or {})
        try:
            self.quota_fs = quota_fs(self._client, image)
            self.disk_bound = "quota" if self.quota_fs else "watch"
            storage_opt = None
            if self.quota_fs and self.quota_fs != LAYER_SUBVOLUME:
                storage_opt = {"size": f"{_quota_size_mb(self._client, self.quota_fs, image, limits.disk_mb)}M"}
            # under LAYER_SUBVOLUME the container is created, its writable layer bounded, then started
            make = self._client.containers.create if self.quota_fs == LAYER_SUBVOLUME else self._client.containers.run
            self._container = make(
                image,
                command=["sleep", "infinity"],
                name=f"sao-{run_id[:24]}-{uuid.uuid4().hex[:8]}".replace("/", "-"),
                detach=True,
                init=True,  # reaps zombies, so a fork bomb's dead children free their pids
                network_mode="none",
                mem_limit=f"{limits.memory_mb}m",
                memswap_limit=f"{limits.memory_mb}m",  # no swap: a memory hog is killed, not slowed
                nano_cpus=int(limits.cpus * 1e9),
                pids_limit=limits.pids,
                # every capability dropped but those root needs on files it does not own (repos
                # cloned by another user, modes git sets) and to stop processes of another user;
                # no raw sockets, no mknod, no chroot; setuid binaries grant nothing
                cap_drop=["ALL"],
                cap_add=list(CAPABILITIES),
                security_opt=["no-new-privileges"],
                ulimits=ulimits,
                working_dir=workdir,
                labels=labels,
                environment=environment,
                hostname="sandbox",
                storage_opt=storage_opt,  # the disk limit, where the engine takes it (else watched)
            )
            if self.quota_fs == LAYER_SUBVOLUME:
                self._bound_and_start(limits.disk_mb)
        except docker.errors.ImageNotFound as e:
            raise SandboxError(
                f"image {image!r} is not on this Docker engine. Build the default one with "
                f"`python -m sandbox.images`, or `docker pull {image}` where a registry is reachable."
            ) from e
        except docker.errors.APIError as e:
            raise SandboxError(f"could not start a container from {image!r}: {e}") from e
        self.id = self._container.id
        with _live_lock:
            _live[self.id] = self
        try:
            self._keepalive_pid = self._find_keepalive()
        except (SandboxError, docker.errors.APIError) as e:
            self.close()
            raise e if isinstance(e, SandboxError) else SandboxError(f"sandbox {self.id[:12]} stopped as it started: {e}")

    def _bound_and_start(self, disk_mb: int) -> None:
        """LAYER_SUBVOLUME: make the created container's writable layer a btrfs subvolume limited
        to `disk_mb` (sandbox/btrfs.py), then start it; a layer that cannot be bounded is no
        sandbox (the container is removed and the error said)."""
        try:
            btrfs.bound_layer(self._container.attrs["GraphDriver"]["Data"]["UpperDir"], disk_mb * 2**20)
        except (KeyError, OSError, subprocess.SubprocessError) as e:
            self._container.remove(force=True)
            raise SandboxError(f"could not bound the writable layer of a sandbox to {disk_mb} MB "
                               f"(a btrfs subvolume with a simple quota): {e}") from e
        self._container.start()

    def _find_keepalive(self) -> int:
        """The keep-alive `sleep`'s pid: init (docker-init) is pid 1, and its only child at start
        is the keep-alive, once init has forked it. On a loaded host the first look can come
        before that; taken as "no keep-alive", every command's clean-up would then kill the
        `sleep`, and the container would stop under the next command. So look again until it is
        there; -1 only for an image without `ps` (nothing is spared, as before)."""
        for attempt in range(KEEPALIVE_LOOKS):
            r = self._container.exec_run(["ps", "-o", "pid=", "--ppid", "1"])
            out = r.output.split()
            if out and out[0].isdigit():
                return int(out[0])
            if r.exit_code not in (0, 1):  # ps missing (126/127), not "no such process yet" (1)
                return -1
            time.sleep(0.05 * (attempt + 1))
        raise SandboxError(f"sandbox {self.id[:12]}: its keep-alive process did not start "
                           f"within {KEEPALIVE_LOOKS} looks")

    # -- commands ---------------------------------------------------------------------------
    def exec(
        self,
        cmd: str,
        timeout: float | None = None,
        workdir: str | None = None,
        output_limit: int | None = None,
    ) -> ExecResult:
        """Run `cmd` with bash; kill it and all it started once `timeout` seconds pass."""
        timeout = float(timeout or self.limits.default_timeout_s)
        limit = output_limit or self.limits.output_bytes
        # GNU timeout makes its pid the command's process group and signals the whole group;
        # the group id is written down so what the command left running is killed after it.
        self._n_exec += 1
        pgid_file = f"/tmp/.sao-pgid-{self._n_exec}"
        # (on a sandbox full to its quota the group id cannot be written: said nowhere, and its
        # processes are then stopped by _kill_all alone)
        # stderr goes into stdout's pipe here, in the sandbox: two pipes read apart reach us in
        # no fixed order (an eval script's `set -x` marker line on stderr could land before the
        # test output on stdout that came first, and swebench's parser then read half the log)
        wrapped = (f"{{ echo $$ > {pgid_file}; }} 2>/dev/null; "
                   f"exec timeout -k 3 {timeout:g} bash -c {shlex.quote(cmd)} 2>&1")
        api = self._client.api
        start = time.monotonic()
        try:
            exec_id = api.exec_create(self.id, ["bash", "-c", wrapped], workdir=workdir or self.workdir, user=self._user,
                                      environment={"HOME": "/tmp"} if self._user != "root" else None)["Id"]
            stream = api.exec_start(exec_id, stream=True, demux=False)
        except docker.errors.APIError as e:
            raise SandboxError(f"exec failed in sandbox {self.id[:12]}: {e}") from e
        cap = OutputCap(limit)
        refused = _QuotaMessages()

        def pump() -> None:
            try:
                for chunk in stream:
                    cap.feed(chunk)
                    refused.feed(chunk)
            except Exception as e:  # the stream dies when we kill the processes below
                log.debug("exec stream ended: %s", e)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        # Under a quota the kernel refuses writes past the limit; a command that says so and goes
        # on (a writer in a loop) is stopped once a probe finds the sandbox full. Under the watch
        # the writable layer is measured while the command runs: a command filling the disk is
        # stopped within DISK_POLL_S (overlay2 on most filesystems has no size limit of its own).
        # Under the watch a command is stopped only for bytes past the limit that it added: one
        # that starts with the sandbox still over it (left so by the command before, whose files
        # it is deleting) is measured against what the layer held when it started.
        deadline, disk_full, layer_at_start = start + timeout + HOST_GRACE_S, False, self._layer_bytes
        while reader.is_alive() and time.monotonic() < deadline:
            reader.join(min(DISK_POLL_S, max(0.0, deadline - time.monotonic())))
            if reader.is_alive() and self._disk_full_now(refused, layer_at_start):
                disk_full = True
                self._kill_all()
                reader.join(5)
                break
        host_killed = reader.is_alive() and not disk_full
        if host_killed:  # the in-container timeout did not stop it: stop everything but init
            self._kill_all()
            reader.join(5)
        duration = time.monotonic() - start
        try:
            exit_code = api.exec_inspect(exec_id).get("ExitCode")
            exit_code = -1 if exit_code is None else int(exit_code)
            # Background processes do not outlive their command (this is what stops a fork bomb),
            # nor do those that left its process group (daemons, setsid): nothing runs between commands.
            self._kill_group(pgid_file)  # and then every process left (one exec for both)
        except OSError as e:  # no answer (refused, reset): the engine went away, not the command's doing
            raise SandboxError(f"the Docker engine stopped answering during a command in sandbox {self.id[:12]} "
                               f"(restarted or stopped?): {e}") from e
        timed_out = host_killed or (exit_code in (_TIMEOUT_EXIT, 137) and duration >= timeout * 0.98)
        output, truncated = cap.text()
        if not self.quota_fs:  # the layer as the command left it (the next command's start), and
            disk_full = self._over_disk() or disk_full  # whether it left it full: said after the command as well
        elif not disk_full:
            disk_full = (refused.seen or timed_out) and self._at_quota()
        oom = exit_code == 137 and not timed_out and not disk_full and self._oom_count_grew()
        return ExecResult(exit_code, output, timed_out and not disk_full, truncated, oom, duration,
                          disk_full_mb=self.limits.disk_mb if disk_full else 0)

    def drop_privileges(self) -> None:
        """From now on commands run as `limits.user` (when set), the workspace handed to it: called
        once the env has prepared the workspace as root, before the model's first command."""
        if self.limits.user is None or self._user != "root":
            return
        r = self.exec(f"chown -R {self.limits.user} {shlex.quote(self.workdir)}", timeout=300)
        if not r.ok:
            raise SandboxError(f"could not hand {self.workdir} to user {self.limits.user}: {r.output[-500:]}")
        self._user = self.limits.user

    def _over_disk(self, unless_at_most: int = -1) -> bool:
        """True when what the sandbox wrote (its writable layer, measured now and kept in
        `_layer_bytes`) passes `limits.disk_mb`, and `unless_at_most` bytes too."""
        api = self._client.api
        try:
            info = api._result(api._get(api._url("/containers/{0}/json", self.id), params={"size": 1}), True)
        except (docker.errors.APIError, OSError):
            return False
        self._layer_bytes = info.get("SizeRw") or 0
        return self._layer_bytes > max(self.limits.disk_mb * 2**20, unless_at_most)

    def _disk_full_now(self, refused: _QuotaMessages, layer_at_start: int) -> bool:
        """While a command runs, whether to stop it for the disk: under a quota, when it has said
        a write was refused since the last look and a probe finds the sandbox full (the bytes are
        bounded anyway; this stops a writer that goes on failing); under the watch, when the
        writable layer is past the limit and past what it held when the command started (a
        command deleting what the one before left past the limit is not stopped for it)."""
        if self.quota_fs:
            return refused.new() and self._at_quota()
        return self._over_disk(unless_at_most=layer_at_start + WATCH_SLACK)

    def _at_quota(self) -> bool:
        """Under a quota: True when the sandbox cannot take QUOTA_PROBE_KB more (a probe's
        write, as root, refused)."""
        try:
            r = self._container.exec_run(["sh", "-c", _QUOTA_PROBE], user="root")
        except docker.errors.APIError:
            return False
        return r.exit_code not in (0, 126, 127)  # dd refused the write; not "no dd" or "no sh"

    def _kill_group(self, pgid_file: str) -> None:
        """Stop what a command left running: its process group, then every other process but
        init and the keep-alive (those that left the group: daemons, setsid), in one exec."""
        # Kill again until the group is empty: children forked mid-kill escape one round. Only
        # shell builtins until the group is gone, since a fork bomb leaves no pid to fork with.
        script = (
            f"if [ -s {pgid_file} ]; then read g < {pgid_file} || exit 1; "
            "while kill -9 -$g 2>/dev/null; do :; done; fi; "
            f"rm -f {pgid_file}; {self._kill_all_script()}"
        )
        for attempt in range(20):  # a fork bomb can hold every pid for a moment: retry
            try:
                if self._container.exec_run(["bash", "-c", script], user="root").exit_code == 0:
                    return
            except docker.errors.APIError:
                pass
            time.sleep(0.1 * (attempt + 1))
            if attempt == 2 and self._status() in ("exited", "dead"):  # the engine answers: the command did it
                raise SandboxKilled(f"sandbox {self.id[:12]} stopped: its container exited during the command "
                                    "(its keep-alive process was killed)")
        raise SandboxError(f"could not stop the processes left by a command in sandbox {self.id[:12]}")

    def _status(self) -> str | None:
        """The container's state as the engine says it; None when the engine does not answer."""
        try:
            self._container.reload()
            return self._container.status
        except (docker.errors.APIError, OSError):
            return None

    def _kill_all_script(self) -> str:
        """Shell that SIGKILLs every process but init, the keep-alive and the shell running it (and
        its pipeline); exits 0."""
        return ("me=$$; ps -eo pid=,ppid= | while read p pp; do "
                f"case $p in 1|$me|{self._keepalive_pid}) continue;; esac; "
                '[ "$pp" = "$me" ] && continue; kill -9 $p 2>/dev/null; done; true')

    def _kill_all(self) -> None:
        """SIGKILL every process but init, the keep-alive and this killer (and its pipeline)."""
        try:
            self._container.exec_run(["sh", "-c", self._kill_all_script()], user="root")
        except docker.errors.APIError:
            pass

    def _oom_count_grew(self) -> bool:
        """True when the kernel OOM-killed something in this container since the last check."""
        probe = (
            "cat /sys/fs/cgroup/memory.events 2>/dev/null || cat /sys/fs/cgroup/memory/memory.oom_control"
        )
        out = self._container.exec_run(["sh", "-c", probe]).output.decode(errors="replace")
        count = 0
        for line in out.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                count = int(value)
        grew, self._oom_seen = count > self._oom_seen, count
        if not grew and "oom_kill" not in out:  # kernel without the counter: trust the exit code
            return True
        return grew

    # -- files ------------------------------------------------------------------------------
    def _abs(self, path: str) -> str:
        return path if path.startswith("/") else posixpath.join(self.workdir, path)

    def read_file(self, path: str) -> str:
        """The text of a file in the sandbox; FileNotFoundError if it is not there."""
        path = self._abs(path)
        try:
            bits, _ = self._container.get_archive(path)
        except docker.errors.NotFound as e:
            raise FileNotFoundError(path) from e
        with tarfile.open(fileobj=io.BytesIO(b"".join(bits))) as tar:
            member = tar.getmembers()[0]
            if not member.isfile():
                raise IsADirectoryError(path)
            return tar.extractfile(member).read().decode("utf-8", errors="replace")

    def write_file(self, path: str, content: str) -> None:
        """Create or replace a file (parents made as needed)."""
        path = self._abs(path)
        parent, name = posixpath.split(path)
        data = content.encode("utf-8")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            if self._user != "root":  # the file is the user's, as if its command had written it
                uid, _, gid = self._user.partition(":")
                info.uid, info.gid = int(uid), int(gid or uid)
            tar.addfile(info, io.BytesIO(data))
        try:  # one API call where the parent is there (the usual case); a command only to make it
            written = self._container.put_archive(parent, buf.getvalue())
        except docker.errors.NotFound:
            self.exec(f"mkdir -p {shlex.quote(parent)}", timeout=30)
            written = self._container.put_archive(parent, buf.getvalue())
        if not written:
            raise SandboxError(f"could not write {path} in sandbox {self.id[:12]}")

    def copy_in(self, host_dir: str | Path, dest: str | None = None) -> None:
        """Copy a host directory's contents (a git repository, say) to `dest` in the sandbox."""
        dest = dest or self.workdir
        self.exec(f"mkdir -p {shlex.quote(dest)}", timeout=30)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(str(host_dir), arcname=".")
        if not self._container.put_archive(dest, buf.getvalue()):
            raise SandboxError(f"could not copy {host_dir} into sandbox {self.id[:12]}")

    def diff(self, base: str = "HEAD") -> str:
        """The workspace against `base` as a git patch, new files included; the index is untouched."""
        cmd = (
            "set -e; idx=$(mktemp); cp -p .git/index $idx 2>/dev/null || true; "
            "GIT_INDEX_FILE=$idx git add -A >/dev/null; "
            f"GIT_INDEX_FILE=$idx git -c core.quotepath=false diff --cached --binary {shlex.quote(base)}; rm -f $idx"
        )
        result = self.exec(cmd, timeout=120, output_limit=_DIFF_LIMIT)
        if result.exit_code != 0 or result.truncated:
            raise SandboxError(f"git diff failed in sandbox {self.id[:12]}: {result.output[-2000:]}")
        return result.output

    # -- lifetime ---------------------------------------------------------------------------
    def close(self) -> None:
        """Remove the container; safe to call twice."""
        with _live_lock:
            if _live.pop(self.id, None) is None:
                return
        try:
            self._container.remove(force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as e:
            log.warning("could not remove sandbox %s: %s (sweep() will)", self.id[:12], e)

    def __enter__(self) -> "DockerSandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DockerSandbox({self.id[:12]}, image={self.image!r})"


def close_all() -> None:
    """Remove every sandbox this process still holds."""
    with _live_lock:
        live = list(_live.values())
    for sb in live:
        sb.close()


def sweep(run_id: str | None = None, everything: bool = False, docker_client=None) -> list[str]:
    """Remove leftover sandboxes: those of `run_id`, all of ours (`everything`), or, by
    default, those whose owning process on this host is dead. Returns the removed ids."""
    c = docker_client or client()
    filters = {"label": [f"{LABEL}=1"] + ([f"sao.run_id={run_id}"] if run_id else [])}
    host = socket.gethostname()
    removed = []
    # sparse: no per-container inspect, which would fail (404) for one another run removes meanwhile
    for ct in c.containers.list(all=True, filters=filters, sparse=True):
        labels = ct.attrs.get("Labels") or {}
        if not (everything or run_id):
            if labels.get("sao.host") != host or _pid_alive(int(labels.get("sao.pid", "0") or 0)):
                continue
        try:
            c.api.remove_container(ct.id, force=True)
            removed.append(ct.id)
        except docker.errors.NotFound:  # gone either way
            pass
        except docker.errors.APIError as e:
            if e.status_code == 409:  # its removal is already under way (a rollout's own, in the background)
                _wait_until_gone(c, ct.id)
    return removed


def _wait_until_gone(c, container_id: str, timeout: float = 60.0) -> None:
    """Return once the engine no longer knows the container (or after `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            c.api.inspect_container(container_id)
        except docker.errors.NotFound:
            return
        except docker.errors.APIError:
            pass
        time.sleep(0.1)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _on_sigterm(signum, frame):  # turn SIGTERM into an exception so `with` blocks unwind
    raise SystemExit(128 + signum)


atexit.register(close_all)
if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
    signal.signal(signal.SIGTERM, _on_sigterm)
