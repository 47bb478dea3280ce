"""The small verifiable envs, graded through their real tools in a real sandbox."""

import random

import pytest
from transformers import AutoTokenizer

from agent.chat import ChatRenderer
from agent.loop import Agent, AgentConfig
from agent.rollout import rollout_and_grade
from agent.tiny_model import build_tiny_model
from agent.tools import ToolBox, load_definitions
from envs.arith import ArithEnv, make_arith_tasks
from envs.guess import GuessEnv, make_guess_tasks
from envs.prefer import PreferEnv, make_prefer_tasks
from envs.seek import SeekEnv, make_seek_tasks, replay
from sandbox.pool import SandboxPool
from test_agent_loop import ScriptedEngine, call
from training.sft import encode_demo

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


def play(env, task, sandbox, strategy):
    """Guesses through the env's own tool until the game ends; the observations."""
    env.reset(task, sandbox)
    tools = ToolBox(sandbox, tools=env.tools, handlers=env.tool_handlers(task, sandbox))
    low, high, seen = task.extra["low"], task.extra["high"], []
    while True:
        result = tools.run("guess", {"value": str(strategy(low, high))})
        assert not result.error
        seen.append(result.output)
        if result.submitted:
            return seen
        low, high = map(int, result.output.split("between ")[1].split(".")[0].split(" and "))


