#!/usr/bin/env bash
# Start dockerd on a filesystem where `--storage-opt size=` is an exact bound on what a container
# writes, so a sandbox's disk limit (Limits.disk_mb) is enforced by the kernel, not watched:
#
#   1. XFS mounted with project quotas (pquota): overlay2 puts each container's writable layer
#      under a project quota of `size`; a write past it fails with ENOSPC.
#   2. else Btrfs with simple quotas (kernels built without XFS quota support, such as this
#      project's VMs; simple quotas need Linux 6.7+), with the overlay2 driver on it: each
#      sandbox's writable layer is made a subvolume limited to its disk_mb by sandbox/docker.py
#      (sandbox/btrfs.py) between the container's create and start, so a write past it fails
#      with EDQUOT ("Disk quota exceeded"), and removing a container stays overlay2's directory
#      removal. Not the btrfs storage driver: it snapshots the image for every container and walks
#      the image's whole tree at every removal (about 1.4 s more a sandbox than overlay2 here);
#      never full qgroups (`btrfs quota enable`): each removed container leaves the kernel's
#      cleaner a backreference walk, a backlog that grows with the count (RELIABILITY.md, "Disk").
#      scripts/btrfs_squota.py sets the mode (Debian 12's btrfs-progs has no switch for it).
#   3. else the plain daemon on its default data root (and sandbox/docker.py watches the disk).
#
# Upgrades: an engine an earlier version of this script started (the btrfs driver at this
# script's data root) is moved: its filesystem to simple quotas at once, then, where it runs no
# container, the engine itself is stopped and started again with overlay2 on the same filesystem
# (the btrfs driver's images are not carried over: ./setup.sh builds the base image again; its
# old layers stay under DATA_ROOT/btrfs until removed). With containers running it is left on
# simple quotas and the one command that finishes the move is said.
#
# The filesystem lives in a sparse loop file (its size is capped by the free space beside it),
# mounted at the daemon's data root. Idempotent: a data root already mounted is reused, a loop
# file already made is mounted again (after a reboot), and when a daemon already answers on the
# socket nothing is changed at all.
#
#   scripts/docker_quota.sh [-- EXTRA DOCKERD ARGS]       (as root)
#
# Settings (environment):
#   SAO_DOCKER_FS       auto (xfs, then btrfs, then plain) | xfs | btrfs | plain      [auto]
#   SAO_DOCKER_ROOT     mount point and --data-root                     [/var/lib/docker-quota]
#   SAO_DOCKER_IMG      the loop file                                   [$SAO_DOCKER_ROOT.img]
#   SAO_DOCKER_IMG_GB   the loop file's size in GB (sparse)                               [40]
#   SAO_DOCKER_HOST     the socket to serve                  [unix:///var/run/docker.sock]
#   SAO_DOCKER_PIDFILE, SAO_DOCKER_EXEC_ROOT   dockerd's --pidfile, --exec-root  [its defaults]
#   SAO_DOCKER_LOG      dockerd's log                                  [/var/log/sao-dockerd.log]
#   SAO_DOCKER_FALLBACK plain: start the plain daemon when no quota filesystem can be had;
#                       none: start nothing then (exit 2)                                [plain]
# A second daemon beside the main one (development, benchmarks) sets SAO_DOCKER_HOST,
# SAO_DOCKER_PIDFILE, SAO_DOCKER_EXEC_ROOT and SAO_DOCKER_ROOT to paths of its own, and
# SAO_DOCKER_FALLBACK=none: the plain daemon would share the main one's data root.
# Prints, last, one line `bound: quota (xfs)`, `bound: quota (btrfs)` or `bound: watch (...)`.
set -uo pipefail

FS="${SAO_DOCKER_FS:-auto}"
DATA_ROOT="${SAO_DOCKER_ROOT:-/var/lib/docker-quota}"
IMG="${SAO_DOCKER_IMG:-$DATA_ROOT.img}"
IMG_GB="${SAO_DOCKER_IMG_GB:-40}"
HOST="${SAO_DOCKER_HOST:-unix:///var/run/docker.sock}"
LOG="${SAO_DOCKER_LOG:-/var/log/sao-dockerd.log}"
FALLBACK="${SAO_DOCKER_FALLBACK:-plain}"
EXTRA=()
[ "${1:-}" = "--" ] && shift
EXTRA+=("$@")
DAEMON_ARGS=(--host "$HOST")
[ -n "${SAO_DOCKER_PIDFILE:-}" ] && DAEMON_ARGS+=(--pidfile "$SAO_DOCKER_PIDFILE")
[ -n "${SAO_DOCKER_EXEC_ROOT:-}" ] && DAEMON_ARGS+=(--exec-root "$SAO_DOCKER_EXEC_ROOT")
MIN_GB=8  # below this a loop file is not worth it: the plain daemon instead

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }
warn() { printf 'docker_quota: %s\n' "$*" >&2; }
answers() { DOCKER_HOST="$HOST" docker info >/dev/null 2>&1; }

