"""The sandbox's disk limit: a quota where the engine takes `--storage-opt size` (overlay2 on
XFS with pquota, btrfs), the watch elsewhere. Unit level: which engines are found to take it
and the container options each gets. Real: on the engine the tests run against, a command
writing past `disk_mb` is stopped and said, and under a quota nothing past the limit is written."""

from __future__ import annotations

import docker.errors
import docker.models.containers
import pytest

import sandbox.docker as sd
from conftest import RUN_ID
from sandbox.base import Limits
from sandbox.pool import SandboxPool

MiB = 2**20
# Under a quota the file written can reach the limit but not pass it; 1 MiB of leeway is kept for
# what the filesystem charges differently from a file's length (its blocks, the layer's own
# small files). On btrfs the file stops short instead: the image's metadata is charged too.
QUOTA_MARGIN_MB = 1


# -- unit level: a fake engine --------------------------------------------------------------------
class FakeImage:
    attrs = {"Size": 300 * MiB + 1}


class FakeContainer:
    id = "c0ffee" * 10

    def __init__(self, calls, probe_status=0):
        self.calls, self.probe_status = calls, probe_status

    def start(self):
        self.calls.append(("start", None))

    def wait(self, timeout=None):  # the btrfs probe's write: taken under simple quotas, refused under full qgroups
        return {"StatusCode": self.probe_status}

    def exec_run(self, cmd, **kw):  # _find_keepalive: init's child is pid 7
        return docker.models.containers.ExecResult(0, b"7\n")

    def remove(self, force=False):
        self.calls.append(("remove", force))


class FakeContainers:
    def __init__(self, refuse: str | None, squota: bool = True):
        self.refuse, self.calls, self.squota = refuse, [], squota

    def create(self, image, command, **kw):
        self.calls.append(("create", kw))
        if self.refuse:
            raise docker.errors.APIError(self.refuse, explanation=self.refuse)
        return FakeContainer(self.calls, 0 if self.squota else 1)

    def run(self, image, **kw):
        self.calls.append(("run", kw))
        return FakeContainer(self.calls)


class FakeClient:
    def __init__(self, driver: str, backing: str | None = None, refuse: str | None = None, url: str = "fake",
                 squota: bool = True):
        status = [["Backing Filesystem", backing]] if backing else [["Build Version", "Btrfs v6.2"]]
        self._info = {"Driver": driver, "DriverStatus": status}
        self.containers = FakeContainers(refuse, squota)
        self.images = type("Images", (), {"get": staticmethod(lambda name: FakeImage())})()
        self.api = type("Api", (), {"base_url": f"http://{url}"})()

    def info(self):
        return self._info


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch):
    """Each test finds the bound afresh (the cache is per process and engine)."""
    monkeypatch.setattr(sd, "_quota_fs", {})
    monkeypatch.setattr(sd, "_quota_why", {})
    monkeypatch.delenv("SAO_DISK_BOUND", raising=False)


@pytest.mark.parametrize("driver, backing, refuse, squota, want", [
    ("overlay2", "extfs", None, False, ""),  # this project's VMs: ext4, no quota
    ("overlay2", "xfs", None, False, "xfs"),  # XFS mounted with pquota
    ("overlay2", "xfs", "--storage-opt is supported only for overlay over xfs with 'pquota' mount option", False, ""),
    ("btrfs", None, None, True, "btrfs-squota"),  # simple quotas (scripts/docker_quota.sh)
    ("btrfs", None, None, False, "btrfs"),  # full qgroups: the limit counts the image too
    ("vfs", None, None, False, ""),
])
def test_the_bound_found_for_each_engine(driver, backing, refuse, squota, want):
    c = FakeClient(driver, backing, refuse, squota=squota)
    assert sd.quota_fs(c) == want
    assert sd.disk_bound_of(c) == ("quota" if want else "watch")
    tried = [kw for op, kw in c.containers.calls if op == "create"]
    # the engine is asked (one container created with a size, then removed) only where it may take it
    assert len(tried) == (driver == "btrfs" or backing == "xfs")
    if tried:
        assert "size" in tried[0]["storage_opt"] and tried[0]["labels"][sd.LABEL] == "1"
        assert ("remove", True) in c.containers.calls or refuse
        # on btrfs the probe is started, under a limit below the image's size, and writes past it
        assert (("start", None) in c.containers.calls) == (driver == "btrfs")
        if driver == "btrfs":
            assert int(tried[0]["storage_opt"]["size"].rstrip("M")) < FakeImage.attrs["Size"] / MiB
    if not want:
        assert sd.no_quota_why(c)
        assert (refuse or driver) in sd.no_quota_why(c)


def test_full_qgroups_are_told_by_the_probe_refused_at_create():
    """Under full qgroups the probe's 8 MiB limit is passed as the engine writes the container's
    first files, so its create is refused: still a btrfs engine that takes sizes (counting the image)."""
    c = FakeClient("btrfs", refuse="open .../etc/resolv.conf: disk quota exceeded")
    assert sd.quota_fs(c) == "btrfs" and sd.disk_bound_of(c) == "quota"


