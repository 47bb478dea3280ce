"""The rollout endpoint (OpenAI chat completions recording every token) and mini-swe-agent as an
agent: served through the openai client and litellm, assembled token in and token out, a
re-sent conversation repaired or counted, a mini-swe-agent rollout graded in real sandboxes,
and a short SAO run with agent=mini_swe."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent.endpoint import ChatEndpoint
from conftest import RUN_ID
from test_agent_loop import ScriptedEngine, tokenizer  # noqa: F401 (the fixture, shared)

ROOT = Path(__file__).resolve().parents[1]
BASH = {"type": "function", "function": {"name": "bash", "description": "Run a command",
                                         "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}


def bash(command: str, thought: str = "THOUGHT: next.\n", *, raw_json: str | None = None) -> str:
    """An assistant turn in the tiny model's (Hermes) format; `raw_json`: the call written as given."""
    body = raw_json or json.dumps({"name": "bash", "arguments": {"command": command}})
    return f"{thought}<tool_call>\n{body}\n</tool_call>"


@pytest.fixture
def served(tokenizer):
    """(endpoint, engine) for a list of scripted turns; the endpoint closed after the test."""
    made = []

    def make(turns):
        engine = ScriptedEngine(tokenizer, turns, logprob=-0.5, version=7)
        ep = ChatEndpoint(engine, tokenizer).start()
        made.append(ep)
        return ep, engine

    yield make
    for ep in made:
        ep.close()


def sampled_runs(traj) -> list[list[int]]:
    runs, cur = [], []
    for t, m in zip(traj.completion_ids, traj.loss_mask):
        if m:
            cur.append(t)
        elif cur:
            runs.append(cur)
            cur = []
    return runs + ([cur] if cur else [])


def test_chat_completions_with_tools_are_served_and_recorded_token_in_token_out(served, tokenizer):
    from openai import OpenAI

    turns = [bash("ls > files.txt && wc -l files.txt"), "All done."]
    ep, engine = served(turns)
    with ep.rollout(instance_id="t1", max_tokens=4000, max_new_tokens=64) as rec:
        client = OpenAI(base_url=ep.url, api_key=rec.key)
        messages = [{"role": "system", "content": "You fix code."}, {"role": "user", "content": "Count the files."}]
        r = client.chat.completions.create(model="anything", messages=messages, tools=[BASH], temperature=0.2)
        msg = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls" and msg.content == "THOUGHT: next."
        assert [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls] == \
            [("bash", {"command": "ls > files.txt && wc -l files.txt"})]
        assert r.usage.prompt_tokens == len(engine.prompts[0])
        messages += [msg.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "3 files.txt"}]
        r = client.chat.completions.create(model="anything", messages=messages, tools=[BASH], stream=False)
        assert r.choices[0].message.content == "All done." and r.choices[0].finish_reason == "stop"
    traj = rec.finish()
    traj.check()
    eos = engine.eos
    # the sampled ids are exactly the engine's, with their logprobs and the version that sampled them
    assert sampled_runs(traj) == [tokenizer.encode(t, add_special_tokens=False) + [eos] for t in turns]
    assert all(lp == -0.5 and v == 7 for lp, v, m in zip(traj.logprobs, traj.policy_version, traj.loss_mask) if m)
    # every prompt the engine got is the trajectory up to there: nothing was re-tokenised
    for prompt in engine.prompts:
        assert prompt == (traj.prompt_ids + traj.completion_ids)[: len(prompt)]
    # and the whole decodes to the conversation as the chat template renders it
    rendered = tokenizer.apply_chat_template(
        messages + [{"role": "assistant", "content": "All done."}], tools=[BASH], tokenize=False)
    assert tokenizer.decode(traj.prompt_ids + traj.completion_ids) + "\n" == rendered
    assert traj.info["repaired_turns"] == 0 and traj.info["retokenized_turns"] == 0 and traj.turns == 2
    # the rollout's temperature (1.0 by default), not the request's, is what the engine sampled at
    assert traj.timings["generate"] >= 0 and traj.timings["endpoint"] > 0


def test_requests_it_cannot_serve_are_refused_with_the_reason(served):
    import httpx

    ep, engine = served(["x", "y"])
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(f"{ep.url}/chat/completions", json=body, headers={"Authorization": "Bearer nobody"})
    assert r.status_code == 401 and "no open rollout" in r.json()["error"]["message"]
    with ep.rollout(max_tokens=3) as rec:
        r = httpx.post(f"{ep.url}/chat/completions", json=body, headers={"X-Rollout-Id": rec.key})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        assert rec.context_full
    with ep.rollout() as rec:
        bad = {"model": "m", "messages": [{"role": "robot", "content": "hi"}]}
        r = httpx.post(f"{ep.url}/chat/completions", json=bad, headers={"Authorization": f"Bearer {rec.key}"})
        assert r.status_code == 400 and "messages[0].role" in r.json()["error"]["message"]
        r = httpx.post(f"{ep.url}/chat/completions", json={**body, "n": 2}, headers={"Authorization": f"Bearer {rec.key}"})
        assert r.status_code == 400 and r.json()["error"]["message"].startswith("n:")
        r = httpx.post(f"{ep.url}/chat/completions", json={**body, "max_tokens": "lots"},
                       headers={"Authorization": f"Bearer {rec.key}"})
        assert r.status_code == 400 and r.json()["error"]["message"].startswith("max_tokens:")
    assert engine.prompts == []  # nothing reached the engine
    models = httpx.get(f"{ep.url}/models").json()
    assert models["data"][0]["id"] == "policy"