if [ "$(id -u)" != 0 ]; then echo "error: scripts/docker_quota.sh must run as root" >&2; exit 1; fi
case "$FS" in auto|xfs|btrfs|plain) ;; *) echo "error: SAO_DOCKER_FS=$FS: auto, xfs, btrfs or plain" >&2; exit 1;; esac

SQUOTA="$(dirname "${BASH_SOURCE[0]}")/btrfs_squota.py"
PY3="${SAO_SYSTEM_PYTHON:-python3}"

engine_pid() {  # the pid of the dockerd serving $HOST from $DATA_ROOT ('' if none)
  local pid
  for pid in $(pgrep -x dockerd); do
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "--data-root $DATA_ROOT " && { echo "$pid"; return; }
  done
}

if answers; then
  driver=$(DOCKER_HOST="$HOST" docker info --format '{{.Driver}}' 2>/dev/null)
  root=$(DOCKER_HOST="$HOST" docker info --format '{{.DockerRootDir}}' 2>/dev/null)
  if [ "$driver" = btrfs ] && [ "$root" = "$DATA_ROOT" ]; then
    # an earlier version's engine: the btrfs driver, and maybe full qgroups
    say "the Docker engine at $HOST is an earlier setup's (the btrfs driver at $DATA_ROOT): moving it"
    mode=$("$PY3" "$SQUOTA" "$DATA_ROOT") || { warn "could not turn on simple quotas on $DATA_ROOT"; exit 1; }
    say "its filesystem is under simple quotas now (full qgroups, if they were on, are off)"
    running=$(DOCKER_HOST="$HOST" docker ps -q 2>/dev/null | wc -l)
    pid=$(engine_pid)
    if [ "$running" != 0 ] || [ -z "$pid" ] || [ "${SAO_DOCKER_MOVE:-1}" = 0 ]; then
      warn "left running on the btrfs driver ($running container(s) running): each removal still walks the image;"
      warn "to finish the move once they are done: sudo SAO_DOCKER_MOVE=1 $0  (./setup.sh then builds the base image again)"
      echo "bound: quota (btrfs driver, simple quotas)"
      exit 0
    fi
    say "stopping it (pid $pid) to start it again with overlay2 on the same filesystem"
    kill "$pid"
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -0 "$pid" 2>/dev/null && { warn "dockerd (pid $pid) did not stop within 60 s"; exit 1; }
  else
    say "a Docker engine already answers at $HOST (storage driver $driver): left as it is"
    exit 0
  fi
fi

squota() {  # btrfs at $DATA_ROOT under simple quotas: 0, else 1 (said)
  local out rc
  out=$("$PY3" "$SQUOTA" "$DATA_ROOT" 2>&1); rc=$?
  [ $rc = 0 ] && [ "$out" = squota ] && return 0
  warn "no simple quotas on $DATA_ROOT: $out"
  return 1
}

mounted_fs() {  # the filesystem type mounted at $DATA_ROOT ('' if none), and its options
  findmnt -n -o FSTYPE,OPTIONS --mountpoint "$DATA_ROOT" 2>/dev/null | head -1
}

