#!/usr/bin/env bash
# Second command: run the tests (sets up what they need first: venv, Docker engine, image).
# Three pytest workers (files whole to one worker: a file's engine, cluster or sandboxes are
# shared by its tests): most tests wait on containers and child processes, so they overlap on
# two cores (fresh clone, quiet 2-core machine, 2026-12-06: 28 min 30 s with three, 30 min 57 s
# with two, the one sandbox change between them aside). Tests marked `serial` (one restarts the Docker engine) run alone afterwards.
# SAO_TEST_WORKERS=0 runs everything in one process. Extra arguments go to both pytest runs.
set -euo pipefail
cd "$(dirname "$0")"
SAO_DOCKER_QUOTA="${SAO_DOCKER_QUOTA:-0}" bash scripts/bootstrap.sh  # a Docker engine it starts: the plain one (bootstrap.sh says why)
set +e
.venv/bin/python -m pytest -q -n "${SAO_TEST_WORKERS:-3}" --dist loadfile -m "not serial" "$@"
parallel=$?
.venv/bin/python -m pytest -q -m serial "$@"
serial=$?
# 5 is "no test collected": arguments that select tests of one part only leave the other empty
if [ "$parallel" -eq 5 ] && [ "$serial" -eq 5 ]; then exit 5; fi
[ "$parallel" -eq 5 ] && parallel=0
[ "$serial" -eq 5 ] && serial=0
if [ "$parallel" -ne 0 ]; then exit "$parallel"; fi
exit "$serial"
