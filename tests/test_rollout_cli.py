"""`python -m agent.rollout` and `python -m agent.view` as a user runs them: the tiny model on
the hf engine, a real sandbox, a real task; the page checked in headless Chromium."""

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from agent.tiny_model import build_tiny_model
from agent.trajectory import EXIT_REASONS, Trajectory
from conftest import RUN_ID

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[1]


def run(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_rollout_then_view(tmp_path, calc_task, docker_client):
    shutil.copytree(calc_task.repo_path, tmp_path / "repos" / "calc")
    dataset = tmp_path / "tasks.jsonl"
    dataset.write_text(json.dumps(replace(calc_task, repo="./repos/calc").to_row()) + "\n")
    model = build_tiny_model(tmp_path / "tiny")
    out = tmp_path / "out"
    r = run("agent.rollout", "--dataset", str(dataset), "--instance-id", calc_task.instance_id, "--model", str(model),
            "--engine", "hf", "--output", str(out), "--max-turns", "2", "--max-new-tokens", "96", "--run-id", RUN_ID)
    assert r.returncode == 0, r.stderr[-3000:]
    traj = Trajectory.load(out / f"{calc_task.instance_id}.traj.json")
    traj.check()
    assert traj.exit_reason in EXIT_REASONS and traj.reward in (0.0, 1.0)
    assert traj.turns >= 1 and traj.num_sampled > 0 and "grade" in traj.info
    assert traj.messages[0]["role"] == "system" and calc_task.problem_statement in traj.messages[1]["content"]
    assert {"generate", "tools", "total", "grade"} <= set(traj.timings)

    page = tmp_path / "page.html"
    r = run("agent.view", str(out / f"{calc_task.instance_id}.traj.json"), "-o", str(page))
    assert r.returncode == 0, r.stderr
    html = page.read_text()
    assert calc_task.instance_id in html and traj.exit_reason in html and 'class="m1"' in html

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.fail("chromium is needed for the page check: apt-get install chromium (bootstrap.sh does this)")
    shot = tmp_path / "page.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
                    f"--user-data-dir={tmp_path / 'chrome'}", f"--screenshot={shot}", "--window-size=1200,1600",
                    page.as_uri()], capture_output=True, timeout=120)
    from PIL import Image

    img = Image.open(shot).convert("L")
    lo, hi = img.getextrema()
    assert img.size == (1200, 1600) and hi - lo > 100  # something was drawn, not a blank page
