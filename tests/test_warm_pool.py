"""The warm pool (`SandboxPool(warm=N)`, `sandbox.warm_pool`) on real containers: a warm
sandbox is handed out and works, each is used once, none outlives `close()` or a dead run, and
the sandbox benchmark runs both ways. No timing is asserted: speed is in BENCHMARKS.md."""

import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from conftest import RUN_ID

from sandbox.docker import DEFAULT_IMAGE, LABEL, sweep
from sandbox.pool import SandboxPool

ROOT = Path(__file__).resolve().parents[1]


def containers(docker_client, run_id: str) -> set[str]:
    """Ids of every container (running or not) labelled with `run_id`."""
    found = docker_client.containers.list(all=True, sparse=True, filters={"label": [f"{LABEL}=1", f"sao.run_id={run_id}"]})
    return {ct.id for ct in found}


@pytest.mark.docker
def test_a_warm_sandbox_is_handed_out_and_works(docker_client):
    run_id = f"{RUN_ID}-warm-a"
    pool = SandboxPool(run_id, max_live=1, warm=1)
    try:
        with pool.sandbox(DEFAULT_IMAGE):  # the first of an image starts as before; it is kept warm from now
            pass
        assert pool.handed == {"warm": 0, "cold": 1}
        assert pool.wait_warm(DEFAULT_IMAGE) == 1
        (ready,) = containers(docker_client, run_id)  # the one just used was removed: only the warm one is left
        with pool.sandbox(DEFAULT_IMAGE) as sb:
            assert sb.id == ready and pool.handed == {"warm": 1, "cold": 1}
            r = sb.exec("echo hello > note.txt && cat note.txt && pwd")
            assert r.ok and r.output.split() == ["hello", "/testbed"]
            sb.write_file("a.py", "print(6 * 7)\n")
            assert sb.exec("python3 a.py").output.strip() == "42"
    finally:
        pool.close()
    assert not containers(docker_client, run_id)


@pytest.mark.docker
def test_each_sandbox_handed_out_is_a_new_container_removed_after_use(docker_client):
    run_id = f"{RUN_ID}-warm-b"
    pool = SandboxPool(run_id, max_live=3, warm=2)
    seen: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def use() -> None:
        try:
            with pool.sandbox(DEFAULT_IMAGE) as sb:
                first = sb.exec("ls /tmp; touch /tmp/used")  # a reused container would show it to the next user
                assert first.ok and "used" not in first.output.split()
                with lock:
                    seen.append(sb.id)
            assert sb.id not in containers(docker_client, run_id)  # removed at once, not put back
        except BaseException as e:  # said by the test's thread
            errors.append(e)

    try:
        for _ in range(4):
            use()
        pool.wait_warm(DEFAULT_IMAGE)
        threads = [threading.Thread(target=use) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for _ in range(2):
            use()
    finally:
        pool.close()
    assert not errors, errors
    assert len(seen) == 9 and len(set(seen)) == 9
    assert pool.handed["warm"] >= 2 and sum(pool.handed.values()) == 9
    assert not containers(docker_client, run_id)


@pytest.mark.docker
def test_close_removes_the_warm_containers_and_those_in_use(docker_client):
    run_id = f"{RUN_ID}-warm-c"
    pool = SandboxPool(run_id, max_live=2, warm=2)
    with pool.sandbox(DEFAULT_IMAGE):
        pass
    assert pool.wait_warm(DEFAULT_IMAGE) == 2
    with pool.sandbox(DEFAULT_IMAGE):
        assert len(containers(docker_client, run_id)) >= 2  # the one in use and the warm ones (refilling)
        pool.close()
        assert not containers(docker_client, run_id)
    for t in pool._refillers:
        t.join(60)
        assert not t.is_alive()  # the refill threads stopped and started nothing after the sweep
    assert not containers(docker_client, run_id)
    with pytest.raises(Exception, match="is closed"):
        with pool.sandbox(DEFAULT_IMAGE):
            pass


@pytest.mark.docker
def test_a_stopped_warm_container_is_not_handed_out(docker_client):
    run_id = f"{RUN_ID}-warm-d"
    pool = SandboxPool(run_id, max_live=1, warm=1)
    try:
        with pool.sandbox(DEFAULT_IMAGE):
            pass
        assert pool.wait_warm(DEFAULT_IMAGE) == 1
        (stopped,) = containers(docker_client, run_id)
        docker_client.containers.get(stopped).kill()  # as an engine restart takes the idle ones down
        with pool.sandbox(DEFAULT_IMAGE) as sb:
            assert sb.id != stopped and sb.exec("echo up").output.strip() == "up"
        assert stopped not in containers(docker_client, run_id)
    finally:
        pool.close()
    assert not containers(docker_client, run_id)


@pytest.mark.docker
def test_warm_containers_of_a_dead_run_are_swept(docker_client):
    """A run that dies without closing its pool (os._exit: no atexit, no close) leaves its
    warm containers; the sweep of dead runs (every new pool runs it) removes them."""
    run_id = f"{RUN_ID}-warm-e"
    script = textwrap.dedent(f"""
        import os
        from sandbox.docker import DEFAULT_IMAGE
        from sandbox.pool import SandboxPool
        pool = SandboxPool({run_id!r}, max_live=1, warm=2)
        with pool.sandbox(DEFAULT_IMAGE):
            pass
        print(pool.wait_warm(DEFAULT_IMAGE), flush=True)
        os._exit(0)
    """)
    r = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.split() == ["2"], r.stderr[-3000:]
    left = containers(docker_client, run_id)
    assert len(left) == 2
    removed = sweep(docker_client=docker_client)
    assert left <= set(removed) and not containers(docker_client, run_id)


def test_bad_warm_values_are_refused_naming_field_and_value():
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from sandbox.base import Limits
    from training.config import ConfigError, check

    with pytest.raises(ValueError, match=r"warm = -1: must be a whole number >= 0"):
        SandboxPool("never-started", warm=-1)

    def composed(*overrides):
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            return compose("config", overrides=list(overrides))

    cfg = composed()
    check(cfg)  # the shipped default: warm_pool 0
    assert cfg.sandbox.warm_pool == 0 and instantiate(cfg.sandbox) == Limits()  # the pool's, not a sandbox's
    check(composed("sandbox.warm_pool=4"))
    for value, shown in (("-1", "-1"), ("1.5", "1.5"), ("many", "'many'")):
        with pytest.raises(ConfigError, match=f"config field sandbox.warm_pool = {shown}: must be a whole number"):
            check(composed(f"sandbox.warm_pool={value}"))


@pytest.mark.docker
def test_sandbox_benchmark_quick_measures_both_modes(tmp_path, docker_client):
    out, png = tmp_path / "sandbox.json", tmp_path / "sandbox.png"
    r = subprocess.run([sys.executable, "-m", "benchmarks.sandbox", "--quick", "--output", str(out), "--plot", str(png)],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["concurrency"] == [1, 2] and set(result["modes"]) == {"cold", "warm"}
    for mode in result["modes"].values():
        assert set(mode) == {"1", "2"}
        for cell in mode.values():
            for op in ("create", "first_exec", "remove", "grade"):
                assert cell[op]["samples_s"] and 0 < cell[op]["p50_s"] <= cell[op]["p95_s"]
            assert cell["graded"] == cell["resolved"] >= 1  # gold patches resolve
    assert sum(c["handed_warm"] for c in result["modes"]["cold"].values()) == 0
    assert png.read_bytes().startswith(b"\x89PNG")
    assert "warm p50 s" in r.stdout and "first exec" in r.stdout
