"""The online-learning env (envs/online.py): phases and pools follow the policy version the
loop passes in, through the real `answer` tool in a real sandbox; bad phases are refused with
the field named; and experiments/online.py runs end to end in its quick mode."""

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from agent.chat import ChatRenderer
from agent.loop import Agent, AgentConfig
from agent.rollout import rollout_and_grade
from agent.tiny_model import build_tiny_model
from agent.tools import ToolBox, load_definitions
from envs.online import DEFAULT_PHASES, OnlineEnv, check_phases, make_online_tasks
from envs.prefer import PreferEnv, make_prefer_tasks
from sandbox.pool import SandboxPool
from test_agent_loop import ScriptedEngine, call
from training.sft import encode_demo

ROOT = Path(__file__).resolve().parents[1]
PHASES = [{"start": 0, "pool": ["cute", "plain"], "rewarded": "cute"},
          {"start": 2, "pool": ["cute", "plain"], "rewarded": "plain"},
          {"start": 5, "pool": ["classical", "plain", "poetic"], "rewarded": "classical"}]


def answer(sandbox, value):
    result = ToolBox(sandbox, tools=("answer",)).run("answer", {"value": value})
    assert result.submitted and not result.error


@pytest.mark.docker
def test_phase_and_pool_follow_the_version(make_sandbox, tmp_path):
    record = tmp_path / "record.jsonl"
    env, task, sb = OnlineEnv(phases=PHASES, record=str(record)), make_online_tasks(1, seed=2)[0], make_sandbox()
    assert [env.phase_at(v) for v in range(7)] == [0, 0, 1, 1, 1, 2, 2]
    assert env.reset(task, sb, version=1).endswith("Styles on offer: cute, plain. Which style will you write it in?")
    assert task.extra["topic"] in env.reset(task, sb, version=0)
    assert "Styles on offer: classical, plain, poetic." in env.reset(task, sb, version=9)
    assert env.grade(task, sb, version=0).empty_patch  # nothing answered yet
    answer(sb, "cute")
    assert [env.grade(task, sb, version=v).reward for v in (0, 1, 2, 4, 5)] == [1.0, 1.0, 0.0, 0.0, 0.0]
    answer(sb, "plain")
    graded = env.grade(task, sb, version=3)
    assert graded.reward == 1.0 and graded.report == {"expected": "plain", "given": "plain", "phase": 1, "version": 3}
    answer(sb, "classical")
    assert env.grade(task, sb, version=5).reward == 1.0
    lines = [json.loads(x) for x in record.read_text().splitlines()]
    assert len(lines) == 8 and lines[-1] == {"instance_id": task.instance_id, "expected": "classical",
                                             "given": "classical", "phase": 2, "version": 5, "reward": 1.0}
    assert lines[0]["given"] is None and lines[0]["reward"] == 0.0


@pytest.mark.parametrize("phases, message", [
    ([], "env.phases must be a non-empty list"),
    ([{"start": 1, "pool": ["a"], "rewarded": "a"}], "env.phases[0].start = 1: the first phase must start at 0"),
    ([{"start": 0, "pool": ["a"], "rewarded": "a"}, {"start": 0, "pool": ["a"], "rewarded": "a"}],
     "env.phases[1].start = 0: must be above env.phases[0].start (0)"),
    ([{"start": 0, "pool": ["a", "b"], "rewarded": "c"}], "env.phases[0].rewarded = 'c': not in its pool (a, b)"),
    ([{"start": 0, "pool": [], "rewarded": "a"}], "env.phases[0].pool = []: must be a non-empty list"),
    ([{"start": 0, "pool": "ab", "rewarded": "a"}], "env.phases[0].pool = 'ab': must be a non-empty list"),
    ([{"start": 0, "pool": ["a", "a"], "rewarded": "a"}], "env.phases[0].pool = ['a', 'a']: style names must be"),
    ([{"start": -2, "pool": ["a"], "rewarded": "a"}], "env.phases[0].start = -2: must be a whole number"),
    ([{"start": 0, "pool": ["a"]}], "env.phases[0] = {'start': 0, 'pool': ['a']}: needs exactly the keys"),
])
def test_bad_phases_are_refused_naming_the_field(phases, message):
    with pytest.raises(ValueError) as e:
        OnlineEnv(phases=phases)
    assert message in str(e.value)


