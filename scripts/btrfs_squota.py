"""Put a mounted btrfs filesystem under simple quotas (squota, Linux 6.7 and later), the mode in
which a subvolume's qgroup counts the extents it wrote itself, so deleting a subvolume costs the
kernel no backreference walk. Full qgroups (what `btrfs quota enable` gives) are switched off
first: under them every removed container leaves btrfs-cleaner a clean-up that grows with the
count (RELIABILITY.md, "Disk"). Debian 12's btrfs-progs (6.2) has no switch for simple quotas,
so this calls the kernel's quota ioctl itself.

    python3 scripts/btrfs_squota.py MOUNTPOINT [--check]

Prints the mode after, one word: `squota`. `--check` changes nothing and prints the mode now:
`squota`, `qgroup` (full) or `off`. Exit 2 where the kernel has no simple quotas (the caller
then starts no quota engine); 1 on other errors. Needs root (the ioctls are CAP_SYS_ADMIN).
Standard library only: scripts/docker_quota.sh runs it with the system's python3, before any
virtual environment exists.
"""

from __future__ import annotations

import fcntl
import os
import struct
import sys
import uuid
from pathlib import Path

# linux/btrfs.h: _IOWR(0x94, 40, struct btrfs_ioctl_quota_ctl_args {u64 cmd; u64 status;}) and
# _IOR(0x94, 31, struct btrfs_ioctl_fs_info_args), 1,024 bytes, its fsid at byte 16
BTRFS_IOC_QUOTA_CTL = 0xC0109428
BTRFS_IOC_FS_INFO = 0x8400941F
QUOTA_CTL_DISABLE, QUOTA_CTL_ENABLE_SIMPLE = 2, 4
FEATURE = Path("/sys/fs/btrfs/features/simple_quota")


def fsid(fd: int) -> str:
    buf = bytearray(1024)
    fcntl.ioctl(fd, BTRFS_IOC_FS_INFO, buf)
    return str(uuid.UUID(bytes=bytes(buf[16:32])))


def mode(fd: int) -> str:
    """"squota", "qgroup" or "off", as the kernel says in sysfs."""
    qgroups = Path("/sys/fs/btrfs") / fsid(fd) / "qgroups"
    if not (qgroups / "mode").exists():
        return "off"
    return (qgroups / "mode").read_text().strip()


def quota_ctl(fd: int, cmd: int) -> None:
    fcntl.ioctl(fd, BTRFS_IOC_QUOTA_CTL, bytearray(struct.pack("QQ", cmd, 0)))


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-") or len(argv) > 2 or argv[1:] not in ([], ["--check"]):
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 1
    try:
        fd = os.open(argv[0], os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        print(f"btrfs_squota: {argv[0]}: {e.strerror}", file=sys.stderr)
        return 1
    try:
        now = mode(fd)
        if argv[1:] == ["--check"] or now == "squota":
            print(now)
            return 0
        if not FEATURE.exists():
            print(f"btrfs_squota: this kernel ({os.uname().release}) has no simple quotas "
                  f"({FEATURE} is missing; Linux 6.7 and later have them)", file=sys.stderr)
            return 2
        if now == "qgroup":
            quota_ctl(fd, QUOTA_CTL_DISABLE)
        quota_ctl(fd, QUOTA_CTL_ENABLE_SIMPLE)
        print(mode(fd))
        return 0
    except OSError as e:
        print(f"btrfs_squota: {argv[0]}: {e.strerror} (is it btrfs, and are you root?)", file=sys.stderr)
        return 1
    finally:
        os.close(fd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
