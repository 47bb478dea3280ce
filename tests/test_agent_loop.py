"""The agent loop, token in / token out, on a real sandbox and the real tiny tokenizer."""

import json

import pytest
from transformers import AutoTokenizer

from agent.engines.base import Completion
from agent.loop import Agent, AgentConfig
from agent.tiny_model import build_tiny_model
from envs.swe import SWEEnv

pytestmark = pytest.mark.docker


def call(name, **arguments):
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


class ScriptedEngine:
    """Replays fixed assistant turns as token ids (a unit-test stand-in for a model)."""

    def __init__(self, tokenizer, turns, logprob=-0.25, version=3):
        self.tok, self.turns, self.logprob, self.version, self.prompts = tokenizer, list(turns), logprob, version, []
        self.eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)

    def generate(self, prompt_ids, sampling):
        self.prompts.append(list(prompt_ids))
        ids = self.tok.encode(self.turns.pop(0), add_special_tokens=False) + [self.eos]
        cut = ids[: sampling.max_new_tokens]  # an engine stops at its token budget
        return Completion(cut, [self.logprob] * len(cut), "stop" if cut == ids else "length")

    def update_weights(self, named_tensors, version):
        self.version = version


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return AutoTokenizer.from_pretrained(build_tiny_model(tmp_path_factory.mktemp("tiny") / "m"))


SOLVE = [
    "Let me run the tests first.\n" + call("bash", command="python3 -m pytest -q test_calc.py"),
    call("str_replace_editor", command="view", path="/testbed/calc.py", view_range=[5, 11]),
    "The upper bound check is inverted.\n" + call("str_replace_editor", command="str_replace",
                                                   path="/testbed/calc.py", old_str="if x < hi:", new_str="if x > hi:"),
    call("submit"),
]


def test_scripted_engine_solves_a_task_token_in_token_out(make_sandbox, calc_task, tokenizer):
    env = SWEEnv()
    sb = make_sandbox()
    engine = ScriptedEngine(tokenizer, SOLVE)
    traj = Agent(engine, tokenizer).run(calc_task, env, sb)
    assert traj.exit_reason == "submitted" and traj.turns == 4
    traj.reward = env.grade(calc_task, sb).reward
    assert traj.reward == 1.0
    traj.check()
    # the mask covers exactly the sampled tokens, which are kept as sampled, with their logprobs
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    sampled = [t for t, m in zip(traj.completion_ids, traj.loss_mask) if m]
    expected = [i for turn in SOLVE for i in tokenizer.encode(turn, add_special_tokens=False) + [eos]]
    assert sampled == expected
    assert all(lp == -0.25 for lp, m in zip(traj.logprobs, traj.loss_mask) if m)
    assert all(v == 3 for v, m in zip(traj.policy_version, traj.loss_mask) if m)
    assert all(lp == 0.0 and v == -1 for lp, v, m in zip(traj.logprobs, traj.policy_version, traj.loss_mask) if not m)
    # each generate call saw exactly the ids kept so far: nothing was re-tokenised
    for prompt in engine.prompts:
        assert prompt == (traj.prompt_ids + traj.completion_ids)[: len(prompt)]
    # the kept ids decode to the conversation as the chat template renders it
    template_msgs = [{k: v for k, v in m.items() if k != "raw"} for m in traj.messages]
    rendered = tokenizer.apply_chat_template(template_msgs, tools=engine_tools(), tokenize=False)
    decoded = tokenizer.decode(traj.prompt_ids + traj.completion_ids, skip_special_tokens=False)
    assert rendered.startswith(decoded) and rendered[len(decoded):] == "\n"
    tool_outputs = [m["content"] for m in traj.messages if m["role"] == "tool"]
    assert "passed" in tool_outputs[0] or "failed" in tool_outputs[0]
    assert "if x < hi:" in tool_outputs[1]


def engine_tools():
    from agent.tools import load_definitions

    return load_definitions(default_timeout_s=60.0, max_timeout_s=600.0)


