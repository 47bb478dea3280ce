"""The small verifiable envs, graded through the real `answer` tool in a real sandbox."""

import pytest

from agent.tools import ToolBox
from envs.arith import ArithEnv, make_arith_tasks
from envs.prefer import PreferEnv, make_prefer_tasks

pytestmark = pytest.mark.docker


def answer(sandbox, value):
    result = ToolBox(sandbox, tools=("answer",)).run("answer", {"value": value})
    assert result.submitted and not result.error


def test_arith_grades_the_answer_written_by_the_tool(make_sandbox):
    env, task = ArithEnv(), make_arith_tasks(1, seed=3)[0]
    a, op, b = task.problem_statement.removeprefix("What is ").rstrip("?").split()
    assert task.extra["answer"] == str(eval(f"{a}{op}{b}"))
    sb = make_sandbox()
    assert env.reset(task, sb) == task.problem_statement
    assert env.grade(task, sb).empty_patch  # nothing answered yet
    answer(sb, task.extra["answer"])
    assert env.grade(task, sb).reward == 1.0
    answer(sb, "-1")
    assert env.grade(task, sb).reward == 0.0


def test_prefer_rewards_the_hidden_digit_and_can_drift(make_sandbox):
    task = make_prefer_tasks(1)[0]
    sb = make_sandbox()
    answer(sb, "7")
    assert PreferEnv().grade(task, sb).reward == 1.0
    drifting = PreferEnv(preferred="7,3", switch_every=2)
    assert [drifting.grade(task, sb).reward for _ in range(5)] == [1.0, 1.0, 0.0, 0.0, 1.0]
    assert drifting.current() == "7"  # 5 graded: the third phase, back to the first digit
