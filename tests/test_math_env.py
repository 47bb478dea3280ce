"""The math env (envs/math.py, taskdata/math.py): math-verify's verdicts on tricky answers, the
python tool's notebook state in a real sandbox, a scripted engine that solves a problem through
it (reward 1), the data sources and their bad rows, the experiment's settings."""

import json
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from taskdata.rows import DatasetError
from envs.math import MathEnv, Notebook, Verifier, judge
from taskdata.math import BENCHMARKS, load_math_tasks, make_math_tasks

DATA = Path(__file__).parent / "data"

SAME = [  # (expected, given): math-verify finds them equal
    ("70", "070"), ("70", "\\boxed{70}"), ("70", "70.0"), ("1,000", "1000"), ("-3", "- 3"),
    ("\\frac{1}{2}", "0.5"), ("\\frac{1}{2}", "\\dfrac12"), ("\\frac{2}{3}", "2/3"), ("2^{10}", "1024"),
    ("\\{2, 3\\}", "{3, 2}"), ("\\{-5, 0\\}", "0, -5"),
    ("\\left(\\frac{7}{3}, \\infty\\right)", "(7/3, \\infty)"),
    ("(-\\infty, 2) \\cup (3, \\infty)", "(3,\\infty)\\cup(-\\infty,2)"),
    ("x^2+5x+6", "(x+2)(x+3)"), ("6\\sqrt{2}", "\\sqrt{72}"), ("6\\sqrt{2}", "6*sqrt(2)"),
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"), ("\\pi/2", "\\frac{\\pi}{2}"), ("3", "x = 3"),
    ("$\\frac{3}{4}$", "The answer is $0.75$."),
]
DIFFERENT = [  # and not
    ("70", "71"), ("-3", "3"), ("\\frac{2}{3}", "0.67"), ("\\frac{1}{2}", "0.51"), ("\\{2, 3\\}", "2"),
    ("\\{2, 3\\}", "\\{2, 3, 4\\}"), ("(4, \\infty)", "[4, \\infty)"), ("[-1, 1]", "[-1, 1)"),
    ("(1, 2)", "(2, 1)"), ("x^2+5x+6", "(x+2)(x+4)"), ("6\\sqrt{2}", "6\\sqrt{3}"), ("6\\sqrt{2}", "8.485"),
    ("3", "hello"), ("3", ""),
]


@pytest.mark.parametrize("expected,given", SAME)
def test_math_verify_finds_equal_answers(expected, given):
    assert judge(expected, given)["correct"] is True


@pytest.mark.parametrize("expected,given", DIFFERENT)
def test_math_verify_tells_different_answers_apart(expected, given):
    verdict = judge(expected, given)
    assert verdict["correct"] is False and "error" not in verdict


def test_verifier_process_from_threads_and_its_faults():
    """math-verify's own timeouts need a main thread: the verifier's process gives it one,
    whatever thread grades; an expected answer it cannot read and a grader that does not answer
    in time are said, and earn nothing."""
    verifier = Verifier()
    try:
        pairs = SAME[:4] + DIFFERENT[:4]
        with ThreadPoolExecutor(4) as ex:
            verdicts = list(ex.map(lambda p: verifier.check(*p), pairs))
        assert [v.correct for v in verdicts] == [True] * 4 + [False] * 4
        assert verdicts[0].expected == "70" and verdicts[4].given == "71"
        unreadable = verifier.check("", "3")
        assert not unreadable.correct and "cannot read the expected answer" in unreadable.error
    finally:
        verifier.close()
    slow = Verifier(timeout_s=0.001)  # no process answers within a millisecond of its start
    try:
        verdict = slow.check("1", "1")
        assert not verdict.correct and "took over 0.001s" in verdict.error and slow._proc is None
        slow.timeout_s = 60
        assert slow.check("1", "1").correct  # a fresh process after the stopped one
    finally:
        slow.close()


def test_builtin_problems_are_seeded_and_their_code_prints_the_answer():
    tasks = make_math_tasks(18, seed=3)
    assert [t.problem_statement for t in tasks] == [t.problem_statement for t in make_math_tasks(18, seed=3)]
    assert [t.problem_statement for t in tasks] != [t.problem_statement for t in make_math_tasks(18, seed=4)]
    assert len({t.extra["kind"] for t in tasks}) == 9 and len({t.instance_id for t in tasks}) == 18
    env = MathEnv()
    same = make_math_tasks(9, seed=random.Random(3).randrange(1 << 30))  # the demonstrations' draw
    for demo, task in zip(env.demonstrations(9, random.Random(3), seed=3), same):
        printed = demo[2]["content"]  # what the generator's code prints: the answer, in Python's words
        assert demo[1]["tool_calls"][0]["function"]["arguments"]["code"] == task.extra["code"]
        assert demo[3]["tool_calls"][0]["function"]["arguments"]["value"] == printed
        assert judge(task.extra["answer"], printed)["correct"], (task.extra, printed)
    assert load_math_tasks("builtin:3", limit=5) == tasks[:5]
    with pytest.raises(DatasetError, match="builtin:SEED"):
        load_math_tasks("builtin:x")