def test_a_streamed_reply_carries_the_same_message(served):
    from openai import OpenAI

    ep, _ = served([bash("pwd")])
    with ep.rollout() as rec:
        stream = OpenAI(base_url=ep.url, api_key=rec.key).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "where?"}], tools=[BASH], stream=True)
        chunks = list(stream)
    delta = chunks[0].choices[0].delta
    assert delta.content == "THOUGHT: next." and delta.tool_calls[0].function.name == "bash"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_call_the_template_writes_otherwise_keeps_its_sampled_ids_and_is_counted_repaired(served, tokenizer):
    """The model wrote its call's JSON with "arguments" first and no spaces; the chat template
    writes "name" first. The scaffold sends the message back as OpenAI's tool_calls: rendered
    afresh it would be other ids; the recorder keeps the sampled ones and counts the turn."""
    from openai import OpenAI

    odd = bash("", raw_json='{"arguments":{"command":"ls"},"name":"bash"}')
    ep, engine = served([odd, "done"])
    with ep.rollout() as rec:
        client = OpenAI(base_url=ep.url, api_key=rec.key)
        messages = [{"role": "user", "content": "go"}]
        msg = client.chat.completions.create(model="m", messages=messages, tools=[BASH]).choices[0].message
        messages += [msg.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "a"}]
        client.chat.completions.create(model="m", messages=messages, tools=[BASH])
    traj = rec.finish()
    fresh = tokenizer.apply_chat_template(messages, tools=[BASH], add_generation_prompt=True, tokenize=True)
    fresh = fresh["input_ids"] if isinstance(fresh, dict) else fresh
    assert engine.prompts[1] != list(fresh)  # a re-rendering would have given other ids ...
    assert engine.prompts[1] == (traj.prompt_ids + traj.completion_ids)[: len(engine.prompts[1])]
    assert sampled_runs(traj)[0] == tokenizer.encode(odd, add_special_tokens=False) + [engine.eos]  # ... the sampled stay
    assert traj.info["repaired_turns"] == 1 and traj.info["retokenized_turns"] == 0


def test_a_scaffold_that_rewrites_history_is_detected_and_the_turn_trained_as_observation(served, tokenizer):
    """The scaffold shortens its first reply before sending it back (as condensing scaffolds
    do): the model now sees text it never sampled. The engine is given the conversation as
    rendered; the first turn's tokens stay in the trajectory as observation (mask 0), counted."""
    from openai import OpenAI

    ep, engine = served([bash("cat setup.py", thought="THOUGHT: let me read setup.py in full first.\n"), "ok"])
    with ep.rollout() as rec:
        client = OpenAI(base_url=ep.url, api_key=rec.key)
        messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "go"}]
        msg = client.chat.completions.create(model="m", messages=messages, tools=[BASH]).choices[0].message
        rewritten = {**msg.model_dump(exclude_none=True), "content": "[thought elided]"}
        messages += [rewritten, {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "..."}]
        client.chat.completions.create(model="m", messages=messages, tools=[BASH])
    traj = rec.finish()
    traj.check()
    assert traj.info["retokenized_turns"] == 1 and traj.info["departures"] == 1
    # the engine's second prompt is the scaffold's conversation, and the trajectory is that prompt + the reply
    fresh = tokenizer.apply_chat_template(messages, tools=[BASH], add_generation_prompt=True, tokenize=False)
    assert tokenizer.decode(engine.prompts[1]) == fresh
    assert traj.prompt_ids + traj.completion_ids == engine.prompts[1] + tokenizer.encode("ok", add_special_tokens=False) + [engine.eos]
    assert sampled_runs(traj) == [tokenizer.encode("ok", add_special_tokens=False) + [engine.eos]]  # only the second is an action


