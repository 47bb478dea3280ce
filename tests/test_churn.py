"""The churn benchmark (benchmarks/churn.py) on the engine the tests run against: a few sandboxes
made, used and removed, the table's figures computed from them, and the disk bound tried at the
end; the machine's CPU sampler on its own."""

from __future__ import annotations

import json
import time

import pytest

from benchmarks import churn
from benchmarks.sandbox import main as sandbox_main

pytestmark = pytest.mark.docker


def test_a_short_churn_reports_each_hundred_and_the_bound(tmp_path, docker_client):
    out = tmp_path / "churn.json"
    rc = sandbox_main(["--churn", "4", "--concurrency", "2", "--after", "1", "--disk-mb", "64", "--write-mb", "100",
                       "--output", str(out)])
    assert rc == 0
    saved = json.loads(out.read_text())
    (label, result), = saved.items()
    assert label == result["engine"] and label.startswith(docker_client.info()["Driver"])
    assert [r["i"] for r in result["rows"]] == list(range(4))
    assert all(r["create_s"] > 0 and r["remove_s"] > 0 and r["use_s"] > 0 for r in result["rows"])
    (hundred,) = result["hundreds"]  # four sandboxes: one stretch, "1-4"
    assert hundred["sandboxes"] == "1-4" and 0 <= hundred["sys_cpu"] <= hundred["busy_cpu"] <= 1
    assert hundred["create_p50_s"] <= hundred["create_p95_s"]
    disk = result["disk"]
    assert disk["disk_mb"] == 64 and disk["bound"] in ("quota", "watch")
    if disk["bound"] == "quota":  # the kernel stops the write at the limit
        assert disk["written_mb"] <= 65 and disk["overshoot_mb"] <= 1
    assert "disk limit" in disk["said"]  # said as passed, whichever bound held
    # a second engine's result goes beside the first, under its own label
    saved["other engine"] = result
    out.write_text(json.dumps(saved))
    assert sandbox_main(["--churn", "1", "--concurrency", "1", "--after", "0", "--disk-mb", "64", "--write-mb", "100",
                         "--output", str(out)]) == 0
    assert set(json.loads(out.read_text())) == {label, "other engine"}


def test_bad_arguments_are_refused(capsys):
    for argv in (["--churn", "0"], ["--churn", "5", "--concurrency", "0"], ["--churn", "5", "--write-mb", "100"]):
        with pytest.raises(SystemExit):
            churn.main(argv)
    assert "--write-mb (100) must pass --disk-mb (4096)" in capsys.readouterr().err


def test_the_cpu_sampler_reads_the_kernels_share():
    """While this process makes system calls in a loop, the machine's kernel share is above 0 and
    within its busy share (no figure beyond that: other work shares the machine)."""
    with churn.SysCPU(every=0.1) as cpu:
        t0 = time.monotonic()
        while time.monotonic() < t0 + 1.0:
            with open("/proc/self/stat") as f:  # each open and read is kernel work
                f.read()
        t1 = time.monotonic()
    assert len(cpu.samples) >= 5
    assert 0 < cpu.share(t0, t1) <= cpu.busy(t0, t1) <= 1