def test_files_map_their_fields_and_bad_rows_name_file_row_and_field(tmp_path):
    rows = [{"id": "a", "problem": "1 + 1?", "answer": 2}, {"question": "Half of 1?", "answer": "\\frac12"},
            {"Problem ID": "imo-1", "Problem": "x?", "Short Answer": "$3$", "Category": "Algebra"}]
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = load_math_tasks(path)
    assert [t.instance_id for t in tasks] == ["a", "mine-1", "imo-1"]
    assert [t.extra["answer"] for t in tasks] == ["2", "\\frac12", "$3$"] and tasks[2].extra["Category"] == "Algebra"
    assert tasks[1].problem_statement == "Half of 1?" and tasks[0].repo == "mine"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"problem_idx": 7, "problem": "p", "answer": "1"}]), tmp_path / "m.parquet")
    assert load_math_tasks(tmp_path / "m.parquet")[0].instance_id == "7"
    (tmp_path / "m.json").write_text(json.dumps(rows[:1]))
    assert load_math_tasks(tmp_path / "m.json", ids=["a"])[0].extra["answer"] == "2"

    def bad(row, *more):
        f = tmp_path / "bad.jsonl"
        f.write_text("".join(json.dumps(r) + "\n" for r in [rows[0], row, *more]))
        with pytest.raises(DatasetError) as e:
            load_math_tasks(f)
        assert f"{f}: row 1" in str(e.value)
        return str(e.value)

    assert "no answer field" in bad({"id": "b", "problem": "?"})
    no_problem = bad({"id": "b", "answer": "1"})
    assert "no problem field" in no_problem and "the row has answer, id" in no_problem
    assert "field 'problem' must be a non-empty string" in bad({"id": "b", "problem": " ", "answer": "1"})
    assert "field 'answer' must be a non-empty string or a number" in bad({"id": "b", "problem": "?", "answer": [1]})
    assert "field 'id' must be" in bad({"id": 1.5, "problem": "?", "answer": "1"})
    assert "not an object" in bad([1, 2])
    assert "id 'a' repeats row 0" in bad({"id": "a", "problem": "?", "answer": "1"})
    with pytest.raises(DatasetError, match="ids not in the dataset: zz"):
        load_math_tasks(path, ids=["zz"])


def test_benchmarks_by_name_map_their_hub_fields(monkeypatch):
    import taskdata.math

    cards = [json.loads(line) for line in (DATA / "math_hub_rows.jsonl").read_text().splitlines()]
    asked = []

    def hub_rows(name, split, what):  # the hub's rows, as each dataset card shows them (no hub here)
        asked.append((name, split))
        return [c["row"] for c in cards if c["dataset"] == name]

    monkeypatch.setattr(taskdata.math, "_hub_rows", hub_rows)
    aime = load_math_tasks("aime25")
    assert [(t.instance_id, t.extra["answer"]) for t in aime] == [("1", "45"), ("2", "1024")]
    assert aime[0].repo == "MathArena/aime_2025" and aime[0].extra["problem_type"] == ["Number Theory"]
    assert load_math_tasks("beyondaime")[0].instance_id == "ByteDance-Seed/BeyondAIME-0"  # no id: the row's number
    assert load_math_tasks("MathArena/hmmt_nov_2025")[0].extra["answer"] == "\\frac{5}{6}"  # by its hub name too
    imo = load_math_tasks("imo_answerbench")[0]
    assert (imo.instance_id, imo.problem_statement, imo.extra["answer"]) == (
        "imo-bench-algebra-001", "Find all real $x$ with $x^2 = 4$.", "$\\{-2, 2\\}$")
    assert judge(imo.extra["answer"], "2, -2")["correct"]
    assert asked == [("MathArena/aime_2025", "train"), ("ByteDance-Seed/BeyondAIME", None),
                     ("MathArena/hmmt_nov_2025", "train"), ("Hwilner/imo-answerbench", "train")]
    assert {b.runs for k, b in BENCHMARKS.items() if k != "beyondaime"} == {16} and BENCHMARKS["beyondaime"].runs == 4


