"""Every file under conf/ composes, and every group option instantiates."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from envs.base import make_env, registered_envs

CONF = Path(__file__).resolve().parents[1] / "conf"
OPTIONS = sorted((p.parent.name, p.stem) for p in CONF.glob("*/*.yaml"))


@pytest.mark.parametrize("group,name", OPTIONS)
def test_every_group_option_composes_and_instantiates(group, name):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"{group}={name}"])
    obj = instantiate(cfg[group])
    if group == "env":  # an env file names a registered env: one file + one YAML adds one
        assert name in registered_envs() and type(obj) is type(make_env(name))


def test_unknown_env_is_a_clear_error():
    with pytest.raises(KeyError, match="no env named 'nope'"):
        make_env("nope")