# xfs with project quotas, or btrfs, mounted at $DATA_ROOT: echo its type (xfs|btrfs); 1 if not
mount_fs() {
  local want="$1" have opts
  read -r have opts <<<"$(mounted_fs)"
  if [ -n "${have:-}" ]; then  # already mounted (an earlier run): reuse it if it is one we can use
    if [ "$have" = xfs ] && [[ ",$opts," == *,prjquota,* || ",$opts," == *,pquota,* ]] && [ "$want" != btrfs ]; then
      echo xfs; return 0
    fi
    if [ "$have" = btrfs ] && [ "$want" != xfs ]; then squota && { echo btrfs; return 0; }; return 1; fi
    warn "$DATA_ROOT is mounted ($have, $opts) but not as $want with quotas: not touched"
    return 1
  fi
  mkdir -p "$DATA_ROOT" "$(dirname "$IMG")" || return 1
  local made="" created=""
  if [ -f "$IMG" ]; then
    made=$(blkid -o value -s TYPE "$IMG" 2>/dev/null || true)
  else
    local free_gb size_gb
    free_gb=$(( $(df -k --output=avail "$(dirname "$IMG")" | tail -1) / 1048576 ))
    size_gb=$IMG_GB
    if [ "$size_gb" -gt $(( free_gb * 9 / 10 )) ]; then
      size_gb=$(( free_gb * 9 / 10 ))
      warn "only $free_gb GB free beside $IMG: the loop file is made $size_gb GB, not $IMG_GB"
    fi
    if [ "$size_gb" -lt "$MIN_GB" ]; then
      warn "$size_gb GB is too small for Docker's data (at least $MIN_GB GB)"; return 1
    fi
    truncate -s "${size_gb}G" "$IMG" || return 1
    created=1
  fi
  local try
  for try in xfs btrfs; do
    [ "$want" = auto ] || [ "$want" = "$try" ] || continue
    if [ -n "$made" ] && [ "$made" != "$try" ]; then continue; fi  # a made file keeps its filesystem
    if [ -z "$made" ]; then
      case $try in
        xfs) command -v mkfs.xfs >/dev/null || { warn "no mkfs.xfs (Debian: xfsprogs)"; continue; }
             mkfs.xfs -q -f "$IMG" >/dev/null 2>&1 || { warn "mkfs.xfs failed"; continue; } ;;
        btrfs) command -v mkfs.btrfs >/dev/null || { warn "no mkfs.btrfs (Debian: btrfs-progs)"; continue; }
               mkfs.btrfs -q -f "$IMG" >/dev/null 2>&1 || { warn "mkfs.btrfs failed"; continue; } ;;
      esac
    fi
    local mopts=loop
    [ "$try" = xfs ] && mopts=loop,pquota
    if mount -o "$mopts" "$IMG" "$DATA_ROOT" 2>/dev/null; then
      [ "$try" = xfs ] && { echo xfs; return 0; }
      squota && { echo btrfs; return 0; }
      umount "$DATA_ROOT" 2>/dev/null  # btrfs without simple quotas: not worth its cost
      [ -n "$created" ] && rm -f "$IMG"
      return 1
    fi
    warn "could not mount $IMG as $try (-o $mopts): $(dmesg 2>/dev/null | grep -iE 'xfs|btrfs|loop' | tail -1 | sed 's/^\[[^]]*\] //')"
    made=""  # this file's filesystem cannot be mounted here: the next one is made over it
  done
  [ -n "$created" ] && rm -f "$IMG"  # made by this run and of no use: not left behind
  return 1
}

start_dockerd() {  # dockerd with "$@" in the background; 0 once it answers
  nohup dockerd "${DAEMON_ARGS[@]}" "${EXTRA[@]}" "$@" >>"$LOG" 2>&1 &
  local pid=$! i
  for i in $(seq 1 60); do
    answers && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
  done
  kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  return 1
}

fs=""
if [ "$FS" != plain ]; then
  if fs=$(mount_fs "$FS"); then
    say "starting dockerd on $fs at $DATA_ROOT (storage driver overlay2; log: $LOG)"
    if start_dockerd --data-root "$DATA_ROOT" --storage-driver overlay2; then
      # overlay2 takes project quotas only where its test quota works: check the engine agrees
      backing=$(DOCKER_HOST="$HOST" docker info --format '{{range .DriverStatus}}{{index . 0}}={{index . 1}};{{end}}' 2>/dev/null)
      if [[ "$backing" == *"Backing Filesystem=$fs"* ]]; then
        echo "bound: quota ($fs$([ "$fs" = btrfs ] && echo ', simple quotas, a subvolume a sandbox'))"
        exit 0
      fi
      warn "the engine reports '$backing', not overlay2 on $fs"
      echo "bound: watch (the engine on $DATA_ROOT takes no quota)"
      exit 0
    fi
    warn "dockerd did not start on $DATA_ROOT (see $LOG)"
    umount "$DATA_ROOT" 2>/dev/null || true
  fi
fi

if [ "$FALLBACK" = none ]; then
  echo "bound: none (no filesystem with quotas: ${fs:-none could be mounted}; SAO_DOCKER_FALLBACK=none: no daemon started)"
  exit 2
fi
say "starting the plain dockerd (no disk quota: the sandboxes' disk limit is watched; log: $LOG)"
start_dockerd || { echo "error: dockerd did not start; see $LOG" >&2; exit 1; }
echo "bound: watch (no filesystem with quotas: ${fs:-none could be mounted})"
