"""`python -m eval.swebench --ckpt`: the agent run per instance, predictions, grading, reports.

Scripted engines (unit-test stand-ins for a model, as STYLE.md allows) make the outcome known:
one applies each task's gold patch through the `bash` tool (resolved 100%), one submits at
once (0%). The tiny model runs through the real CLI. Grading is checked against swebench's
own `get_eval_report` on saved logs of the built-in tasks (tests/data/eval_logs).
"""

import gzip
import json
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from agent.engines.base import Completion
from conftest import RUN_ID

ROOT = Path(__file__).resolve().parents[1]
LOGS = Path(__file__).parent / "data" / "eval_logs"
IDS = ["inflection__smith-1bcae7b7", "isodate__smith-9f2d3d29", "toolz__smith-7a9655cf"]


@pytest.fixture(scope="module")
def tiny():
    from agent.tiny_model import DEFAULT_DIR, build_tiny_model

    return str(build_tiny_model(DEFAULT_DIR))


@pytest.fixture(scope="module")
def tokenizer(tiny):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny)


@pytest.fixture(scope="module")
def tasks():
    from taskdata.load import load_tasks

    return load_tasks("builtin", instance_ids=IDS)


class Scripted:
    """Replays tool calls as the model would write them (hermes `<tool_call>` JSON), in the
    tiny tokenizer's ids: with `gold`, the task's gold patch applied by `git apply` and then
    submit; without, submit at once. The task is recognised by its problem statement."""

    version = 0

    def __init__(self, tokenizer, tasks, gold: bool):
        self.tokenizer, self.tasks, self.gold = tokenizer, tasks, gold
        self.eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
        self.calls = 0

    def _reply(self, name, arguments):
        text = "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.eos]
        return Completion(ids, [0.0] * len(ids), "stop")

    def generate(self, prompt_ids, sampling):
        self.calls += 1
        text = self.tokenizer.decode(prompt_ids)
        task = next(t for t in self.tasks if t.problem_statement.strip()[:200] in text)
        if self.gold and "<tool_response>" not in text:
            patch = task.patch if task.patch.endswith("\n") else task.patch + "\n"  # context lines may be " "
            command = f"cd /testbed && git apply <<'SAO_EOF'\n{patch}SAO_EOF"
            return self._reply("bash", {"command": command})
        return self._reply("submit", {})

    def update_weights(self, named_tensors, version):
        self.version = version


def evaluate(engine, tokenizer, tasks, out, runs=1, resume=False, max_workers=2):
    """The CLI's path after the engine is made (`evaluate_checkpoint`), with `engine` in its place."""
    from rich.console import Console

    from agent.engines.shared import SharedEngine
    from agent.loop import Agent, AgentConfig
    from envs.base import make_env
    from eval.agent_eval import evaluate_agent
    from eval.report import write_agent_reports
    from sandbox.pool import SandboxPool

    agent = Agent(SharedEngine(engine), tokenizer, AgentConfig(max_turns=4, max_new_tokens=2048))
    pool = SandboxPool(RUN_ID, max_live=2)
    try:
        records = evaluate_agent(agent, tasks, make_env("swe"), pool, out, runs=runs, max_workers=max_workers,
                                 resume=resume, model_name="scripted")
        return write_agent_reports(records, tasks, out, "scripted", "builtin", Console(stderr=True))
    finally:
        pool.close()