def test_litellm_reaches_the_endpoint_as_mini_swe_agent_calls_it(served):
    """mini-swe-agent's model class (litellm underneath) against the endpoint: its actions parsed."""
    import os

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from minisweagent.models.litellm_model import LitellmModel

    ep, _ = served([bash("echo hi")])
    with ep.rollout() as rec:
        model = LitellmModel(model_name="openai/policy", cost_tracking="ignore_errors",
                             model_kwargs={"api_base": ep.url, "api_key": rec.key})
        reply = model.query([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
    assert reply["extra"]["actions"][0]["command"] == "echo hi"


@pytest.mark.docker
def test_mini_swe_agent_resolves_a_builtin_task_in_a_real_sandbox(tokenizer, docker_client):
    """The gold patch written through mini-swe-agent's own actions (apply, write patch.txt,
    submit as its protocol says) in a real sandbox, graded in a fresh one: reward 1, and the
    trajectory holds exactly the ids the engine sampled and was given, turn by turn."""
    from agent.loop import AgentConfig
    from agent.mini_swe import MiniSweAgent
    from agent.rollout import rollout_and_grade
    from envs.base import make_env
    from sandbox.pool import SandboxPool
    from taskdata.load import load_tasks

    task = load_tasks("builtin")[0]
    turns = [bash("cat > /tmp/gold.diff <<'EOF'\n" + task.patch + "EOF\ngit apply /tmp/gold.diff && git status --short"),
             bash("git diff > patch.txt"),
             bash("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat patch.txt")]
    engine = ScriptedEngine(tokenizer, turns, logprob=-0.5, version=7)
    agent = MiniSweAgent(engine, tokenizer, AgentConfig(max_turns=5, max_tokens=8000, max_new_tokens=2000))
    pool = SandboxPool(RUN_ID, max_live=2)
    try:
        traj = rollout_and_grade(agent, task, make_env("swe"), pool, seed=0)
    finally:
        pool.close()
    assert traj.exit_reason == "submitted" and traj.reward == 1.0, (traj.exit_reason, traj.info)
    assert traj.info["grade"]["resolved"] and traj.info["submission"].startswith("diff --git")
    traj.check()
    assert sampled_runs(traj) == [tokenizer.encode(t, add_special_tokens=False) + [engine.eos] for t in turns]
    for prompt in engine.prompts:
        assert prompt == (traj.prompt_ids + traj.completion_ids)[: len(prompt)]
    text = tokenizer.decode(traj.prompt_ids)
    assert "<pr_description>" in text and task.problem_statement.strip()[:40] in text  # mini-swe-agent's own prompt
    assert "M inflection/__init__.py" in tokenizer.decode(traj.completion_ids)  # its observation, from the sandbox
    assert traj.info["retokenized_turns"] == 0


@pytest.mark.docker
def test_a_short_sao_run_with_mini_swe_agent_trains_and_its_weights_reach_the_engine(tmp_path, docker_client):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "training.run", "agent=mini_swe", "+experiment=swe_builtin", "engine=hf",
           f"output_dir={out}", f"run_id={RUN_ID}", "trainer.mode=sync", "trainer.batch_size=2", "trainer.max_steps=2",
           "trainer.checkpoint_every=1", "model.sft.steps=10", "model.algo_overrides.critic_warmup_steps=0",
           "agent.max_turns=2", "agent.max_new_tokens=24"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    assert rows[0]["learner/version"] == 1 and rows[1]["engine/version"] == 2  # step 1's update sampled step 2
    # the tiny model has not learnt mini-swe-agent's tool: a reply without a call is dropped from
    # mini-swe-agent's history (its FormatError path), which the recorder counts as a departure
    assert all(row["rollout/retokenized_turns"] >= 0 and "rollout/repaired_turns" in row for row in rows)
    trajs = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert trajs and all(t.get("agent") == "mini_swe" for t in trajs)


def test_mini_swe_agents_environment_runs_its_actions_as_its_own_docker_environment_does():
    """SandboxEnvironment: each action a command in the workspace with the config's variables; a
    timeout is exit code -1 with the reason; the submission marker ends the run only as the first
    line of a command that succeeded (mini-swe-agent's rule). A recording stand-in for the
    sandbox (a unit test: the real one runs in the sandbox test above)."""
    from minisweagent.exceptions import Submitted

    from agent.mini_swe import SUBMIT_MARKER, SandboxEnvironment
    from sandbox.base import ExecResult

    class Recording:
        def __init__(self, results):
            self.results, self.calls = list(results), []

        def exec(self, cmd, timeout=None, workdir=None):
            self.calls.append((cmd, timeout, workdir))
            return self.results.pop(0)

    sb = Recording([ExecResult(0, "a\nb\n"), ExecResult(124, "partial", timed_out=True),
                    ExecResult(1, f"{SUBMIT_MARKER}\ndiff\n"), ExecResult(0, f"  {SUBMIT_MARKER}\ndiff --git a/x b/x\n")])
    env = SandboxEnvironment(sb, "/testbed", 60, {"PAGER": "cat", "X": "a b"})
    assert env.execute({"command": "ls"}) == {"output": "a\nb\n", "returncode": 0, "exception_info": ""}
    assert sb.calls[0] == ("export PAGER=cat; export X='a b'; ls", 60, "/testbed")
    out = env.execute({"command": "sleep 99"}, timeout=5)
    assert out["returncode"] == -1 and "timed out after 5 seconds" in out["exception_info"] and sb.calls[1][1] == 5
    assert env.execute({"command": "false"})["returncode"] == 1  # the marker after a failure: not a submission
    with pytest.raises(Submitted) as submitted:
        env.execute({"command": "submit"})
    assert submitted.value.messages[0]["extra"]["submission"] == "diff --git a/x b/x\n"
    assert env.get_template_vars()["cwd"] == "/testbed" and env.serialize()["info"]["config"]["environment"]["timeout"] == 60
