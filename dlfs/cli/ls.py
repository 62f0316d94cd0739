"""``dlfs ls DATASET [PATH]``: a dataset's tree from its index alone, without mounting it."""

from __future__ import annotations

import argparse
import os
import stat
import time
from typing import TYPE_CHECKING

from dlfs.cli.common import Subparsers, add_command, load_index, store_flags
from dlfs.core.errors import DlfsError

if TYPE_CHECKING:
    from dlfs.core.index import Index


def add_parser(sub: Subparsers) -> None:
    p = add_command(sub, "ls", run, help="list a dataset's index without mounting")
    p.add_argument("dataset")
    p.add_argument("path", nargs="?", default="", help="a path inside the dataset (default: the root)")
    p.add_argument("-l", "--long", action="store_true", help="mode, links, owner, size, mtime")
    p.add_argument("-R", "--recursive", action="store_true", help="list subdirectories too, with full paths")
    store_flags(p)


def run(args: argparse.Namespace) -> int:
    index = load_index(args)
    row = index.resolve(os.fsencode(args.path))
    if row is None:
        raise DlfsError(f"{args.path}: no such file or directory in {args.dataset}")
    if args.long and index.transform:
        print(f"transform: {index.transform}; sizes are of the stored bytes")
    if args.long and index.in_place:
        print(index.in_place)
    for entry, shown in index.listing(row, args.recursive):
        print(_line(index, entry, shown) if args.long else os.fsdecode(shown) or ".")
    return 0


def _line(index: Index, row: int, shown: bytes) -> str:
    """``ls -l``'s line of a row."""
    a = index.attrs(row)
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(a.mtime_ns / 1e9))
    name = os.fsdecode(shown) or "."
    line = f"{stat.filemode(a.mode)} {a.nlink:>3} {a.uid:>5} {a.gid:>5} {a.size:>12} {when} {name}"
    if index.is_symlink(row):
        line += " -> " + os.fsdecode(index.readlink(row))
    return line