@pytest.mark.docker
def test_gold_engine_resolves_every_instance(tmp_path, docker_client, tokenizer, tasks):
    out = tmp_path / "gold"
    report = evaluate(Scripted(tokenizer, tasks, gold=True), tokenizer, tasks, out)
    assert report["resolved_rate"] == 1.0 and report["resolved_ids"] == sorted(IDS)
    assert report["pass_at_1_ci95"][1] == 1.0 and report["pass_at_1_ci95"][0] > 0.3  # Wilson, n = 3
    assert report["exit_reasons"] == {"submitted": 3} and report["turns"]["mean"] == 2
    predictions = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [p["instance_id"] for p in predictions] == IDS and all(p["model_patch"].strip() for p in predictions)
    assert {"instance_id", "model_name_or_path", "model_patch"} == set(predictions[0])
    from swebench.harness.utils import get_predictions_from_file

    assert get_predictions_from_file(str(out / "predictions.jsonl"), "unused", "test") == predictions
    # the predictions regrade to the same verdict through the --predictions path
    from eval.swebench import main

    assert main(["--dataset", "builtin", "--instance-ids", *IDS, "--predictions", str(out / "predictions.jsonl"),
                 "--run-id", RUN_ID, "--output", str(tmp_path / "regrade")]) == 0
    assert json.loads((tmp_path / "regrade" / "report.json").read_text())["resolved_ids"] == sorted(IDS)
    for iid in IDS:
        inst = out / "run_0" / iid
        assert json.loads((inst / "result.json").read_text())["status"] == "resolved"
        assert json.loads((inst / "report.json").read_text())[iid]["resolved"] is True
        assert (inst / f"{iid}.traj.json").exists() and (inst / "test_output.txt").exists()
    md = (out / "report.md").read_text()
    assert "resolved (pass@1): 100.0%" in md and "| inflection | 1 | 100.0% |" in md
    assert (out / "report.png").stat().st_size > 5000


@pytest.mark.docker
def test_empty_engine_resolves_nothing_over_two_runs(tmp_path, docker_client, tokenizer, tasks):
    out = tmp_path / "empty"
    report = evaluate(Scripted(tokenizer, tasks, gold=False), tokenizer, tasks[:2], out, runs=2)
    assert report["resolved_rate"] == 0.0 and report["runs"] == 2
    assert report["empty_patch_ids"] == sorted(IDS[:2]) and report["status_counts"] == {"empty_patch": 4}
    assert report["pass_at_1_ci95"][0] == 0.0 and 0 < report["pass_at_1_ci95"][1] < 1
    assert len(report["per_run"]) == 2 and (out / "run_1" / "predictions.jsonl").exists()


@pytest.mark.docker
def test_missing_image_is_an_error_with_its_name_and_the_run_goes_on(tmp_path, docker_client, tokenizer, tasks):
    # a hub-style row with no image and no local repo: swebench's instance image, not here
    ghost = replace(tasks[0], instance_id="nope__x-1", repo="nope/x", repo_path=None, image=None,
                    problem_statement="a ghost task " * 5)
    out = tmp_path / "missing"
    report = evaluate(Scripted(tokenizer, [tasks[0], ghost], gold=True), tokenizer, [tasks[0], ghost], out)
    assert report["error_ids"] == ["nope__x-1"] and report["resolved_ids"] == [tasks[0].instance_id]
    reason = report["error_reasons"]["nope__x-1"]
    assert "swebench/sweb.eval.x86_64.nope_1776_x-1:latest" in reason and "docker pull" in reason


class Failing(Scripted):
    """The gold engine, except that it fails on the first task (as an engine can: a request
    too long, a device fault)."""

    def generate(self, prompt_ids, sampling):
        if self.tasks[0].problem_statement.strip()[:200] in self.tokenizer.decode(prompt_ids):
            raise RuntimeError("engine fault on purpose")
        return super().generate(prompt_ids, sampling)


@pytest.mark.docker
def test_engine_error_is_recorded_and_the_run_goes_on(tmp_path, docker_client, tokenizer, tasks):
    out = tmp_path / "failing"
    # one worker: the shared engine fails every request of a batch together, and this test is about one
    report = evaluate(Failing(tokenizer, tasks[:2], gold=True), tokenizer, tasks[:2], out, max_workers=1)
    assert report["error_ids"] == [IDS[0]] and report["resolved_ids"] == [IDS[1]]
    assert report["error_reasons"][IDS[0]] == "RuntimeError: engine fault on purpose"
    assert "engine fault on purpose" in (out / "run_0" / IDS[0] / "error.txt").read_text()
    assert report["resolved_rate"] == 0.5 and "## Errors" in (out / "report.md").read_text()
    # resumed, the errored job runs again and resolves: its old error.txt does not outlive it
    engine = Scripted(tokenizer, tasks[:2], gold=True)
    report = evaluate(engine, tokenizer, tasks[:2], out, resume=True, max_workers=1)
    assert engine.calls == 2 and report["resolved_rate"] == 1.0 and report["error_ids"] == []
    assert not (out / "run_0" / IDS[0] / "error.txt").exists()


