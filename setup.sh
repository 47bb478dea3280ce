#!/usr/bin/env bash
# First command on a fresh machine: set everything up, then run the main job.
# Main job (until the trainer lands): grade every built-in task with its gold patch in real
# sandboxes and print the report.
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/bootstrap.sh
exec .venv/bin/python -m eval.swebench --dataset builtin --predictions gold --run-id setup \
  --output outputs/eval/builtin-gold "$@"
