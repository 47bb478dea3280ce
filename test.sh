#!/usr/bin/env bash
# Second command: run the tests (sets up what they need first: venv, Docker engine, image).
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/bootstrap.sh
exec .venv/bin/python -m pytest -q "$@"