def test_guess_rewards_finding_the_number_within_its_turns(make_sandbox):
    env, sb = GuessEnv(turns=3), make_sandbox()
    for task in make_guess_tasks(3, seed=5) + [make_guess_tasks(1, seed=0, low=1, high=15)[0]]:
        seen = play(env, task, sb, lambda lo, hi: (lo + hi) // 2)  # the middle: never more than log2(n + 1)
        assert seen[-1] == f"Correct: the number is {task.extra['secret']}."
        assert env.grade(task, sb).reward == 1.0
    task = next(t for t in make_guess_tasks(20, seed=1) if t.extra["secret"] > 4)
    seen = play(env, task, sb, lambda lo, hi: lo)  # from the bottom up: out of guesses
    assert len(seen) == 3 and seen[0].startswith("Higher: it is between 2 and 7. 2 guess(es) left")
    assert seen[-1].endswith(f"No guesses left: the number was {task.extra['secret']}.")
    graded = env.grade(task, sb)
    assert graded.reward == 0.0 and graded.report["guesses"] == [1, 2, 3]
    # a guess that is not a number is the model's mistake: an error observation, no turn spent
    env.reset(task, sb)
    tools = ToolBox(sb, tools=env.tools, handlers=env.tool_handlers(task, sb))
    bad = tools.run("guess", {"value": "seven"})
    assert bad.error and not bad.submitted and "whole number" in bad.output
    assert tools.run("guess", {"value": "1"}).output.endswith("2 guess(es) left.")
    assert env.grade(task, sb).empty_patch is False and env.grade(task, sb).reward == 0.0


def test_a_guess_rollout_through_the_agent_loop_is_graded(docker_client):
    tok = AutoTokenizer.from_pretrained(build_tiny_model())
    task = make_guess_tasks(1, seed=7)[0]
    secret = task.extra["secret"]
    turns = [call("guess", value="4"), "no call here", call("guess", value=str(secret))]
    pool = SandboxPool("pytest-guess", max_live=2)
    try:
        traj = rollout_and_grade(Agent(ScriptedEngine(tok, turns), tok, AgentConfig(max_turns=6)), task, GuessEnv(), pool)
    finally:
        pool.close()
    assert traj.exit_reason == "submitted" and traj.turns == 3 and traj.reward == 1.0
    assert traj.info["grade"]["report"]["guesses"] == [4, secret]
    observations = [m["content"] for m in traj.messages if m["role"] == "tool"]
    assert observations[0].startswith(("Higher: it is between 5", "Lower: it is between 1", "Correct"))


def test_demonstrations_are_tokenised_as_the_loop_builds_a_rollout():
    """SFT's guess games: random guesses inside the range left (about 68% found, as the odds
    say), each assistant turn in the loss, the observations between them out of it."""
    env = GuessEnv()
    games = env.demonstrations(400, random.Random(3), seed=3)
    found = sum(m["content"].startswith("Correct") for g in games for m in g if m["role"] == "tool") / len(games)
    assert 0.58 < found < 0.78  # 0.678 for a uniform secret from 1 to 7 and 3 guesses
    tok = AutoTokenizer.from_pretrained(build_tiny_model())
    renderer = ChatRenderer(tok, load_definitions(names=env.tools))
    game = next(g for g in games if len(g) >= 7)  # three guesses or more
    ids, mask = encode_demo(renderer, env.system_prompt, game)
    kept = tok.decode([i for i, m in zip(ids, mask) if m])
    guesses = [m["tool_calls"][0]["function"]["arguments"]["value"] for m in game if m["role"] == "assistant"]
    assert kept.count("<tool_call>") == len(guesses) and kept.count("<|im_end|>") == len(guesses)
    assert all(f'"value": "{g}"' in kept for g in guesses)
    dropped = tok.decode([i for i, m in zip(ids, mask) if not m])
    assert "Higher" in dropped or "Lower" in dropped
    assert game[-1]["content"] not in dropped  # the last observation ends the game, as in a rollout


def test_seek_rewards_following_the_replies_and_a_wrong_move_is_final(make_sandbox):
    env, sb = SeekEnv(), make_sandbox()
    tasks = make_seek_tasks(300, seed=2)
    assert {t.extra["secret"] for t in tasks} == set(range(1, 16)) - {8}  # never the start
    for task in tasks[:3]:
        env.reset(task, sb)
        tools = ToolBox(sb, tools=env.tools, handlers=env.tool_handlers(task, sb))
        word = env.prompt(task).split("the number is ")[1].split(".")[0]
        while True:  # repeat the latest reply's word: found within 3 moves, every time
            result = tools.run("move", {"direction": word})
            assert not result.error
            if result.submitted:
                break
            word = result.output.split("the number is ")[1].split(".")[0]
        assert result.output == f"Found: the number is {task.extra['secret']}."
        graded = env.grade(task, sb)
        assert graded.reward == 1.0 and 1 <= len(graded.report["moves"]) <= 3
    task = next(t for t in tasks if t.extra["secret"] == 15)
    env.reset(task, sb)
    tools = ToolBox(sb, tools=env.tools, handlers=env.tool_handlers(task, sb))
    bad = tools.run("move", {"direction": "left"})  # the model's mistake: an error observation, no move spent
    assert bad.error and not bad.submitted and "up or down" in bad.output
    seen = [tools.run("move", {"direction": d}).output for d in ("down", "up", "up")]
    assert seen[0] == "The pointer is at 4; the number is up. 2 move(s) left."
    assert seen[-1] == "The pointer is at 7. No moves left: the number was 15."  # 4 + 2 + 1 cannot reach 15
    graded = env.grade(task, sb)
    assert graded.reward == 0.0 and graded.report == {"secret": 15, "moves": ["down", "up", "up"], "pointer": 7}
    assert replay(3, 3, ["down", "up"]) == (3, True) and replay(3, 3, ["up", "up"]) == (7, False)
    with pytest.raises(ValueError, match="levels must be at least 2"):
        make_seek_tasks(1, levels=1)


def test_seek_demonstrations_follow_the_reply_with_the_set_probability():
    """SFT's seek games follow the reply 70% of the time (44% found; at random, 3/14), each
    move in the loss."""
    def found(games):
        return sum(m["content"].startswith("Found") for g in games for m in g if m["role"] == "tool") / len(games)

    env = SeekEnv()
    games = env.demonstrations(600, random.Random(5), seed=5)
    assert 0.37 < found(games) < 0.50  # (2 * 0.7 + 4 * 0.7^2 + 8 * 0.7^3) / 14 = 0.436
    assert 0.15 < found(SeekEnv(demo_follow=0.5).demonstrations(600, random.Random(5), seed=5)) < 0.28  # 0.214
    with pytest.raises(ValueError, match="demo_follow must be a probability"):
        SeekEnv(demo_follow=1.5)
    tok = AutoTokenizer.from_pretrained(build_tiny_model())
    game = next(g for g in games if len(g) == 7)
    ids, mask = encode_demo(ChatRenderer(tok, load_definitions(names=env.tools)), env.system_prompt, game)
    kept = tok.decode([i for i, m in zip(ids, mask) if m])
    moves = [m["tool_calls"][0]["function"]["arguments"]["direction"] for m in game if m["role"] == "assistant"]
    assert len(moves) == 3 and kept.count("<tool_call>") == 3
    assert all(f'"direction": "{d}"' in kept for d in moves)


def test_the_first_turn_is_generated_while_the_sandbox_starts_and_removal_is_not_waited_for():
    """An answer env needs no sandbox until its tool runs: the rollout's container starts in a
    thread while the engine generates, and is removed after the rollout has returned. The pool
    here is the real one, its sandbox's start held until the engine has been asked and its
    removal held until the rollout is back: waiting for either would time out."""
    import contextlib
    import threading

    tok = AutoTokenizer.from_pretrained(build_tiny_model())
    generated, returned = threading.Event(), threading.Event()

    class Engine(ScriptedEngine):
        def generate(self, *a, **kw):
            generated.set()
            return super().generate(*a, **kw)

    real = SandboxPool("pytest-overlap", max_live=2)

    class Gated:
        @contextlib.contextmanager
        def sandbox(self, image):
            assert generated.wait(60), "the sandbox was waited for before the engine was asked"
            with real.sandbox(image) as sb:
                yield sb
                assert returned.wait(60), "the rollout waited for the sandbox's removal"

    env, task = PreferEnv(), make_prefer_tasks(1, seed=1)[0]
    try:
        traj = rollout_and_grade(Agent(Engine(tok, [call("answer", value="7")]), tok, AgentConfig(max_turns=2)),
                                 task, env, Gated())
        returned.set()
        assert traj.reward == 1.0 and traj.exit_reason == "submitted"
        assert traj.timings["sandbox_blocked"] > 0 and traj.timings["sandbox"] >= traj.timings["sandbox_blocked"]
    finally:
        returned.set()
        real.close()
