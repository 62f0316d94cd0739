"""``dlfs mount DATASET MNT``: a background daemon (``dlfs.fuse.mount.spawn``), or with
``--foreground`` the daemon itself (``dlfs.fuse.daemon.serve``), which the background mount, the
mount helper and systemd start."""

from __future__ import annotations

import argparse
import os
import sys
import time

from dlfs.cli.common import (
    SIZES,
    Subparsers,
    add_command,
    bug_message,
    hidden_alias,
    parse_size,
    parse_size_or_auto,
    store_flags,
    store_options,
)
from dlfs.core.choices import ORDER_MODES
from dlfs.core.errors import DlfsError
from dlfs.fuse.mount import READY_TIMEOUT, MountOptions, spawn


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"not a TCP port: {text!r} (1-65535)")
    return int(text)


def add_parser(sub: Subparsers) -> None:
    p = add_command(sub, "mount", run, help="mount a dataset read-only", epilog=SIZES)
    d, D = MountOptions(), "(default %(default)s)"  # each flag's default is MountOptions' own
    p.add_argument("dataset", help="the dataset written by dlfs pack: a directory or s3://BUCKET/PREFIX")
    p.add_argument("mountpoint", help="an empty directory")
    p.add_argument(
        "--foreground", "-f", action="store_true", help="serve in this process (systemd, debugging)"
    )
    p.add_argument("--allow-other", action="store_true", help="let other users access the mount")
    p.add_argument(
        "--ram-cache-size",
        type=parse_size,
        default=f"{d.ram_cache_size >> 20}M",
        metavar="SIZE",
        help=f"RAM for file payloads in the daemon; the read-ahead's budget and buffers add to it {D}",
    )
    hidden_alias(p, "--cache-size", dest="ram_cache_size", type=parse_size)
    p.add_argument(
        "--memory-limit",
        type=parse_size,
        metavar="SIZE",
        help="bound on the daemon's resident memory: index, interpreter, cache, read-ahead and its "
        "buffers together; the budgets are fitted to it at mount (default: none, the budgets as given)",
    )
    p.add_argument("--threads", type=int, default=d.threads, help=f"concurrent storage reads {D}")
    p.add_argument(
        "--native-threads",
        type=int,
        default=d.native_threads,
        help="threads answering lookups, attributes, reads, ioctls and statfs in C, without Python; "
        f"0: every request goes through Python (default: one per core, {d.native_threads} here)",
    )
    p.add_argument(
        "--region-ahead",
        type=parse_size_or_auto,
        default="auto",
        metavar="SIZE",
        help="when a file read in C is not in memory, have the kernel read the whole SIZE-aligned "
        "region of its shard into the page cache at once, so that reading in no published order "
        "(shuffle=True) is not bound by the disk's IOPS; 0 turns it off (default auto: 4M when the "
        "shards fit in half the machine's memory, else 0)",
    )
    p.add_argument("--fuse-debug", action="store_true", help="libfuse request tracing (foreground)")
    p.add_argument("--systemd", action="store_true", help="send READY=1 to systemd when mounted")
    p.add_argument(
        "--metrics-port",
        type=_port,
        metavar="PORT",
        help="serve the mount's counters in Prometheus text format on this TCP port (default: off)",
    )
    p.add_argument(
        "--metrics-addr",
        default=d.metrics_addr,
        metavar="ADDR",
        help=f"address --metrics-port listens on; 0.0.0.0 or :: for every interface {D}",
    )
    p.add_argument("--seed", type=int, default=d.seed, help=f"seed of the published epoch orders {D}")
    p.add_argument(
        "--order",
        choices=ORDER_MODES,
        default=d.order,
        help=f"published order: uniform shuffle, or block-wise for slow media {D}",
    )
    p.add_argument("--block", type=int, default=d.block, help=f"files per run in --order block {D}")
    p.add_argument("--window", type=int, default=d.window, help=f"shuffle window in --order block {D}")
    p.add_argument(
        "--readahead-budget",
        type=parse_size,
        default=f"{d.readahead_budget >> 20}M",
        metavar="SIZE",
        help=f"bytes read ahead of each reader; 0 turns read-ahead off {D}",
    )
    p.add_argument(
        "--readahead-inflight",
        type=int,
        default=d.readahead_inflight,
        help=f"storage batches the read-ahead keeps in flight {D}",
    )
    p.add_argument(
        "--readahead-pause",
        type=float,
        default=d.readahead_pause,
        metavar="SECONDS",
        help="a reader unseen this long has its read-ahead paused until it reads again: it keeps "
        f"what it fetched, and the kernel forgetting it fetches nothing meanwhile; inf: never {D}",
    )
    p.add_argument(
        "--readdirplus",
        choices=("always", "auto"),
        default=d.readdirplus,
        help="auto: attributes for folders only, so a scan or find builds no inode per file and runs "
        "at native speed; once a scan has listed the whole tree, the daemon lists it again with "
        "attributes in the background (with the read-ahead on), for the pushes; always: every "
        "listing carries attributes, the scan itself builds the inodes (a cold scan of millions of "
        f"files 2-3x slower; a first epoch that starts the moment the scan ends, faster) {D}",
    )
    p.add_argument(
        "--ready-timeout",
        type=float,
        default=READY_TIMEOUT,
        metavar="SECONDS",
        help="give up on a background mount not ready after this long; the daemon reads the whole "
        f"index first, which takes minutes on very slow storage (default {READY_TIMEOUT:g})",
    )
    p.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    store_flags(p, cache=True)


def run(args: argparse.Namespace) -> int:
    options = MountOptions.from_args(args, store_options(args))
    if not args.foreground:
        started = time.monotonic()
        pid, log_file, notes = spawn(args.argv, args.mountpoint, options, args.ready_timeout)
        for note in notes:  # stderr even with --log-file: the daemon's log holds them too
            print(f"dlfs: warning: {note}", file=sys.stderr)
        print(
            f"mounted {args.dataset} on {args.mountpoint} in {time.monotonic() - started:.2f} s "
            f"(daemon pid {pid}, log {log_file}); order seed {args.seed}, mode {args.order}"
        )
        return 0

    def answer(message: str) -> None:
        """Tell the waiting ``dlfs mount`` (``--ready-fd``) how the start went, once."""
        if args.ready_fd is not None:
            os.write(args.ready_fd, message.encode())
            os.close(args.ready_fd)
            args.ready_fd = None

    def ready(notes: list[str]) -> None:
        answer("".join(f"{line}\n" for line in ["ok", *notes]))
        if args.systemd:
            _notify_systemd()

    from dlfs.fuse.daemon import serve

    try:
        serve(args.dataset, args.mountpoint, options, ready)
    except DlfsError as exc:
        answer(f"error: {exc}\n")
        raise
    except Exception as exc:  # a bug: said so at once; its traceback goes to the daemon's log
        answer(f"error: {bug_message(exc)}; please report it, with the daemon's log\n")
        raise
    return 0


def _notify_systemd() -> None:
    """Tell systemd (Type=notify) the mount is ready, without a libsystemd dependency."""
    import socket

    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.connect(address)
        sock.sendall(b"READY=1")
