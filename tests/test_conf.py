"""Every file under conf/ composes, every group option instantiates, and the full-scale
experiment composes with the paper's values."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from envs.base import make_env, registered_envs
from training.config import ConfigError, check

CONF = Path(__file__).resolve().parents[1] / "conf"
OPTIONS = sorted((p.parent.name, p.stem) for p in CONF.glob("*/*.yaml"))
IN_DEFAULTS = {"model", "engine", "learner", "algo", "sandbox", "agent"}


def composed(*overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides))


@pytest.mark.parametrize("group,name", OPTIONS)
def test_every_group_option_composes_and_instantiates(group, name):
    if group in ("experiment", "debug"):  # global packages: they change the whole config
        cfg = composed(f"+{group}={name}")
        assert OmegaConf.to_container(cfg, resolve=True)["trainer"]["batch_size"] > 0
        return
    if group == "env":  # an env file names a registered env: one file + one YAML adds one
        cfg = OmegaConf.load(CONF / "env" / f"{name}.yaml")
        assert type(instantiate(cfg)) is type(make_env(name)) and name in registered_envs()
        return
    assert group in IN_DEFAULTS, f"conf/{group}/ is a group the tests do not know"
    cfg = composed(f"{group}={name}")
    if group == "agent":  # a class, its own options, the shared settings (built with an engine, in a run)
        from agent.agents import agent_class
        from training.factories import agent_settings

        target, options, config = agent_settings(cfg)
        assert callable(agent_class(target)) and config.max_turns >= 1 and isinstance(options, dict)
        return
    if "_target_" in cfg[group]:
        instantiate(cfg[group])
    OmegaConf.to_container(cfg, resolve=True)


def test_an_agent_that_acts_through_bash_alone_is_refused_envs_answered_with_tools():
    check(composed("agent=mini_swe", "+experiment=swe_builtin"))
    with pytest.raises(ConfigError, match=r"sources\[0\]\.env = 'prefer'.*bash alone.*answer"):
        check(composed("agent=mini_swe"))


def test_default_run_is_the_embedded_one():
    cfg = OmegaConf.to_container(composed(), resolve=True)
    assert cfg["model"]["path"] is None and cfg["engine"]["kind"] == "auto"
    assert cfg["algo"]["_target_"] == "training.algos.SAO" and cfg["trainer"]["group_size"] == 1
    assert {s["env"] for s in cfg["sources"]} == {"prefer", "arith", "swe"}


def test_swe_verified_experiment_has_the_papers_settings():
    cfg = OmegaConf.to_container(composed("+experiment=swe_verified"), resolve=True)
    assert cfg["model"]["path"].startswith("Qwen/Qwen3") and cfg["engine"]["kind"] == "vllm"
    assert cfg["trainer"]["batch_size"] == 128 and cfg["trainer"]["group_size"] == 1  # 128 x 1
    for experiment in ("swe_verified", "math_tir"):  # the baseline at the same scale: 16 prompts x 8
        grpo = composed(f"+experiment={experiment}", "algo=grpo_dis")
        check(grpo)
        assert grpo.trainer.batch_size == 128 and grpo.trainer.group_size == grpo.algo.group_size == 8
    # the paper's 128K needs YaRN; Qwen3 declares 40,960 positions, which the engine's context keeps to
    assert cfg["agent"]["max_tokens"] == 40960 and cfg["engine"]["options"]["max_model_len"] == 40960
    algo = cfg["algo"]
    assert (algo["eps_low"], algo["eps_high"]) == (0.8, 3.0) and algo["mask"] is True
    assert (algo["lr_policy"], algo["lr_critic"]) == (1e-6, 5e-6)
    assert algo["critic_steps"] == 2 and algo["critic_warmup_steps"] == 10 and algo["freeze_critic_attention"]
    assert algo["gamma"] == 1.0 and algo["policy_lambda"] is None and algo["critic_lambda"] == 1.0
    assert cfg["model"]["algo_overrides"] == {}  # nothing replaces the paper's values
    assert [s["env"] for s in cfg["sources"]] == ["swe", "swe"]
    learner = cfg["learner"]  # the Megatron learner, laid out for one 8-GPU node
    assert learner["_target_"] == "training.learners.megatron.MegatronLearner"
    # tensor 8 x data 1: the layout the memory plan accepts beside the engine on an H100 (tests/test_plan.py)
    assert learner["tensor_parallel"] * learner["pipeline_parallel"] == 8 and learner["dtype"] == "bfloat16"


def test_swe_verified_sources_load_a_real_mix(monkeypatch):
    """The experiment's sources, each hub set given its card-shaped rows (tests/data; no hub
    here): SWE-smith and SWE-Gym map by their names, SWE-bench Verified's rows are dropped."""
    import json

    import taskdata.rows

    data = Path(__file__).parent / "data"
    rows = {name: [json.loads(line) for line in (data / f).read_text().splitlines()] for name, f in
            [("SWE-bench/SWE-smith", "swe_smith.jsonl"), ("SWE-Gym/SWE-Gym", "swe_gym.jsonl"),
             ("SWE-bench/SWE-bench_Verified", "swe_bench_verified.jsonl")]}
    rows["SWE-Gym/SWE-Gym"].append({**rows["SWE-Gym/SWE-Gym"][0], "instance_id": "django__django-11099"})
    monkeypatch.setattr(taskdata.rows, "_read_hub", lambda name, split: rows[name])
    cfg = composed("+experiment=swe_verified")
    smith, gym = (list(instantiate(s.tasks)) for s in cfg.sources)
    assert {t.layout for t in smith} == {"swe-smith"} and len(smith) == 2
    assert {t.layout for t in gym} == {"swe-gym"} and [t.instance_id for t in gym] == ["dask__dask-7656", "python__mypy-11126"]


