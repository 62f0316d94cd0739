"""The ``dlfs`` command line: one module per command, each with ``add_parser`` (its flags, beside
the code that reads them) and ``run`` (its work), and ``common`` for what they share.

Every layer a command calls is imported inside its ``run``, so ``dlfs --help`` or ``dlfs umount``
loads neither numpy, pyfuse3, trio nor any command's layers (``tests/core/test_layers.py`` checks
it). This module imports even the command modules inside ``main``: the console script imports it
first thing, and a Ctrl-C that lands during an import at module level would print a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

#: What ``dlfs --help`` says first (the module docstring is for the next engineer, not the user).
DESCRIPTION = (
    "A read-only FUSE filesystem for training data: pack a tree of small files into a few shards "
    "and an index, mount it as the original tree, and read each epoch in its published shuffle "
    "order with the files fetched ahead of the reader."
)


def build_parser() -> argparse.ArgumentParser:
    from dlfs.cli import bench, common, info, install_system, ls, mount, pack, stats, umount, verify
    from dlfs.cli.version import Version

    parser = common.global_flags(argparse.ArgumentParser(prog="dlfs", description=DESCRIPTION), False)
    parser.add_argument("--version", action=Version, help="the version, and what this dlfs runs with")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # The commands in the order ``dlfs --help`` lists them.
    for command in (pack, mount, umount, install_system, verify, ls, stats, info, bench):
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        from dlfs.cli import common

        argv = list(sys.argv[1:] if argv is None else argv)
        args = build_parser().parse_args(argv)
        args.argv = argv
        # File names are bytes; print the ones that are not valid UTF-8 back as the same bytes.
        sys.stdout.reconfigure(errors="surrogateescape")  # type: ignore[union-attr]
        return common.run(args)
    except KeyboardInterrupt:
        print("dlfs: interrupted", file=sys.stderr)
        return 130