def test_the_bound_is_found_once_per_engine():
    c = FakeClient("overlay2", "xfs")
    for _ in range(3):
        assert sd.quota_fs(c) == "xfs"
    assert sum(op == "create" for op, _ in c.containers.calls) == 1
    other = FakeClient("overlay2", "extfs", url="other")  # another engine: asked on its own
    assert sd.quota_fs(other) == "" and sd.quota_fs(c) == "xfs"


def test_an_engine_that_does_not_answer_is_asked_again():
    """No answer is no verdict: the next sandbox asks again (a watch found then would stay)."""
    c = FakeClient("btrfs")
    c.info = lambda: (_ for _ in ()).throw(ConnectionError("refused"))
    with pytest.raises(ConnectionError):
        sd.quota_fs(c)
    assert sd.disk_bound_of(c) is None
    del c.info
    assert sd.quota_fs(c) == "btrfs-squota"


def test_sao_disk_bound_watch_turns_the_quota_off(monkeypatch):
    monkeypatch.setenv("SAO_DISK_BOUND", "watch")
    c = FakeClient("btrfs")
    assert sd.quota_fs(c) == "" and "SAO_DISK_BOUND" in sd.no_quota_why(c)
    assert not c.containers.calls


@pytest.mark.parametrize("driver, backing, squota, want_opt, want_fs", [
    ("overlay2", "extfs", False, None, ""),
    ("overlay2", "xfs", False, {"size": "64M"}, "xfs"),  # the project quota covers the writable layer alone
    ("btrfs", None, True, {"size": "64M"}, "btrfs-squota"),  # a simple quota counts what the container wrote
    ("btrfs", None, False, {"size": f"{64 + 301}M"}, "btrfs"),  # full qgroups count the image's 300 MiB and a byte too
])
def test_the_container_options_of_each_bound(driver, backing, squota, want_opt, want_fs):
    c = FakeClient(driver, backing, squota=squota)
    sb = sd.DockerSandbox(limits=Limits(disk_mb=64), run_id=RUN_ID, docker_client=c)
    try:
        run = [kw for op, kw in c.containers.calls if op == "run"]
        assert len(run) == 1 and run[0]["storage_opt"] == want_opt
        assert sb.disk_bound == ("quota" if want_opt else "watch")
        assert sb.quota_fs == want_fs
    finally:
        sd._live.pop(sb.id, None)


def test_quota_messages_are_seen_across_chunks():
    m = sd._QuotaMessages()
    m.feed(b"dd: error writing 'big': No space le")
    assert not m.seen and not m.new()
    m.feed(b"ft on device\n")
    assert m.seen and m.new() and not m.new()  # new() once per message seen
    m2 = sd._QuotaMessages()
    for chunk in (b"head: ", b"Disk quota", b" exceeded"):
        m2.feed(chunk)
    assert m2.seen


def test_the_pool_reports_the_bound():
    pool = SandboxPool.__new__(SandboxPool)  # no engine needed for its numbers
    pool._client = FakeClient("btrfs")
    assert pool.disk_bound is None and pool.metrics() == {}
    sd.quota_fs(pool._client)
    assert pool.disk_bound == "quota" and pool.metrics() == {"sandbox/disk_quota": 1.0}
    pool._client = FakeClient("overlay2", "extfs", url="ext4")
    sd.quota_fs(pool._client)
    assert pool.disk_bound == "watch" and pool.metrics() == {"sandbox/disk_quota": 0.0}


# -- real: the engine the tests run against (its bound found afresh, as a run's first sandbox does) --
def test_a_write_past_the_limit_is_stopped_and_said(make_sandbox):
    """Under either bound: dd of 200 MB under 64 MB, and a writer that never ends by itself,
    are reported as disk full; the sandbox goes on once the files are deleted."""
    sb = make_sandbox(disk_mb=64)
    r = sb.exec("dd if=/dev/zero of=/testbed/big bs=1M count=200", timeout=120)
    assert r.disk_full_mb == 64 and not r.ok and not r.timed_out, (sb.disk_bound, r.describe(), r.output)
    assert "disk limit (64 MB written) was passed" in r.describe()
    r = sb.exec("while :; do head -c 10M /dev/zero >> /testbed/big2; done; echo wrote", timeout=120)
    assert r.disk_full_mb == 64 and not r.timed_out and "wrote" not in r.output, (sb.disk_bound, r.describe())
    assert r.duration_s < 60
    assert ".sao-pgid" not in r.output  # the wrapper's own write, refused on a full disk, is not said
    r = sb.exec("rm -f /testbed/big /testbed/big2 && head -c 8M /dev/zero > /testbed/small && echo freed", timeout=60)
    assert r.ok and "freed" in r.output, r.describe()
    # the words alone are no full disk: under a quota a probe finds room, under the watch the layer is small
    r = sb.exec("echo 'write error: No space left on device'", timeout=30)
    assert r.ok and not r.disk_full_mb


