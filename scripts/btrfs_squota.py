"""Put a mounted btrfs filesystem under simple quotas (squota, Linux 6.7 and later): full qgroups
(`btrfs quota enable`) are switched off first. Why, and the ioctls: sandbox/btrfs.py.

    python3 scripts/btrfs_squota.py MOUNTPOINT [--check]

Prints the mode after, one word: `squota`. `--check` changes nothing and prints the mode now:
`squota`, `qgroup` (full) or `off`. Exit 2 where the kernel has no simple quotas (the caller
then starts no quota engine); 1 on other errors. Needs root. Standard library only:
scripts/docker_quota.sh runs it with the system's python3, before any virtual environment exists.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sandbox import btrfs  # noqa: E402  (the repository's, by path: no venv needed)


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-") or argv[1:] not in ([], ["--check"]):
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 1
    try:
        print(btrfs.quota_mode(argv[0]) if argv[1:] else btrfs.enable_simple_quotas(argv[0]))
        return 0
    except RuntimeError as e:
        print(f"btrfs_squota: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"btrfs_squota: {argv[0]}: {e.strerror} (is it btrfs, and are you root?)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
