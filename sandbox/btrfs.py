"""The few btrfs ioctls the disk bound needs, from the standard library alone (scripts/btrfs_squota.py
runs this with the system's python3 before any virtual environment exists).

A Docker engine that scripts/docker_quota.sh starts where the kernel has no XFS quota runs the
overlay2 driver on a btrfs loop filesystem under *simple quotas* (squota, Linux 6.7 and later):
a subvolume's qgroup counts the extents written inside it, nothing it shares. Each sandbox's
writable layer is made a subvolume of its own with a limit (`bound_layer`, called between the
container's create and its start), so the kernel refuses a write past `disk_mb` with EDQUOT,
and removing the container is overlay2's plain removal of a directory: no snapshot of the image
to drop, no backreference walk (full qgroups, `btrfs quota enable`, made every removal leave
btrfs-cleaner a walk whose backlog grew with the count; the btrfs storage driver walks the whole
image's tree on each removal; RELIABILITY.md, "Disk"). Debian 12's btrfs-progs (6.2) has no
switch for simple quotas, hence the ioctls.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import struct
import subprocess
import uuid
from pathlib import Path

# linux/btrfs.h (_IOW / _IOR / _IOWR of magic 0x94)
IOC_QUOTA_CTL = 0xC0109428  # _IOWR(40, struct btrfs_ioctl_quota_ctl_args {u64 cmd; u64 status;})
IOC_FS_INFO = 0x8400941F  # _IOR(31, struct btrfs_ioctl_fs_info_args, 1,024 bytes; fsid at byte 16)
IOC_SUBVOL_CREATE = 0x5000940E  # _IOW(14, struct btrfs_ioctl_vol_args {s64 fd; char name[4088];})
IOC_QGROUP_LIMIT = 0x8030942B  # _IOR(43, struct btrfs_ioctl_qgroup_limit_args {u64 qgroupid; 5 x u64 limit})
QUOTA_CTL_DISABLE, QUOTA_CTL_ENABLE_SIMPLE = 2, 4
LIMIT_MAX_RFER = 1  # BTRFS_QGROUP_LIMIT_MAX_RFER
FEATURE = Path("/sys/fs/btrfs/features/simple_quota")


def _fd(path: str | os.PathLike) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY)


def fsid(path: str | os.PathLike) -> str:
    """The UUID of the btrfs filesystem `path` is on (OSError where it is not btrfs)."""
    fd = _fd(path)
    try:
        buf = bytearray(1024)
        fcntl.ioctl(fd, IOC_FS_INFO, buf)
        return str(uuid.UUID(bytes=bytes(buf[16:32])))
    finally:
        os.close(fd)


def quota_mode(path: str | os.PathLike) -> str:
    """"squota", "qgroup" (full qgroups) or "off", as the kernel says of `path`'s filesystem."""
    mode = Path("/sys/fs/btrfs") / fsid(path) / "qgroups" / "mode"
    return mode.read_text().strip() if mode.exists() else "off"


def _quota_ctl(path: str | os.PathLike, cmd: int) -> None:
    fd = _fd(path)
    try:
        fcntl.ioctl(fd, IOC_QUOTA_CTL, bytearray(struct.pack("QQ", cmd, 0)))
    finally:
        os.close(fd)


def enable_simple_quotas(path: str | os.PathLike) -> str:
    """Put `path`'s filesystem under simple quotas (full qgroups switched off first); returns the
    mode after. RuntimeError where the kernel has none."""
    now = quota_mode(path)
    if now == "squota":
        return now
    if not FEATURE.exists():
        raise RuntimeError(f"this kernel ({os.uname().release}) has no btrfs simple quotas "
                           f"({FEATURE} is missing; Linux 6.7 and later have them)")
    if now == "qgroup":
        _quota_ctl(path, QUOTA_CTL_DISABLE)
    _quota_ctl(path, QUOTA_CTL_ENABLE_SIMPLE)
    return quota_mode(path)


def create_subvolume(path: str | os.PathLike) -> None:
    """A new, empty subvolume at `path` (its parent must exist on btrfs; `path` must not)."""
    path = Path(path)
    name = os.fsencode(path.name)
    if len(name) >= 4088 or b"/" in name:
        raise ValueError(f"bad subvolume name {path.name!r}")
    fd = _fd(path.parent)
    try:
        fcntl.ioctl(fd, IOC_SUBVOL_CREATE, bytearray(struct.pack("q4088s", 0, name)))  # mutable: over 1,024 bytes
    finally:
        os.close(fd)


def limit(subvolume: str | os.PathLike, max_bytes: int) -> None:
    """Limit what `subvolume`'s own qgroup may count (under simple quotas: what is written in it)."""
    fd = _fd(subvolume)
    try:  # qgroupid 0: the subvolume the ioctl is called on
        fcntl.ioctl(fd, IOC_QGROUP_LIMIT, struct.pack("6Q", 0, LIMIT_MAX_RFER, max_bytes, 0, 0, 0))
    finally:
        os.close(fd)


def bound_layer(upper_dir: str | os.PathLike, max_bytes: int) -> None:
    """Make the overlay2 layer folder holding `upper_dir` (its `diff`, with `work`, `link` and
    `lower` beside it: upper and work must stay on one subvolume, overlayfs renames between them)
    a subvolume limited to `max_bytes`: a copy of it made as one, swapped in for it. Called
    between a container's create and its start, while nothing has it open."""
    layer = Path(upper_dir).parent
    fresh, old = layer.with_name(layer.name + ".sao-sv"), layer.with_name(layer.name + ".sao-old")
    create_subvolume(fresh)
    try:  # cp -a: modes, owners, times and the xattrs overlayfs reads, as the engine left them
        subprocess.run(["cp", "-a", f"{layer}/.", f"{fresh}/"], check=True, capture_output=True, timeout=60)
        limit(fresh, max_bytes)
        os.rename(layer, old)
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        raise
    os.rename(fresh, layer)
    shutil.rmtree(old, ignore_errors=True)