def test_the_watch_spares_a_command_that_frees_what_the_one_before_left(make_sandbox):
    """Under the watch, a command that starts with the sandbox still past its limit (the command
    before was stopped for it) and deletes the files is not stopped for them, however long it
    takes to get going: here it waits past two of the watch's looks first, as a command under a
    loaded engine may before it runs at all (CI: killed as disk full after 14 s, then)."""
    sb = make_sandbox(disk_mb=64)
    if sb.disk_bound != "watch":
        pytest.skip(f"the engine's bound is {sb.disk_bound}: the kernel refuses the write, nothing is watched")
    r = sb.exec("dd if=/dev/zero of=/testbed/big bs=1M count=100", timeout=120)
    assert r.disk_full_mb == 64, r.describe()
    wait = 2.5 * sd.DISK_POLL_S
    r = sb.exec(f"sleep {wait}; rm -f /testbed/big; head -c 8M /dev/zero > /testbed/small && echo freed", timeout=60)
    assert r.ok and "freed" in r.output, r.describe()
    # and one that writes past the limit again is stopped as before, from where the layer is now
    r = sb.exec("dd if=/dev/zero of=/testbed/again bs=1M count=100", timeout=120)
    assert r.disk_full_mb == 64, r.describe()


@pytest.fixture(scope="module")
def quota_engine(docker_client):
    """An engine whose disk limit is a quota: the tests' own when it is one, else a second engine
    started for this module by scripts/docker_quota.sh (XFS with pquota, else btrfs, on a loop
    file of its own; its own socket, data root and pidfile), given the sandbox image, and
    stopped and removed at the end. ./test.sh runs the tests on the plain engine (a btrfs one
    doubles what a sandbox costs), so this is where the quota itself is tried."""
    import os
    import shutil
    import signal
    import subprocess
    import time
    from pathlib import Path

    import docker

    if sd.quota_fs(docker_client):
        yield docker_client
        return
    if os.geteuid() != 0 or not shutil.which("dockerd"):
        pytest.skip("a second Docker engine needs root and dockerd here")
    name = f"sao-quota-{RUN_ID}"
    root, run = Path(f"/var/lib/{name}"), Path(f"/run/{name}")
    host = f"unix://{run}.sock"
    env = {**os.environ, "SAO_DOCKER_ROOT": str(root), "SAO_DOCKER_HOST": host, "SAO_DOCKER_PIDFILE": f"{run}.pid",
           "SAO_DOCKER_EXEC_ROOT": str(run), "SAO_DOCKER_FALLBACK": "none", "SAO_DOCKER_IMG_GB": "8",
           "SAO_DOCKER_LOG": f"/tmp/{name}.log"}
    script = Path(__file__).resolve().parents[1] / "scripts" / "docker_quota.sh"
    started = subprocess.run(["bash", str(script), "--", "--iptables=false", "--bridge=none"], env=env,
                             capture_output=True, text=True, timeout=300)
    bound = (started.stdout.strip().splitlines() or ["(nothing said)"])[-1]
    try:
        if not bound.startswith("bound: quota"):
            pytest.skip(f"no engine with a disk quota could be started here: {bound}")
        client = docker.DockerClient(base_url=host)
        save = subprocess.Popen(["docker", "save", sd.DEFAULT_IMAGE], stdout=subprocess.PIPE)
        subprocess.run(["docker", "-H", host, "load", "-q"], stdin=save.stdout, check=True, capture_output=True, timeout=300)
        save.wait(timeout=300)
        yield client
        client.close()
    finally:
        pid_file = Path(f"{run}.pid")
        if pid_file.exists():
            pid = int(pid_file.read_text())
            os.kill(pid, signal.SIGTERM)
            deadline = time.time() + 60
            while Path(f"/proc/{pid}").exists() and time.time() < deadline:
                time.sleep(0.2)
        subprocess.run(["umount", str(root)], capture_output=True)
        Path(f"{root}.img").unlink(missing_ok=True)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(run, ignore_errors=True)


def test_under_a_quota_nothing_past_the_limit_is_written(quota_engine):
    """Under a quota, what dd wrote stays within the limit (plus QUOTA_MARGIN_MB); under the
    watch it gets past it (measured in benchmarks/disk_bound.py)."""
    from sandbox.docker import DockerSandbox

    sd._quota_fs.clear()  # found afresh on this engine, as a run's first sandbox finds it
    with DockerSandbox(limits=Limits(disk_mb=64), run_id=RUN_ID, docker_client=quota_engine) as sb:
        check_quota(sb, quota_engine)


def check_quota(sb, engine) -> None:
    assert sb.disk_bound == "quota", sd.no_quota_why(engine)
    r = sb.exec("dd if=/dev/zero of=/testbed/big bs=1M count=200; echo dd_exit=$?", timeout=120)
    assert "dd_exit=1" in r.output and r.disk_full_mb == 64, r.output  # dd itself was refused the write
    written = int(sb.exec("stat -c %s /testbed/big", timeout=30).output.split()[-1])
    assert written <= (64 + QUOTA_MARGIN_MB) * MiB, f"{written / MiB:.1f} MiB written under a 64 MiB {sb.quota_fs} quota"
    assert written >= 32 * MiB  # the quota stopped it, not something else early