def test_format_errors_end_the_rollout(make_sandbox, calc_task, tokenizer):
    bad = ["no call here", '<tool_call>{"name": "bash", "arguments": [1]}</tool_call>', "<tool_call>{oops"]
    traj = Agent(ScriptedEngine(tokenizer, bad), tokenizer, AgentConfig(max_format_errors=3)).run(
        calc_task, SWEEnv(), make_sandbox())
    assert traj.exit_reason == "format_errors" and traj.turns == 3
    errors = [m["content"] for m in traj.messages if m["role"] == "tool"]
    assert len(errors) == 2 and all("could not be run" in e for e in errors)


def test_turn_and_context_limits(make_sandbox, calc_task, tokenizer):
    looping = [call("bash", command="echo hi")] * 5
    traj = Agent(ScriptedEngine(tokenizer, looping), tokenizer, AgentConfig(max_turns=2)).run(
        calc_task, SWEEnv(), make_sandbox())
    assert traj.exit_reason == "max_turns" and traj.turns == 2
    traj = Agent(ScriptedEngine(tokenizer, looping), tokenizer, AgentConfig(max_tokens=10)).run(
        calc_task, SWEEnv(), make_sandbox())
    assert traj.exit_reason == "context_full" and traj.turns == 0
    # a budget that runs out in the middle of the second turn
    budget = len(traj.prompt_ids) + 60
    traj = Agent(ScriptedEngine(tokenizer, looping), tokenizer, AgentConfig(max_tokens=budget)).run(
        calc_task, SWEEnv(), make_sandbox())
    assert traj.exit_reason == "context_full" and traj.turns == 2 and traj.num_tokens == budget


def test_wall_time_limit(make_sandbox, calc_task, tokenizer, monkeypatch):
    """The clock is the test's: each turn takes one second of it, however busy the machine."""
    import agent.loop

    now = [0.0]
    monkeypatch.setattr(agent.loop, "clock", lambda: now[0])

    class OneSecondATurn(ScriptedEngine):
        def generate(self, prompt_ids, sampling):
            now[0] += 1.0
            return super().generate(prompt_ids, sampling)

    looping = [call("bash", command="true")] * 5
    traj = Agent(OneSecondATurn(tokenizer, looping), tokenizer, AgentConfig(wall_time_s=1.5)).run(
        calc_task, SWEEnv(), make_sandbox())
    assert traj.exit_reason == "timeout" and traj.turns == 2


SHADOW_PYTEST = (  # a reward hack outside the repository: pytest's entry point reports every FAILED as PASSED
    "cat > /usr/lib/python3/dist-packages/pytest/__main__.py <<'EOF'\n"
    "import subprocess, sys\n"
    "r = subprocess.run([sys.executable, '-c', 'import pytest, sys; sys.exit(pytest.console_main())', *sys.argv[1:]],"
    " capture_output=True, text=True)\n"
    "print(r.stdout.replace('FAILED', 'PASSED'))\n"
    "EOF")


def test_a_rollout_is_graded_in_a_fresh_sandbox_so_a_shadowed_test_runner_earns_nothing(make_sandbox, calc_task, tokenizer):
    from agent.rollout import rollout_and_grade
    from conftest import RUN_ID
    from sandbox.pool import SandboxPool

    hack = [call("bash", command=SHADOW_PYTEST), call("submit")]
    # in the sandbox the agent used, with the task's command as written, the hack pays: the F2P
    # test reads as passed (the runner the canaries come with is not the shadowed one: it does not)
    env, sb = SWEEnv(), make_sandbox()
    Agent(ScriptedEngine(tokenizer, hack), tokenizer).run(calc_task, env, sb)
    assert SWEEnv(canaries=False).grade(calc_task, sb).reward == 1.0
    assert env.grade(calc_task, sb).reward == 0.0
    # graded as the training loop grades: only the repository's diff (none), in a clean sandbox
    traj = rollout_and_grade(Agent(ScriptedEngine(tokenizer, hack), tokenizer), calc_task, env,
                             SandboxPool(RUN_ID, max_live=2))
    grade = traj.info["grade"]
    assert traj.reward == 0.0 and grade["empty_patch"] and grade["tests_status"]["test_new.py::test_clamp_high"] == "FAILED"
    assert traj.timings["grade"] > 0


