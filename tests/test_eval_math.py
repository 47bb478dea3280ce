"""`python -m eval.math`: given answers graded alone, a scripted engine's rollouts through the
shared agent-eval path (every problem solved with the python tool), and the tiny model through
the real CLI with --ckpt, --runs and --resume."""

import json
import os
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from conftest import RUN_ID
from taskdata.math import make_math_tasks
from eval.math import main

ROOT = Path(__file__).resolve().parents[1]


def write_rows(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_given_answers_are_graded_alone(tmp_path):
    dataset = write_rows(tmp_path / "set.jsonl", [
        {"id": "half", "problem": "Half of one?", "answer": "\\frac{1}{2}"},
        {"id": "roots", "question": "Roots of $x^2 - 5x + 6$?", "answer": "\\{2, 3\\}"},
        {"id": "ray", "problem": "Solve $x > 4$.", "answer": "(4, \\infty)"},
        {"id": "four", "problem": "2 + 2?", "answer": 4},
    ])
    answers = write_rows(tmp_path / "answers.jsonl", [
        {"id": "half", "answer": "0.5"}, {"id": "roots", "answer": "{3, 2}"}, {"id": "ray", "answer": "[4, \\infty)"}])
    out = tmp_path / "graded"
    assert main(["--dataset", str(dataset), "--predictions", str(answers), "--output", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["correct_ids"] == ["half", "roots"] and report["wrong_ids"] == ["ray"]
    assert report["unanswered_ids"] == ["four"] and report["accuracy"] == 0.5 and report["answered"] == 3
    assert report["per_problem"]["roots"]["given_parsed"] == "{2, 3}"
    assert "accuracy: 50.0%" in (out / "report.md").read_text()


@pytest.mark.parametrize("row,says", [
    ({"id": "nope", "answer": "1"}, "row 1: field 'id' = 'nope' is not a problem of the dataset"),
    ({"answer": "1"}, "row 1: field 'id' must be a non-empty string"),
    ({"id": "b", "answer": [1]}, "row 1: field 'answer' must be a string, a number or null"),
    ({"id": "a", "answer": "2"}, "row 1: id 'a' repeats row 0"),
])
def test_bad_answer_rows_are_named(tmp_path, capsys, row, says):
    dataset = write_rows(tmp_path / "set.jsonl", [{"id": "a", "problem": "?", "answer": "1"},
                                                  {"id": "b", "problem": "?", "answer": "2"}])
    answers = write_rows(tmp_path / "answers.jsonl", [{"id": "a", "answer": "1"}, row])
    assert main(["--dataset", str(dataset), "--predictions", str(answers), "--output", str(tmp_path / "o")]) == 2
    assert f"{answers}: {says}" in capsys.readouterr().err.replace("\n", "")


def test_a_missing_hub_dataset_is_named(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    answers = write_rows(tmp_path / "answers.jsonl", [{"id": "1", "answer": "1"}])
    r = subprocess.run([sys.executable, "-m", "eval.math", "--dataset", "aime25", "--predictions", str(answers),
                        "--output", str(tmp_path / "o")], cwd=ROOT, capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 2
    said = " ".join(r.stderr.split())
    assert "cannot load the math dataset AIME 2025 (MathArena/aime_2025)" in said and "local .json" in said


@pytest.mark.docker
def test_a_scripted_engine_solves_every_problem_over_two_runs(tmp_path, docker_client):
    from transformers import AutoTokenizer

    from agent.engines.shared import SharedEngine
    from agent.loop import Agent, AgentConfig
    from agent.tiny_model import build_tiny_model
    from envs.math import MathEnv
    from eval.agent_eval import evaluate_agent
    from eval.math import math_rollout, write_reports
    from sandbox.pool import SandboxPool
    from test_math_env import SolvesWithPython

    tok = AutoTokenizer.from_pretrained(build_tiny_model())
    tasks = make_math_tasks(2, seed=5)
    out = tmp_path / "scripted"
    env, pool = MathEnv(), SandboxPool(RUN_ID, max_live=2)
    agent = Agent(SharedEngine(SolvesWithPython(tok, tasks)), tok, AgentConfig(max_turns=4))
    try:
        records = evaluate_agent(agent, tasks, env, pool, out, runs=2, model_name="scripted", rollout=math_rollout)
    finally:
        pool.close()
        env.verifier.close()
    args = Namespace(dataset="builtin:5", temperature=1.0, top_p=1.0, max_turns=4)
    report = write_reports(records, tasks, out, "scripted", args)
    assert report["pass_at_1"] == 1.0 and report["accuracy_per_run"] == [1.0, 1.0] and report["runs"] == 2
    assert report["status_counts"] == {"correct": 4} and report["exit_reasons"] == {"submitted": 4}
    assert report["turns"]["mean"] == 2 and report["pass_at_1_ci95"][1] == 1.0
    first = tasks[0].instance_id
    assert report["per_problem"][first]["expected"] == tasks[0].extra["answer"]
    assert (out / "run_1" / first / "result.json").exists() and (out / "report.png").stat().st_size > 5000
    assert "accuracy (Pass@1, averaged over the runs): 100.0%" in (out / "report.md").read_text()
    # each run's answers regrade to the same verdicts through --predictions
    assert main(["--dataset", "builtin:5", "--limit", "2", "--predictions", str(out / "run_1" / "predictions.jsonl"),
                 "--output", str(tmp_path / "regraded")]) == 0
    assert json.loads((tmp_path / "regraded" / "report.json").read_text())["accuracy"] == 1.0


@pytest.mark.docker
def test_tiny_model_end_to_end_through_the_cli(tmp_path, docker_client):
    from agent.tiny_model import DEFAULT_DIR, build_tiny_model

    tiny = str(build_tiny_model(DEFAULT_DIR))
    out = tmp_path / "tiny"
    cmd = [sys.executable, "-m", "eval.math", "--ckpt", tiny, "--dataset", "builtin", "--limit", "1", "--runs", "2",
           "--engine", "hf", "--max-turns", "2", "--max-new-tokens", "24", "--max-tokens", "4096",
           "--run-id", RUN_ID, "--output", str(out)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "accuracy (Pass@1 over 2 run(s))" in r.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["runs"] == 2 and report["instances"] == 1 and len(report["accuracy_per_run"]) == 2
    assert sum(report["status_counts"].values()) == 2 and 0.0 <= report["pass_at_1"] <= 1.0
    assert set(report["exit_reasons"]) <= {"submitted", "max_turns", "context_full", "format_errors"}
    assert report["sampled_tokens"]["max"] <= 2 * 24 and report["protocol"]["temperature"] == 1.0
    for k in (0, 1):
        lines = (out / f"run_{k}" / "predictions.jsonl").read_text().splitlines()
        assert [json.loads(line)["id"] for line in lines] == ["math-0-0"]
    assert "## Problems" in (out / "report.md").read_text() and (out / "report.png").stat().st_size > 5000
    settings = json.loads((out / "eval_settings.json").read_text())
    assert settings["python_timeout"] == 30 and settings["max_tokens"] == 4096 and settings["engine"] == "hf"
    # --resume runs nothing again (other settings are refused: prepare_output, tested with eval.swebench)
    mtimes = [(out / f"run_{k}" / "math-0-0" / "result.json").stat().st_mtime_ns for k in (0, 1)]
    r = subprocess.run(cmd + ["--resume"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and "resume: 2 finished rollout(s) kept" in r.stderr and "0 to run" in r.stderr
    assert [(out / f"run_{k}" / "math-0-0" / "result.json").stat().st_mtime_ns for k in (0, 1)] == mtimes
