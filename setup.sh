#!/usr/bin/env bash
# First command on a fresh machine: set everything up, then run the main job: the embedded
# default training run (tiny model + SFT warm start, SAO, real sandboxes; minutes on 2 CPUs).
# Extra arguments are Hydra overrides, e.g. ./setup.sh trainer.max_steps=10
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/bootstrap.sh
exec .venv/bin/python -m training.run "$@"