def test_config_phases_are_the_defaults_and_load_from_hydra_values():
    cfg = OmegaConf.load(ROOT / "conf" / "env" / "online.yaml")
    assert check_phases(cfg.phases) == DEFAULT_PHASES  # OmegaConf lists and dicts, as training.run passes them
    assert [p["rewarded"] for p in DEFAULT_PHASES] == ["cute", "chuunibyou", "classical"]
    assert set(DEFAULT_PHASES[-1]["pool"]) != set(DEFAULT_PHASES[0]["pool"])


def test_demonstrations_answer_from_the_offered_pool_only():
    env = OnlineEnv(phases=PHASES)
    demos = env.demonstrations(300, random.Random(0), seed=0)
    seen = set()
    for user, reply in demos:
        pool = user["content"].split("Styles on offer: ")[1].split(".")[0].split(", ")
        value = reply["tool_calls"][0]["function"]["arguments"]["value"]
        assert value in pool
        seen.add(value)
    assert seen == {"cute", "plain", "classical", "poetic"}  # every style of every pool, not the rule
    tok = AutoTokenizer.from_pretrained(build_tiny_model())
    ids, mask = encode_demo(ChatRenderer(tok, load_definitions(names=env.tools)), env.system_prompt, demos[0])
    assert '"answer"' in tok.decode([i for i, m in zip(ids, mask) if m])


class PhaseEngine(ScriptedEngine):
    """A scripted engine whose policy version moves on while it samples (a sync mid-rollout)."""

    def __init__(self, tokenizer, turns, version_after: int):
        super().__init__(tokenizer, turns)
        self.version, self.version_after = 0, version_after

    def generate(self, prompt_ids, sampling):
        out = super().generate(prompt_ids, sampling)
        self.version = self.version_after
        return out


@pytest.mark.docker
def test_the_loop_and_rollout_pass_the_engine_version(docker_client):
    tok = AutoTokenizer.from_pretrained(build_tiny_model())
    pool = SandboxPool("pytest-online", max_live=2)
    try:
        # reset at version 0 (phase 0's pool), graded at version 5 (phase 2's rule)
        engine = PhaseEngine(tok, [call("answer", value="classical")], version_after=5)
        traj = rollout_and_grade(Agent(engine, tok, AgentConfig(max_turns=1)), make_online_tasks(1)[0],
                                 OnlineEnv(phases=PHASES), pool)
        user = next(m["content"] for m in traj.messages if m["role"] == "user")
        assert "Styles on offer: cute, plain." in user
        assert traj.reward == 1.0 and traj.info["grade"]["report"] == {
            "expected": "classical", "given": "classical", "phase": 2, "version": 5}
        # an env that does not ask for the version is called as before (no `version` argument)
        traj = rollout_and_grade(Agent(PhaseEngine(tok, [call("answer", value="7")], 5), tok, AgentConfig(max_turns=1)),
                                 make_prefer_tasks(1)[0], PreferEnv(), pool)
        assert traj.exit_reason == "submitted" and traj.reward == 1.0
    finally:
        pool.close()


@pytest.mark.docker
def test_benchmark_quick_mode_runs_both_baselines(tmp_path, docker_client):
    out, plot = tmp_path / "online.json", tmp_path / "online.png"
    r = subprocess.run([sys.executable, "-m", "experiments.online", "--quick", "--output", str(out), "--plot", str(plot)],
                       cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stderr[-4000:]
    result = json.loads(out.read_text())
    assert set(result["runs"]) == {"sao", "running_mean"}
    # the same policy updates for both; SAO's critic-only warm-up step comes on top
    assert result["runs"]["sao"]["max_steps"] == result["runs"]["running_mean"]["max_steps"] + 1 == result["updates"] + 1
    for run in result["runs"].values():
        seed = run["seeds"]["0"]
        n = len(seed["steps"])
        assert n == run["max_steps"] and len(seed["reward"]) == n
        assert all(0.0 <= r <= 1.0 for r in seed["reward"])
        for step_shares in zip(*seed["shares"].values()):
            assert abs(sum(step_shares) - 1.0) < 1e-9  # every trained rollout answered something or nothing
        assert [p["phase"] for p in seed["phases"]] == [0, 1, 2]
    assert plot.stat().st_size > 0
    assert "steps to recover" in r.stderr
