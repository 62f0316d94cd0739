"""``dlfs stats MNT``: what a mount is doing, from its ``.dlfs/stats`` (``dlfs.stats``)."""

from __future__ import annotations

import argparse
import json

from dlfs.cli.common import Subparsers, add_command
from dlfs.core.errors import DlfsError


def add_parser(sub: Subparsers) -> None:
    p = add_command(sub, "stats", run, help="what a mount is doing: reads, caches, waits, latency")
    p.add_argument("mountpoint")
    p.add_argument(
        "--watch",
        type=float,
        nargs="?",
        const=1.0,
        metavar="SECONDS",
        help="print rates every SECONDS (default 1) until interrupted, instead of the totals since mounting",
    )
    p.add_argument("--json", action="store_true", help="JSON: one object, or one line per interval")


def run(args: argparse.Namespace) -> int:
    from dlfs import stats

    if args.watch is None:
        now = stats.figures(stats.snapshot(args.mountpoint))
        print(json.dumps(stats.summary(now), indent=2) if args.json else stats.table(args.mountpoint, now))
        return 0
    if args.watch <= 0:
        raise DlfsError("--watch takes a positive number of seconds")
    for rates in stats.watch(args.mountpoint, args.watch):
        print(json.dumps(rates) if args.json else stats.line(rates), flush=True)
    return 0
