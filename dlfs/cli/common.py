"""What every ``dlfs`` command shares: the global flags, sizes, dataset locations, and the rule that
a user's error is one line on stderr and a non-zero exit, never a traceback (a bug keeps its own).

Nothing here imports trio, pyfuse3 or a layer a command calls: ``dlfs --help`` and ``dlfs umount``
load this module.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from dlfs import logs
from dlfs.core.errors import DlfsError, InternalError
from dlfs.core.store.interface import StoreOptions

if TYPE_CHECKING:  # the index is numpy-backed: loaded only by the commands that read one
    from dlfs.core.index import Index

log = logging.getLogger(__name__)

#: A command's work: the parsed flags in, the exit status out.
Command = Callable[[argparse.Namespace], int]
#: What ``dlfs``'s parser hands each command module's ``add_parser``.
Subparsers = argparse._SubParsersAction

#: Every size flag takes these suffixes (upper or lower case). All are binary: dlfs sizes are of
#: memory and shards, counted in KiB, MiB and GiB, and a decimal KB beside a binary K would make
#: ``1GB`` and ``1G`` differ by 7 %, which nobody writing either means.
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(?:([KMGT])(?:i|iB|B)?|B)?\s*", re.IGNORECASE)
#: The help text of the commands that take sizes.
SIZES = (
    "SIZE is bytes, or a number with a binary unit: K, M, G or T, alone or with i, iB or B after it "
    "(1G = 1Gi = 1GiB = 1GB = 1024M; a fraction is allowed: 1.5G)"
)


def parse_size(text: str) -> int:
    """'1G', '1Gi', '512MiB', '64k', '4096' -> bytes (``SIZES``)."""
    match = _SIZE.fullmatch(text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 4096, 512M, 1G or 1GiB)")
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "").upper()])


def parse_size_or_auto(text: str) -> int | None:
    """``parse_size``, or None for 'auto' (the daemon decides)."""
    return None if text.strip().lower() == "auto" else parse_size(text)


def human(n: float) -> str:
    """Bytes as a person reads them: ``315.1 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError("unreachable")


def global_flags(target: argparse.ArgumentParser, default: object) -> argparse.ArgumentParser:
    """-v, -q, --log-level and --log-file on ``target``. They are taken before the command and
    after it: each command has its own copy with the default ``argparse.SUPPRESS``, so that it sets
    them only when given there and leaves what the main parser took otherwise."""
    target.add_argument("-v", "--verbose", action="store_true", default=default, help="log debug messages")
    target.add_argument(
        "-q", "--quiet", action="store_true", default=default, help="no progress bars, warnings only"
    )
    target.add_argument(
        "--debug",
        action="store_true",
        default=default,
        help="log debug messages, and the traceback of an internal error (a bug in dlfs) on stderr",
    )
    unset = default if default is argparse.SUPPRESS else None
    target.add_argument(
        "--log-level",
        type=str.lower,
        choices=logs.LEVELS,
        default=unset,
        help="log messages of this level and above (default info; -v: debug, -q: warning)",
    )
    target.add_argument(
        "--log-file",
        metavar="PATH",
        default=unset,
        help="append log messages to PATH instead of stderr; a background mount's daemon logs "
        "there too (default for it: ~/.cache/dlfs/mount-MNT.log)",
    )
    return target


def add_command(sub: Subparsers, name: str, run: Command, **kwargs: object) -> argparse.ArgumentParser:
    """The parser of command ``name``, with the global flags, running ``run``."""
    flags = global_flags(argparse.ArgumentParser(add_help=False), argparse.SUPPRESS)
    parser: argparse.ArgumentParser = sub.add_parser(name, parents=[flags], **kwargs)
    parser.set_defaults(func=run)
    return parser