def test_math_tir_experiment_has_the_papers_math_settings():
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from training.config import check

    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["+experiment=math_tir"])
    check(cfg)
    c = OmegaConf.to_container(cfg, resolve=True)
    algo = c["algo"]
    assert algo["_target_"] == "training.algos.SAO" and (algo["eps_low"], algo["eps_high"]) == (0.3, 5.0)
    assert algo["critic_steps"] == 2 and (algo["lr_critic"], algo["lr_policy"]) == (5e-6, 1e-6)
    assert c["model"]["algo_overrides"] == {} and c["model"]["path"].startswith("Qwen/Qwen3")
    assert c["trainer"]["batch_size"] == 128 and c["trainer"]["group_size"] == 1  # 128 x 1
    assert c["agent"]["max_turns"] == 50 and c["agent"]["max_tokens"] == 131072
    assert c["engine"]["options"]["max_model_len"] == 131072
    assert [s["env"] for s in c["sources"]] == ["math"] and c["held_out"]["env"] == "math"
    from hydra.utils import instantiate

    assert len(instantiate(cfg.sources[0].tasks)) > 0


@pytest.mark.docker
def test_python_tool_keeps_state_like_a_notebook(make_sandbox):
    from agent.tools import ToolBox

    sb = make_sandbox()
    env = MathEnv(timeout_s=1)
    task = make_math_tasks(6)[5]  # the set of roots of a quadratic
    tools = ToolBox(sb, tools=env.tools, handlers=env.tool_handlers(task, sb))

    def py(code):
        result = tools.run("python", {"code": code})
        assert not result.error and not result.submitted
        return result.output

    assert py("import math\nx = 6 * 7\nprint('set', file=__import__('sys').stderr)") == "set"
    assert py("def f(n):\n    return math.factorial(n) + x\nf(3)") == "48"  # the last expression is shown
    assert py("x = x + 1") == "(no output)"
    out = py("y = x\n1 / 0")
    assert "ZeroDivisionError" in out and 'File "<cell 4>", line 2' in out
    assert py("y") == "43"  # what ran before the error is kept, as a notebook keeps it
    out = py("x = -1\nwhile True:\n    pass")
    assert "ran past its 1s limit" in out and "not kept" in out
    assert py("x") == "43"  # the stopped cell is not replayed
    assert "SyntaxError" in py("def g(:")
    assert tools.run("python", {"code": "  "}).error  # an empty cell is the model's mistake
    # the answer tool, graded by math-verify: Python's set for the expected LaTeX set
    assert env.grade(task, sb).empty_patch
    roots = py(task.extra["code"])
    assert roots.startswith("{") and roots != task.extra["answer"]
    assert tools.run("answer", {"value": roots}).submitted
    graded = env.grade(task, sb)
    assert graded.reward == 1.0 and graded.report["given"] == roots
    tools.run("answer", {"value": "\\{1, 2\\}"})
    assert env.grade(task, sb).reward == 0.0


class SolvesWithPython:
    """A scripted engine (a unit-test stand-in for a model): its first turn runs the problem's
    code (the task is told by its problem in the prompt) with the python tool, its second
    answers with what the tool printed, read back from the prompt the agent loop built."""

    version = 0

    def __init__(self, tokenizer, tasks):
        self.tok, self.tasks, self.turns = tokenizer, tasks, 0

    def generate(self, prompt_ids, sampling):
        from agent.engines.base import Completion
        from test_agent_loop import call

        self.turns += 1
        text = self.tok.decode(prompt_ids)
        if "<tool_response>" not in text:
            code = next(t.extra["code"] for t in self.tasks if t.problem_statement in text)
            reply = "I will compute it.\n" + call("python", code=code)
        else:
            printed = text.rsplit("<tool_response>", 1)[1].split("</tool_response>", 1)[0].strip()
            reply = call("answer", value=printed)
        ids = self.tok.encode(reply, add_special_tokens=False) + [self.tok.convert_tokens_to_ids(self.tok.eos_token)]
        return Completion(ids, [-0.5] * len(ids), "stop")


@pytest.mark.docker
def test_a_scripted_engine_solves_a_problem_through_the_python_tool(docker_client):
    from transformers import AutoTokenizer

    from agent.loop import Agent, AgentConfig
    from agent.rollout import rollout_and_grade
    from agent.tiny_model import build_tiny_model
    from conftest import RUN_ID
    from sandbox.pool import SandboxPool

    tok = AutoTokenizer.from_pretrained(build_tiny_model())
    task = make_math_tasks(7)[6]  # an interval: Python prints (t, \infty) for \left(t, \infty\right)
    engine = SolvesWithPython(tok, [task])
    pool = SandboxPool(RUN_ID, max_live=1)
    try:
        traj = rollout_and_grade(Agent(engine, tok, AgentConfig(max_turns=4)), task, MathEnv(), pool)
    finally:
        pool.close()
    assert traj.exit_reason == "submitted" and traj.turns == 2 and traj.reward == 1.0
    report = traj.info["grade"]["report"]
    assert report["expected"] == task.extra["answer"] and report["given"] != report["expected"]
    tool = [m for m in traj.messages if m["role"] == "tool"]
    assert tool[0]["name"] == "python" and tool[0]["content"] == report["given"]
    traj.check()