@pytest.mark.docker
def test_resume_runs_only_what_is_missing(tmp_path, docker_client, tokenizer, tasks, caplog):
    caplog.set_level("INFO", logger="eval.agent_eval")
    out = tmp_path / "resume"
    evaluate(Scripted(tokenizer, tasks[:2], gold=True), tokenizer, tasks[:2], out)
    kept = out / "run_0" / IDS[0] / "result.json"
    mtime = kept.stat().st_mtime_ns
    (out / "run_0" / IDS[1] / "result.json").unlink()  # as if the run died before it finished
    engine = Scripted(tokenizer, tasks[:2], gold=True)
    report = evaluate(engine, tokenizer, tasks[:2], out, resume=True)
    assert engine.calls == 2  # two turns of the one unfinished instance, none of the other
    assert kept.stat().st_mtime_ns == mtime and report["resolved_rate"] == 1.0
    assert "resume: 1 finished rollout(s) kept" in caplog.text and "1 to run" in caplog.text
    # the CLI refuses to mix a new evaluation into an old one
    r = subprocess.run([sys.executable, "-m", "eval.swebench", "--ckpt", str(ROOT / ".cache/models/tiny-qwen2"),
                        "--dataset", "builtin", "--output", str(out)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and "--resume" in r.stderr and "--overwrite" in r.stderr


@pytest.mark.docker
def test_mini_swe_agent_evaluates_through_the_cli(tmp_path, docker_client, tiny):
    """`--agent mini_swe`: mini-swe-agent runs each instance through the rollout endpoint; what
    it submitted (nothing, from the tiny model, which has not learnt its tool) is the prediction."""
    from agent.trajectory import Trajectory

    out = tmp_path / "mini"
    cmd = [sys.executable, "-m", "eval.swebench", "--ckpt", tiny, "--dataset", "builtin", "--agent", "mini_swe",
           "--instance-ids", IDS[0], "--engine", "hf", "--max-turns", "2", "--max-new-tokens", "16",
           "--max-tokens", "4096", "--run-id", RUN_ID, "--output", str(out)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "agent mini_swe:" in r.stderr and "pass@1 over 1 run(s)" in r.stderr
    traj = Trajectory.load(out / "run_0" / IDS[0] / f"{IDS[0]}.traj.json")
    assert traj.info["agent"] == "mini_swe" and 1 <= traj.turns <= 2 and traj.num_sampled > 0
    assert "<pr_description>" in __import__("transformers").AutoTokenizer.from_pretrained(tiny).decode(traj.prompt_ids)
    assert traj.exit_reason in {"submitted", "max_turns", "format_errors", "context_full"}
    report = json.loads((out / "report.json").read_text())
    assert report["total_instances"] == 1 and json.loads((out / "eval_settings.json").read_text())["agent"] == "mini_swe"


@pytest.mark.docker
def test_tiny_model_end_to_end_through_the_cli(tmp_path, docker_client, tiny):
    from agent.trajectory import Trajectory

    out = tmp_path / "tiny"
    cmd = [sys.executable, "-m", "eval.swebench", "--ckpt", tiny, "--dataset", "builtin",
           "--instance-ids", *IDS[:2], "--engine", "hf", "--max-turns", "2", "--max-new-tokens", "24",
           "--max-tokens", "4096", "--run-id", RUN_ID, "--output", str(out)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "pass@1 over 1 run(s)" in r.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["total_instances"] == 2 and report["submitted_instances"] == 2
    assert sum(report["status_counts"].values()) == 2 and 0.0 <= report["resolved_rate"] <= 1.0
    assert set(report["exit_reasons"]) <= {"submitted", "max_turns", "context_full", "format_errors"}
    assert 1 <= report["turns"]["mean"] <= 2 and report["sampled_tokens"]["max"] <= 2 * 24
    lines = (out / "predictions.jsonl").read_text().splitlines()
    assert [json.loads(line)["model_name_or_path"] for line in lines] == [tiny, tiny]
    for iid in IDS[:2]:
        traj = Trajectory.load(out / "run_0" / iid / f"{iid}.traj.json")
        assert traj.num_sampled > 0 and traj.turns >= 1 and traj.info["model"] == tiny
    md = (out / "report.md").read_text()
    assert "## By repository" in md and "95% interval" in md and (out / "report.png").stat().st_size > 5000
    settings = json.loads((out / "eval_settings.json").read_text())
    assert settings["max_tokens"] == 4096 and settings["engine"] == "hf" and settings["test_timeout"] == 1800
    import torch

    cuda = torch.cuda.is_available()  # --device and --dtype auto: the hf engine on what this machine has
    assert (settings["device"], settings["dtype"]) == (("cuda", "bfloat16") if cuda else ("cpu", "float32"))
    # the same command with --resume runs nothing again: the results stay as they were
    mtimes = [(out / "run_0" / iid / "result.json").stat().st_mtime_ns for iid in IDS[:2]]
    r = subprocess.run(cmd + ["--resume"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resume: 2 finished rollout(s) kept" in r.stderr and "0 to run" in r.stderr
    assert [(out / "run_0" / iid / "result.json").stat().st_mtime_ns for iid in IDS[:2]] == mtimes
    assert json.loads((out / "report.json").read_text())["resolved_ids"] == report["resolved_ids"]
    # other settings are refused on --resume, not mixed in
    r = subprocess.run([*cmd[:-2], "--max-turns", "3", "--output", str(out), "--resume"], cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 2 and "max_turns: 2 -> 3" in r.stderr


def test_bad_checkpoint_is_named(tmp_path):
    def cli(ckpt):
        return subprocess.run([sys.executable, "-m", "eval.swebench", "--ckpt", str(ckpt), "--dataset", "builtin",
                               "--output", str(tmp_path / "o")], cwd=ROOT, capture_output=True, text=True)

    r = cli(tmp_path / "nothing")
    assert r.returncode == 2 and "nothing: no such directory" in r.stderr
    (tmp_path / "empty").mkdir()
    r = cli(tmp_path / "empty")
    assert r.returncode == 2 and "no config.json" in r.stderr


def test_image_for_a_task(tasks):
    from envs.swe import SWEEnv

    env, local = SWEEnv(), tasks[0]
    assert env.image_for(replace(local, image="mine:1")) == "mine:1"  # the row's own image first
    assert env.image_for(local) == "sao-sandbox:bookworm"  # a local repository is copied into the base image
    hub = replace(local, instance_id="django__django-11099", repo="django/django", repo_path=None)
    assert env.image_for(hub) == "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"


def test_checkpoint_paths(tmp_path):
    from eval.swebench import UsageError, resolve_checkpoint

    run = tmp_path / "train"
    for step in (2, 10):
        (run / "checkpoints" / f"step_{step}" / "policy").mkdir(parents=True)
        (run / "checkpoints" / f"step_{step}" / "policy" / "config.json").write_text("{}")
    step10 = str(run / "checkpoints" / "step_10" / "policy")
    assert resolve_checkpoint(step10) == step10
    assert resolve_checkpoint(str(run / "checkpoints" / "step_10")) == step10  # a training checkpoint
    assert resolve_checkpoint(str(run)) == step10  # a training output: its newest checkpoint (10 > 2)
    assert resolve_checkpoint("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"  # a hub name
    with pytest.raises(UsageError, match="no such directory"):
        resolve_checkpoint("./missing")


def test_output_refuses_to_mix_evaluations(tmp_path):
    from eval.agent_eval import OutputError, prepare_output

    settings = {"model": "m", "max_turns": 2}
    prepare_output(tmp_path, settings)
    (tmp_path / "run_0" / "a").mkdir(parents=True)
    (tmp_path / "run_0" / "a" / "result.json").write_text("{}")
    with pytest.raises(OutputError, match="--resume to continue it or --overwrite"):
        prepare_output(tmp_path, settings)
    prepare_output(tmp_path, settings, resume=True)  # same settings: fine
    with pytest.raises(OutputError, match="model: 'm' -> 'n'"):
        prepare_output(tmp_path, {**settings, "model": "n"}, resume=True)
    prepare_output(tmp_path, {**settings, "model": "n"}, overwrite=True)
    assert not (tmp_path / "run_0").exists()
    assert json.loads((tmp_path / "eval_settings.json").read_text())["model"] == "n"


def test_interval_by_hand():
    from eval.agent_eval import RolloutRecord
    from eval.report import pass_at_1, wilson

    def runs(*rows):  # rows[run] = resolved flags per instance
        return [[RolloutRecord(k, str(i), "resolved" if ok else "unresolved") for i, ok in enumerate(row)]
                for k, row in enumerate(rows)]

    # 2 runs x 4 instances: p_i = [1, .5, .5, 0], mean .5, sd = sqrt(((.5)^2 * 2) / 3) = .4082,
    # SE = .4082 / 2 = .2041, half-width 1.96 * .2041 = .4001
    rate, (lo, hi), rates = pass_at_1(runs([1, 1, 0, 0], [1, 0, 1, 0]))
    assert rates == [1.0, 0.5, 0.5, 0.0] and rate == 0.5
    assert lo == pytest.approx(0.5 - 0.4001, abs=1e-4) and hi == pytest.approx(0.5 + 0.4001, abs=1e-4)
    # every instance solved: SE 0, so Wilson for n = 3: [3 / (3 + 1.96^2), 1] = [0.4385, 1]
    rate, (lo, hi), _ = pass_at_1(runs([1, 1, 1]))
    assert rate == 1.0 and (lo, hi) == wilson(1.0, 3) and lo == pytest.approx(0.4385, abs=1e-4) and hi == 1.0


def _swebench_direct(row: dict, log: str, patch: str) -> dict:
    """swebench's own grading of a log, from the raw dataset row (none of our code)."""
    from swebench.harness.grading import get_eval_report
    from swebench.harness.utils import make_test_spec

    spec = make_test_spec({**row, "image": "unused", "eval_script": "true", "eval_type": row.get("eval_type"),
                           "log_parser": row.get("log_parser") or "parse_log_pytest"})
    with tempfile.NamedTemporaryFile("w", suffix=".log") as f:
        f.write(log)
        f.flush()
        prediction = {"instance_id": row["instance_id"], "model_name_or_path": "x", "model_patch": patch}
        return get_eval_report(spec, prediction, f.name, include_tests_status=True)[row["instance_id"]]


@pytest.mark.parametrize("path", sorted(LOGS.glob("*.log.gz")), ids=lambda p: p.name.removesuffix(".log.gz"))
def test_grading_agrees_with_swebench_on_saved_logs(path):
    from envs.swe import SWEEnv

    iid, kind = path.name.removesuffix(".log.gz").rsplit(".", 1)
    rows = [json.loads(line) for line in (ROOT / "taskdata/builtin/tasks.jsonl").read_text().splitlines()]
    row = next(r for r in rows if r["instance_id"] == iid)
    from taskdata.load import load_tasks

    task = load_tasks("builtin", instance_ids=[iid])[0]
    log = gzip.decompress(path.read_bytes()).decode()
    # the saved log, and the same log cut before the tests' end (a suite that did not finish)
    for text in (log, log[: len(log) // 2]):
        ours = SWEEnv().read_log(task, text, task.patch)
        theirs = _swebench_direct(row, text, task.patch)
        assert ours.resolved == theirs["resolved"]
        assert ours.report == theirs  # the whole report: status of each test, apply flag, resolved
    assert ours.resolved is False  # a cut log never resolves
    full = SWEEnv().read_log(task, log, task.patch)
    assert full.resolved == (kind == "gold")
    # and as it was graded when the log was made (tests/data/eval_logs/make_logs.py)
    expected = json.loads((LOGS / "expected.json").read_text())[f"{iid}.{kind}"]
    statuses = {s: sum(v == s for v in full.tests_status.values()) for s in sorted(set(full.tests_status.values()))}
    assert {"resolved": full.resolved, "statuses": statuses} == expected


class Crashing(Scripted):
    """The gold engine, except that while the agent works on the first task its container is
    killed from outside (as a node losing a container would), before the model's reply."""

    def __init__(self, *args, docker_client, **kwargs):
        super().__init__(*args, **kwargs)
        self.docker = docker_client

    def generate(self, prompt_ids, sampling):
        if self.tasks[0].problem_statement.strip()[:200] in self.tokenizer.decode(prompt_ids):
            # one worker: the only live container of this run is this rollout's
            for ct in self.docker.containers.list(filters={"label": f"sao.run_id={RUN_ID}"}):
                ct.kill()
        return super().generate(prompt_ids, sampling)


@pytest.mark.docker
def test_sandbox_crash_is_recorded_and_the_run_goes_on(tmp_path, docker_client, tokenizer, tasks):
    out = tmp_path / "crash"
    engine = Crashing(tokenizer, tasks[:2], gold=True, docker_client=docker_client)
    report = evaluate(engine, tokenizer, tasks[:2], out, max_workers=1)
    assert report["error_ids"] == [IDS[0]] and report["resolved_ids"] == [IDS[1]]
    assert report["error_reasons"][IDS[0]].startswith("SandboxError"), report["error_reasons"]
    result = json.loads((out / "run_0" / IDS[0] / "result.json").read_text())
    assert result["status"] == "error" and result["exit_reason"] == "sandbox_error"


def test_run_report_agrees_with_swebench(tmp_path, monkeypatch):
    """The same outcomes and logs, reported by swebench 5's `make_run_report` (from its own log
    layout) and by ours: every key of theirs, with the same value, failure classification too."""
    from swebench.harness.reporting import make_run_report

    from eval.grading import InstanceOutcome
    from eval.report import run_report

    # id: (status, test_output.txt, the run's log: swebench's run_instance.log, our error.txt)
    cases = {
        "a__resolved-1": ("resolved", "Killed\n", None),  # resolved: never classified
        "b__nothing_ran-1": ("unresolved", "============ collected 0 items\n", None),
        "c__wrong-1": ("unresolved", "FAILED test_x.py::test_y\n", None),
        "d__daemon-1": ("error", None, "Cannot connect to the Docker daemon at unix:///var/run/docker.sock\n"),
        "e__oom-1": ("unresolved", "Killed\n", None),
        "f__empty-1": ("empty_patch", None, None),
        "g__missing-1": ("error", None, "ModuleNotFoundError: No module named 'x'\n"),
    }
    tasks = [replace(_bare_task(), instance_id=iid) for iid in [*cases, "h__no_prediction-1"]]
    predictions = {iid: {"instance_id": iid, "model_name_or_path": "m",
                         "model_patch": "" if status == "empty_patch" else "diff"}
                   for iid, (status, _, _) in cases.items()}
    monkeypatch.chdir(tmp_path)  # swebench reads logs/run_evaluation/<run>/<model>/<id>/ under the cwd
    ours, outcomes = tmp_path / "ours", []
    for iid, (status, test_output, run_log) in cases.items():
        theirs = tmp_path / "logs" / "run_evaluation" / "r" / "m" / iid
        for d in (theirs, ours / iid):
            d.mkdir(parents=True)
            if test_output is not None:
                (d / "test_output.txt").write_text(test_output)
        if status in ("resolved", "unresolved"):
            (theirs / "report.json").write_text(json.dumps({iid: {"resolved": status == "resolved"}}))
        if run_log is not None:
            (theirs / "run_instance.log").write_text(run_log)
            (ours / iid / "error.txt").write_text(run_log)
        outcomes.append(InstanceOutcome(iid, status, error=run_log.strip() if run_log else None))
    outcomes.append(InstanceOutcome("h__no_prediction-1", "incomplete"))
    path = make_run_report(predictions, [{"instance_id": t.instance_id} for t in tasks], "r",
                           report_dir=str(tmp_path / "theirs"))
    theirs = json.loads(Path(path).read_text())
    report = run_report(tasks, predictions, outcomes, ours)
    assert {k: report[k] for k in theirs} == theirs
    assert theirs["infra_failure_ids"] == ["d__daemon-1", "e__oom-1"]
    assert theirs["ambiguous_failure_ids"] == ["b__nothing_ran-1", "g__missing-1"]
    assert theirs["failure_reasons"]["d__daemon-1"] == "container_unavailable"


def _bare_task():
    from envs.base import Task

    return Task(instance_id="x", repo="o/r", base_commit="abc", problem_statement="p")


def cli_args(*extra):
    from eval.swebench import parse_args

    return parse_args(["--ckpt", "m", "--dataset", "builtin", *extra])


@pytest.mark.parametrize("cuda", [False, True], ids=["cpu", "cuda"])
def test_engine_options_follow_the_machine(monkeypatch, cuda):
    """`auto` options resolve to what this machine can run a real-size model with: bfloat16 and
    90% of the GPU for vLLM where CUDA is (the evaluation has it to itself), else float32."""
    import torch

    from eval.swebench import engine_options

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    dtype = "bfloat16" if cuda else "float32"
    assert engine_options(cli_args(), "hf", 4096) == {"device": "cuda" if cuda else "cpu", "dtype": dtype}
    assert engine_options(cli_args(), "vllm", 4096) == {"dtype": dtype, "max_model_len": 4096,
                                                        "gpu_memory_utilization": 0.9 if cuda else 0.15}
    asked = cli_args("--dtype", "float16", "--gpu-memory-utilization", "0.5", "--device", "cpu")
    assert engine_options(asked, "vllm", 8) == {"dtype": "float16", "max_model_len": 8, "gpu_memory_utilization": 0.5}
    assert engine_options(asked, "hf", 8) == {"device": "cpu", "dtype": "float16"}


def test_engine_options_refuse_a_device_this_machine_lacks(monkeypatch):
    import torch

    from eval.swebench import UsageError, engine_options

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UsageError, match="--device 'cuda:1': CUDA is not available"):
        engine_options(cli_args("--device", "cuda:1"), "hf", 8)
    with pytest.raises(UsageError, match="--device 'gpu': not a torch device"):
        engine_options(cli_args("--device", "gpu"), "hf", 8)


def test_cli_defaults_and_resume_settings(tmp_path):
    from eval.agent_eval import OutputError, prepare_output
    from eval.swebench import run_settings
    from sandbox.base import Limits

    args = cli_args()
    assert args.test_timeout == 1800.0 and args.cpus == Limits.cpus  # swebench's test timeout
    assert cli_args("--cpus", "4", "--memory-mb", "8192").cpus == 4.0
    options = {"dtype": "float32", "max_model_len": 64, "gpu_memory_utilization": 0.15}
    settings = run_settings(args, "m", "vllm", 64, options)
    assert {k: settings[k] for k in ("engine", "dtype", "test_timeout", "rollout_timeout", "gpu_memory_utilization")} \
        == {"engine": "vllm", "dtype": "float32", "test_timeout": 1800.0, "rollout_timeout": 3600.0,
            "gpu_memory_utilization": 0.15}
    assert "max_model_len" not in settings and settings["max_tokens"] == 64
    prepare_output(tmp_path, settings)
    (tmp_path / "run_0" / "a").mkdir(parents=True)
    (tmp_path / "run_0" / "a" / "result.json").write_text("{}")
    # another share of GPU memory changes no result: a resume may take it
    prepare_output(tmp_path, {**settings, "gpu_memory_utilization": 0.5}, resume=True)
    for key, value in (("test_timeout", 600.0), ("rollout_timeout", 60.0), ("engine", "hf"), ("dtype", "bfloat16")):
        with pytest.raises(OutputError, match=f"{key}: .* -> {value!r}"):
            prepare_output(tmp_path, {**settings, key: value}, resume=True)
