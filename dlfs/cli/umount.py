"""``dlfs umount MNT``: unmount a dlfs mount; its daemon then exits by itself."""

from __future__ import annotations

import argparse

from dlfs.cli.common import Subparsers, add_command


def add_parser(sub: Subparsers) -> None:
    p = add_command(sub, "umount", run, help="unmount a dlfs mount")
    p.add_argument("mountpoint")
    p.add_argument("--lazy", "-z", action="store_true", help="detach now even if busy")


def run(args: argparse.Namespace) -> int:
    from dlfs.fuse.mount import unmount

    unmount(args.mountpoint, lazy=args.lazy)
    return 0