def store_flags(p: argparse.ArgumentParser, cache: bool = False) -> None:
    """Flags of the commands that take a dataset location, which may be ``s3://BUCKET/PREFIX``;
    with ``cache``, those of the disk tier in front of it too."""
    d = StoreOptions()
    p.add_argument(
        "--endpoint-url",
        metavar="URL",
        help="S3-compatible endpoint for s3:// locations (Ceph RGW, SeaweedFS, MinIO); default: "
        "AWS_ENDPOINT_URL or the profile's endpoint_url, else AWS. Credentials and region come the "
        "AWS way: AWS_* variables, AWS_PROFILE, ~/.aws/config and credentials",
    )
    p.add_argument(
        "--store-timeout",
        type=float,
        default=d.timeout,
        metavar="SECONDS",
        help="an object-store request, with its retries, fails after this long; a read of it then "
        f"fails with EIO and the next one tries again (default {d.timeout:g})",
    )
    if not cache:
        return
    p.add_argument(
        "--disk-tier",
        metavar="PATH",
        help="keep blocks of an s3:// dataset's shards in this local directory (e.g. on NVMe), so "
        "later epochs and remounts of the same dataset read them from there",
    )
    p.add_argument(
        "--disk-tier-size",
        type=parse_size,
        default=0,
        metavar="SIZE",
        help="bytes --disk-tier may hold; least recently used blocks go first (default: 80%% of "
        "the free space there)",
    )
    hidden_alias(p, "--cache-dir", dest="disk_tier")
    hidden_alias(p, "--cache-dir-size", dest="disk_tier_size", type=parse_size)


def hidden_alias(p: argparse.ArgumentParser, *names: str, dest: str, **kwargs: object) -> None:
    """Accept ``names`` as another spelling of the flag stored in ``dest``, left out of ``--help``:
    a spelling that scripts may still use after the flag got its one name."""
    p.add_argument(*names, dest=dest, help=argparse.SUPPRESS, default=argparse.SUPPRESS, **kwargs)  # type: ignore[arg-type]


def store_options(args: argparse.Namespace) -> StoreOptions:
    """What ``store_flags`` took."""
    return StoreOptions(
        endpoint_url=args.endpoint_url,
        timeout=args.store_timeout,
        disk_tier=getattr(args, "disk_tier", None),
        disk_tier_size=getattr(args, "disk_tier_size", 0),
    )


def load_index(args: argparse.Namespace) -> Index:
    """The index of ``args.dataset``, from a directory or an object store (through its local copy)."""
    from dlfs.core.index import Index
    from dlfs.core.store import index_copies, open_store

    options = store_options(args)
    store = open_store(args.dataset, options=options)
    try:
        return Index.load(store, index_copies(options))
    finally:
        store.close()


#: The exit status of an internal error (sysexits.h EX_SOFTWARE).
EXIT_BUG = 70


def run(args: argparse.Namespace) -> int:
    """Run the parsed command with logging as the global flags say; a ``DlfsError`` is one line on
    stderr and exit 1, Ctrl-C exit 130, a reader that went away (``dlfs ls | head``) exit 0. Any
    other exception is a bug in dlfs: one line that says so, and its traceback in the log file
    (``--log-file``) or, with ``--debug``, on stderr."""
    if args.log_level:
        level = logging.getLevelNamesMapping()[args.log_level.upper()]
    else:
        level = (
            logging.DEBUG if args.verbose or args.debug else logging.WARNING if args.quiet else logging.INFO
        )
    logging.getLogger("botocore").setLevel(logging.WARNING)  # where it found credentials, each start
    try:
        logs.configure(level, args.log_file)
        return int(args.func(args))
    except DlfsError as exc:
        print(f"dlfs: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("dlfs: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:
        if args.debug or args.log_file:
            log.error("internal error", exc_info=exc)
        where = (
            f"the log, {args.log_file}" if args.log_file else "the output of the same command with --debug"
        )
        print(f"dlfs: {bug_message(exc)}; please report it, with {where}", file=sys.stderr)
        return EXIT_BUG


def bug_message(exc: BaseException) -> str:
    """An exception that is a bug, in one line: an ``InternalError`` says where it happened."""
    if isinstance(exc, InternalError):
        return str(exc)
    return f"internal error ({type(exc).__name__}: {exc})"
