#!/usr/bin/env python3
"""A slow disk on demand: a loop-mounted ext4 image read through a cgroup v1 blkio throttle.

On a 2-core machine the loader decodes ~300 images/s, so storage only shows when it is slow. This
builds one: ``up`` makes an ext4 image, attaches it as a loop device (direct I/O, so the backing
file's page cache does not hide the limit), mounts it and sets ``blkio.throttle.read_iops_device``
and ``read_bps_device`` for it in the cgroup ``dlfs-slowdisk`` (a rule per disk: several may be up
at once); ``run`` executes a command inside that cgroup (every process it starts, a dlfs daemon
included, reads at the limit); ``down`` undoes it all. Writes are not limited, so filling the disk
is quick. Needs root and cgroup v1 blkio (netem and device-mapper delay do not work on this
machine; these do)::

    tools/slowdisk.py up bench-data/slow --size 8G --iops 200 --bps 100M
    cp -a tree bench-data/slow/ && sync && echo 3 > /proc/sys/vm/drop_caches
    tools/slowdisk.py run -- python tools/train_imagefolder.py bench-data/slow/tree
    tools/slowdisk.py down bench-data/slow
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup/blkio/dlfs-slowdisk")


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)


def _loop_of(mnt: Path) -> str | None:
    """The loop device mounted at ``mnt`` (None when nothing is)."""
    found = subprocess.run(
        ["findmnt", "-n", "-o", "SOURCE", "--mountpoint", str(mnt.resolve())], capture_output=True, text=True
    ).stdout.strip()
    return found or None


def up(mnt: Path, size: int, iops: int, bps: int, inodes: int | None = None) -> str:
    """Create, attach, mount and throttle; returns the loop device. ``inodes``: at least this many
    (mkfs.ext4 gives one per 16 KiB, 524,288 in 8 GiB: too few for ImageNet's 1.28 M files)."""
    if _loop_of(mnt):
        raise SystemExit(f"{mnt} is already mounted; run 'tools/slowdisk.py down {mnt}' first")
    image = mnt.with_suffix(".img")
    image.unlink(missing_ok=True)
    with open(image, "wb") as f:
        f.truncate(size)
    more = ["-N", str(inodes)] if inodes else []
    subprocess.run(["mkfs.ext4", "-q", "-F", *more, str(image)], check=True)
    loop = subprocess.run(
        ["losetup", "--find", "--show", "--direct-io=on", str(image)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    mnt.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", loop, str(mnt)], check=True)
    throttle(loop, iops, bps)
    return loop


LIMITS = ("blkio.throttle.read_iops_device", "blkio.throttle.read_bps_device")


def throttle(loop: str, iops: int, bps: int) -> None:
    """Limit reads of ``loop`` in the cgroup; a limit of 0 removes the device's rule. Each slow disk
    has a rule of its own, so one disk's ``down`` leaves another's limits in place."""
    rdev = os.stat(loop).st_rdev
    device = f"{os.major(rdev)}:{os.minor(rdev)}"
    CGROUP.mkdir(exist_ok=True)
    for name, limit in zip(LIMITS, (iops, bps), strict=True):
        (CGROUP / name).write_text(f"{device} {limit}\n")


def enter() -> None:
    """Move this process (and so everything it starts from now on) into the throttled cgroup."""
    (CGROUP / "cgroup.procs").write_text(f"{os.getpid()}\n")


def leave() -> None:
    Path(CGROUP.parent, "cgroup.procs").write_text(f"{os.getpid()}\n")


def down(mnt: Path) -> None:
    loop = _loop_of(mnt)
    if loop:
        if CGROUP.exists():
            throttle(loop, 0, 0)
        subprocess.run(["umount", str(mnt)], check=True)
        subprocess.run(["losetup", "--detach", loop], check=True)
    mnt.with_suffix(".img").unlink(missing_ok=True)
    if CGROUP.exists() and not any((CGROUP / name).read_text().strip() for name in LIMITS):
        CGROUP.rmdir()  # the last slow disk is gone


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("up", help="create and mount a throttled ext4 image at MNT (image: MNT.img)")
    p.add_argument("mnt", type=Path)
    p.add_argument("--size", type=parse_size, default="8G")
    p.add_argument("--iops", type=int, default=200, help="read operations per second (default 200)")
    p.add_argument("--bps", type=parse_size, default="100M", help="read bytes per second (default 100M)")
    p.add_argument("--inodes", type=int, help="at least this many inodes (default: one per 16 KiB)")
    p = sub.add_parser("run", help="run a command inside the throttled cgroup")
    p.add_argument("argv", nargs=argparse.REMAINDER)
    p = sub.add_parser("down", help="unmount, detach and remove the image and its limits")
    p.add_argument("mnt", type=Path)
    args = parser.parse_args()
    if args.command == "up":
        print(up(args.mnt, args.size, args.iops, args.bps, args.inodes))
    elif args.command == "run":
        argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        enter()
        os.execvp(argv[0], argv)
    else:
        down(args.mnt)


if __name__ == "__main__":
    sys.exit(main())