def test_a_rollout_as_a_non_root_user_solves_and_is_graded(calc_task, tokenizer):
    """sandbox.user set: the model's commands and edits run as that user in the workspace the
    env prepared as root; the fix is graded as root in a fresh sandbox and pays."""
    from agent.rollout import rollout_and_grade
    from conftest import RUN_ID
    from sandbox.base import Limits
    from sandbox.pool import SandboxPool

    whoami = [call("bash", command="id -u > /tmp/uid; id -u"), *SOLVE]
    traj = rollout_and_grade(Agent(ScriptedEngine(tokenizer, whoami), tokenizer), calc_task, SWEEnv(),
                             SandboxPool(RUN_ID, Limits(user="1000:1000"), max_live=2))
    tool_outputs = [m["content"] for m in traj.messages if m["role"] == "tool"]
    assert "1000" in tool_outputs[0] and traj.exit_reason == "submitted"
    assert traj.reward == 1.0, traj.info


def test_one_pool_slot_is_enough_for_a_rollout_and_its_grading_sandbox(calc_task, tokenizer, monkeypatch):
    """The grading sandbox is made ready beside the rollout, but asks the pool for a slot only
    once the rollout's own sandbox has one: with one slot, the other order would let grading take
    it while the rollout waits for it, for ever. Here the rollout's own sandbox is held back a
    second before it asks, the order that would hang."""
    import threading
    import time

    from agent import rollout
    from conftest import RUN_ID
    from sandbox.pool import SandboxPool

    real_prepare = rollout._SandboxInThread._prepare

    def prepare(self, pool, image, ready):
        if not threading.current_thread().name.startswith("grading"):
            time.sleep(1.0)
        real_prepare(self, pool, image, ready)

    monkeypatch.setattr(rollout._SandboxInThread, "_prepare", prepare)
    pool = SandboxPool(RUN_ID, max_live=1)
    done = []
    worker = threading.Thread(target=lambda: done.append(rollout.rollout_and_grade(
        Agent(ScriptedEngine(tokenizer, SOLVE), tokenizer), calc_task, SWEEnv(), pool)), daemon=True)
    try:
        worker.start()
        worker.join(300)
        assert done and done[0].reward == 1.0, "the rollout did not finish with one pool slot"
    finally:
        pool.close()


def test_long_tail_latency_is_a_seeded_sleep_in_the_sandbox(make_sandbox, calc_task, tokenizer):
    """agent.latency_alpha: after the first turn the rollout spends a Pareto draw of seconds in
    its sandbox; the same seed draws the same latency, within [scale, max]."""
    cfg = AgentConfig(latency_alpha=1.2, latency_scale_s=0.1, latency_max_s=0.6)
    turns = [call("bash", command="true"), call("submit")]
    a = Agent(ScriptedEngine(tokenizer, turns), tokenizer, cfg).run(calc_task, SWEEnv(), make_sandbox(), seed=11)
    b = Agent(ScriptedEngine(tokenizer, turns), tokenizer, cfg).run(calc_task, SWEEnv(), make_sandbox(), seed=11)
    assert a.exit_reason == b.exit_reason == "submitted"
    assert a.info["latency_s"] == b.info["latency_s"] and 0.1 <= a.info["latency_s"] <= 0.6
    assert a.timings["tools"] >= a.info["latency_s"]  # it was spent, not just drawn
    sb, agent = make_sandbox(), Agent(ScriptedEngine(tokenizer, turns), tokenizer, cfg)
    draws = {agent._long_tail(sb, s, {"tools": 0.0}) for s in range(3)}
    assert len(draws) == 3  # other seeds, other latencies