def test_grpo_switch():
    cfg = OmegaConf.to_container(composed("algo=grpo"), resolve=True)
    assert cfg["algo"]["_target_"] == "training.algos.GRPO" and cfg["trainer"]["group_size"] == 8
    cfg = OmegaConf.to_container(composed("algo=grpo_dis"), resolve=True)
    assert cfg["algo"]["_target_"] == "training.algos.GRPODIS" and cfg["trainer"]["group_size"] == 8
    assert (cfg["algo"]["eps_low"], cfg["algo"]["eps_high"]) == (0.8, 3.0)


def test_unknown_env_is_a_clear_error():
    with pytest.raises(KeyError, match="no env named 'nope'"):
        make_env("nope")


@pytest.mark.parametrize("overrides", [(), ("algo=grpo",), ("algo=grpo_dis",), ("+sources.0.env_options={switch_every: 64}",), ("+experiment=swe_verified",), ("+debug=tiny",),
                                       ("+debug=learn",), ("trainer.mode=sync", "engine=hf"), ("learner=megatron",),
                                       ("runtime=ray", "engine.replicas=2"), ("engine=vllm", "engine.options.sync_mode=finish")])
def test_shipped_configs_pass_the_checks(overrides):
    check(composed(*overrides))


@pytest.mark.parametrize("overrides,named", [
    (["trainer.mode=asnyc"], "trainer.mode = 'asnyc'"),
    (["trainer.stale_policy=forget"], "trainer.stale_policy = 'forget'"),
    (["trainer.batch_size=0"], "trainer.batch_size = 0"),
    (["algo=grpo", "trainer.batch_size=12"], "trainer.batch_size = 12: must be a multiple of trainer.group_size (8)"),
    (["algo=grpo", "trainer.group_size=2"], "trainer.group_size = 2: differs from algo.group_size (8)"),
    (["algo.eps_low=1.5"], "algo.eps_low = 1.5"),
    (["algo.critic_steps=-1"], "algo.critic_steps = -1"),
    (["model.path=/no/such/model"], "model.path = '/no/such/model'"),
    (["agent.max_turns=0"], "agent.max_turns = 0"),
    (["+agent.max_turn=3"], "agent.max_turn = 3: not an agent setting"),
    (["sources.0.env=nosuch"], "sources[0] (prefer).env = 'nosuch': no conf/env/nosuch.yaml"),
    (["sources.1.weight=0"], "sources[1] (arith).weight = 0"),
    (["held_out.agent.max_new_tokens=-5"], "held_out.agent.max_new_tokens = -5"),
    (["engine.kind=tgi"], "engine.kind = 'tgi'"),
    (["+sources.0.env_options={switch_evry: 5}"], "sources[0] (prefer).env_options.switch_evry = 5: not an option"),
    (["trainer.max_failed_in_a_row=0"], "trainer.max_failed_in_a_row = 0"),
    (["trainer.keep_checkpoints=0"], "trainer.keep_checkpoints = 0"),
    (["trainer.keep_every=-10"], "trainer.keep_every = -10"),
    (["trainer.keep_every=25"], "trainer.keep_every = 25: must be a multiple of trainer.checkpoint_every (10)"),
    (["agent.temperature=0"], "agent.temperature = 0"),
    (["agent.top_p=0.9"], "agent.top_p = 0.9: must be 1 for training"),
    (["+sources.1.agent.temperature=0.7"], "sources[1].agent.temperature = 0.7: must equal agent.temperature (1.0)"),
    (["algo=grpo", "algo.policy_minibatches=0"], "algo.policy_minibatches = 0"),
    (["runtime=slurm"], "runtime = 'slurm'"),
    (["engine.replicas=0"], "engine.replicas = 0"),
    (["runtime=ray", "ray.rollout_actors=0"], "ray.rollout_actors = 0"),
    (["runtime=ray", "ray.weight_sync=nccl"], "ray.weight_sync = 'nccl'"),
    (["runtime=ray", "trainer.engine_lag=2"], "trainer.engine_lag = 2: keeps snapshots of past weights"),
    (["runtime=ray", "ray.weight_sync_timeout_s=0"], "ray.weight_sync_timeout_s = 0"),
    (["engine=vllm", "engine.options.sync_mode=later"], "engine.options.sync_mode = 'later'"),
    (["sandbox.memory_mb=-5"], "sandbox.memory_mb = -5"),
    (["trainer.engine_lag=5"], "trainer.engine_lag = 5: is above trainer.max_staleness (4)"),
    (["sandbox.user=bob"], "sandbox.user = 'bob'"),
])
def test_bad_values_are_named_with_field_and_value(overrides, named):
    with pytest.raises(ConfigError) as e:
        check(composed(*overrides))
    assert named in str(e.value)


