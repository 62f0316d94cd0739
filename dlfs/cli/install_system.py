"""``dlfs install-system``: the links and the systemd unit that ``mount -t fuse.dlfs``, fstab and
``systemctl start dlfs@…`` need (``dlfs.system_install``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from dlfs.cli.common import Subparsers, add_command


def add_parser(sub: Subparsers) -> None:
    p = add_command(
        sub,
        "install-system",
        run,
        help="link dlfs and its mount helper (mount -t fuse.dlfs, fstab) into /usr/local/bin and /sbin "
        "and write its systemd unit dlfs@.service into /usr/local/lib/systemd/system (root)",
    )
    p.add_argument("--root", default="/", help="install under this directory instead of / (packaging)")
    p.add_argument(
        "--keep-links",
        action="store_true",
        help="leave links that point to another dlfs install which still exists (make install uses it)",
    )


def run(args: argparse.Namespace) -> int:
    from dlfs.system_install import install

    changes = install(Path(args.root), keep_links=args.keep_links)
    if changes or not args.quiet:
        print("\n".join(changes) or f"dlfs is installed under {args.root} already")
    return 0
