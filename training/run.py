"""The training entry point (Hydra): `python -m training.run [overrides]`.

Check the config, start the runtime (runtime=local: this process, or torchrun's ranks;
runtime=ray: actors on a Ray cluster), then run the training loop over what it started
(training/lifecycle.py). The parts are built in training/factories.py.
"""

from __future__ import annotations

import os
import sys

import hydra
import transformers
from omegaconf import DictConfig

from agent.engines.base import ContextTooLong
from sandbox.base import SandboxError
from sandbox.docker import client as docker_client
from training.config import ConfigError, advice, check
from training.console import console, say_error
from training.factories import check_engine_context
from training.learners.base import LayoutError
from training.lifecycle import train
from training.plan import check_layout
from training.runtime.base import ClusterError, Runtime
from training.runtime.local import LocalRuntime


def start_runtime(cfg: DictConfig) -> Runtime:
    if cfg.runtime == "ray":
        from training.runtime.ray import Cluster  # Ray is an optional extra: imported only when asked for

        return Cluster(cfg)
    return LocalRuntime(cfg)


def run(cfg: DictConfig) -> int:
    """The whole run; its exit code (2: a setting that cannot run, said with its field)."""
    is_rank0 = int(os.environ.get("RANK", "0")) == 0
    try:
        check(cfg)
        if is_rank0:
            for note in advice(cfg):
                console.print(f"[yellow]note:[/yellow] {note}")
        check_layout(cfg)  # with CUDA: the memory plan must fit the GPUs (training/plan.py)
        check_engine_context(cfg)  # the engine's context within the model's positions
        if cfg.runtime != "ray" and is_rank0:  # (on Ray each node's workers ask theirs)
            docker_client()  # before the model: a run with no Docker engine is said at once, with the fix
        runtime = start_runtime(cfg)
    except (ConfigError, SandboxError, LayoutError, ClusterError, ContextTooLong) as e:
        if is_rank0:
            say_error(e)
        return 2
    with runtime:
        return train(cfg, runtime) if runtime.is_main else runtime.follow()


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    transformers.utils.logging.disable_progress_bar()  # shard-writing bars would break up the run's own
    code = run(cfg)
    if code:
        sys.exit(code)


if __name__ == "__main__":
    main()