def test_more_rollouts_in_flight_than_the_staleness_bound_takes_back_is_said_not_refused():
    from training.config import advice

    assert advice(composed("trainer.num_workers=64", "trainer.batch_size=16")) == []  # 4 steps: within the bound
    (note,) = advice(composed("trainer.num_workers=1024", "trainer.batch_size=128"))
    assert "take about 8 steps" in note and "trainer.max_staleness to 8" in note and "trainer.num_workers to 512" in note
    check(composed("trainer.num_workers=1024", "trainer.batch_size=128"))  # it runs
    assert advice(composed("trainer.num_workers=1024", "trainer.batch_size=128", "trainer.stale_policy=keep")) == []
    assert advice(composed("trainer.num_workers=1024", "trainer.batch_size=128", "trainer.mode=sync")) == []


def test_local_rank_timeout_must_be_positive():
    assert composed().local.rank_timeout_s == 14400  # 4 hours: past a batch of SWE rollouts
    with pytest.raises(ConfigError, match="local.rank_timeout_s"):
        check(composed("local.rank_timeout_s=0"))


def test_engine_cpus_gives_the_engine_cores_of_its_own_and_refuses_a_count_it_cannot():
    """local.engine_cpus: the vLLM engine's OpenMP threads bound to the last N CPUs (its
    VLLM_CPU_OMP_THREADS_BIND), this process and what it starts later on the rest, torch's
    intra-op threads as many as those (a subprocess: it changes its own affinity)."""
    import os
    import subprocess
    import sys

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    code = ("import os, torch; from training.runtime.local import split_cpus; e, r = split_cpus(1); "
            "print(e, r, sorted(os.sched_getaffinity(0)), os.environ['VLLM_CPU_OMP_THREADS_BIND'], torch.get_num_threads())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    rest = cpus[:-1]
    assert out[-2] == str(cpus[-1]) and int(out[-1]) == len(rest)
    with pytest.raises(ConfigError, match="local.engine_cpus"):
        check(composed(f"local.engine_cpus={len(cpus)}"))
    check(composed("local.engine_cpus=1"))
