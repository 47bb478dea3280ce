"""`python -m eval.swebench` as a user runs it: a subprocess over real files and containers."""

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import RUN_ID

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[1]


def write_dataset(tmp_path: Path, calc_task) -> Path:
    """A JSONL dataset beside a copy of the calc repo, referenced by a relative path."""
    shutil.copytree(calc_task.repo_path, tmp_path / "repos" / "calc")
    rows = [
        replace(calc_task, repo="./repos/calc").to_row(),
        replace(calc_task, instance_id="calc__calc-2", repo="./repos/calc").to_row(),
        replace(calc_task, instance_id="calc__calc-3", repo="./repos/calc").to_row(),
        replace(calc_task, instance_id="calc__calc-4", repo="./repos/calc", image="no-such-image:latest").to_row(),
    ]
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eval.swebench", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)


def test_grades_predictions_and_writes_swebench_reports(tmp_path, calc_task, docker_client):
    dataset = write_dataset(tmp_path, calc_task)
    preds = [
        {"instance_id": "calc__calc-1", "model_name_or_path": "m", "model_patch": calc_task.patch},
        {"instance_id": "calc__calc-2", "model_name_or_path": "m", "model_patch": ""},
        {"instance_id": "calc__calc-3", "model_name_or_path": "m", "model_patch": "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n"},
        {"instance_id": "calc__calc-4", "model_name_or_path": "m", "model_patch": calc_task.patch},
    ]
    pred_file = tmp_path / "preds.jsonl"
    pred_file.write_text("".join(json.dumps(p) + "\n" for p in preds))
    out = tmp_path / "out"
    r = run_cli("--dataset", str(dataset), "--predictions", str(pred_file), "--run-id", RUN_ID,
                "--output", str(out), "--max-workers", "2")
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["total_instances"] == 4 and report["submitted_instances"] == 4
    assert report["resolved_ids"] == ["calc__calc-1"]
    assert report["empty_patch_ids"] == ["calc__calc-2"]
    assert report["unresolved_ids"] == ["calc__calc-3"]  # does not apply: graded, not resolved
    assert report["error_ids"] == ["calc__calc-4"]
    assert "no-such-image:latest" in report["error_reasons"]["calc__calc-4"]
    assert report["completed_instances"] == 2 and report["resolved_instances"] == 1
    # swebench 5's failure classification: a patch that does not apply is the model's, no fault of the environment
    assert report["infra_failure_instances"] == report["ambiguous_failure_instances"] == 0
    assert report["infra_failure_ids"] == report["ambiguous_failure_ids"] == [] and report["failure_reasons"] == {}
    inst = json.loads((out / "calc__calc-1" / "report.json").read_text())["calc__calc-1"]
    assert inst["resolved"] and inst["tests_status"]["FAIL_TO_PASS"]["success"] == ["test_new.py::test_clamp_high"]
    assert "test_new.py::test_clamp_high" in (out / "calc__calc-1" / "test_output.txt").read_text()
    assert (out / "calc__calc-1" / "patch.diff").read_text() == calc_task.patch
    assert "SWE grading" in r.stderr  # the summary table


def test_gold_predictions(tmp_path, calc_task, docker_client):
    dataset = write_dataset(tmp_path, calc_task)
    out = tmp_path / "gold"
    r = run_cli("--dataset", str(dataset), "--predictions", "gold", "--run-id", RUN_ID, "--output", str(out),
                "--instance-ids", "calc__calc-1", "calc__calc-2")
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["resolved_ids"] == ["calc__calc-1", "calc__calc-2"] and report["resolved_rate"] == 1.0


def test_bad_input_is_named(tmp_path, calc_task):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"instance_id": "x", "repo": "a/b", "base_commit": "", "problem_statement": "p"}) + "\n")
    r = run_cli("--dataset", str(bad), "--predictions", "gold", "--output", str(tmp_path / "o"))
    assert r.returncode == 2
    assert "bad.jsonl: row 0 (x): field 'base_commit'" in r.stderr
    dataset = write_dataset(tmp_path, calc_task)
    preds = tmp_path / "p.json"
    preds.write_text(json.dumps([{"instance_id": "nope", "model_patch": ""}]))
    r = run_cli("--dataset", str(dataset), "--predictions", str(preds), "--output", str(tmp_path / "o"))
    assert r.returncode == 2 and "p.json: entry 0: instance_id 'nope' is not in the dataset" in r.stderr
