"""The ``dlfs`` command line. User errors print one line and exit non-zero; bugs keep their traceback.

One module over 400 lines on purpose: each subcommand is a short function beside its argparse
definition, and every layer it calls is imported inside that function, so ``dlfs --help`` or
``dlfs umount`` loads neither pyfuse3 nor trio.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import stat
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dlfs import __version__, logs
from dlfs.core.errors import DatasetError, DlfsError
from dlfs.core.store.interface import StoreOptions
from dlfs.fuse.mount import READY_TIMEOUT, MountOptions

#: ``dlfs mount``'s flag defaults: the options' own, so the two never disagree.
MOUNT_DEFAULTS = MountOptions()
#: What ``dlfs --help`` says first (the module docstring is for the next engineer, not the user).
#: ``dlfs.core.order.MODES`` by name, spelt out so that the parser loads no numpy (tests check both agree).
ORDER_MODES = ("full", "block")
DESCRIPTION = (
    "A read-only FUSE filesystem for training data: pack a tree of small files into a few shards "
    "and an index, mount it as the original tree, and read each epoch in its published shuffle "
    "order with the files fetched ahead of the reader."
)

if TYPE_CHECKING:  # the CLI imports numpy-backed modules only for the commands that need them
    from dlfs.core.index import Index


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """'1G', '512MiB', '64k', '4096' -> bytes (binary units)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 512M or 1G)")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"not a TCP port: {text!r} (1-65535)")
    return int(text)


def parse_size_or_auto(text: str) -> int | None:
    """``parse_size``, or None for 'auto' (the daemon decides)."""
    return None if text.strip().lower() == "auto" else parse_size(text)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError("unreachable")


def _cmd_pack(args: argparse.Namespace) -> int:
    from dlfs.pack import DEFAULT_JOBS, PackOptions, pack
    from dlfs.pack.transform import parse as parse_transform

    options = PackOptions(
        shard_size=args.shard_size,
        jobs=args.jobs or DEFAULT_JOBS,
        compress=args.compress == "lz4",
        order=args.order,
        seed=args.seed,
        force=args.force,
        skip_errors=args.skip_errors,
        progress=not args.quiet and not args.json,
        sync=args.sync,
        store=_store_options(args),
        transform=parse_transform(args.transform) if args.transform else None,
    )
    summary = pack(args.src, args.dst, options)
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2))
        return 0
    seconds = max(summary.seconds, 1e-9)
    print(
        f"packed {summary.files} files, {summary.directories} directories, {summary.symlinks} symlinks "
        f"({_human(summary.bytes)}) into {summary.shards} shard(s) of {_human(summary.stored_bytes)} "
        f"+ index {_human(summary.index_bytes)} in {summary.seconds:.2f} s "
        f"({summary.files / seconds:,.0f} files/s, {summary.bytes / seconds / 1e6:,.1f} MB/s)"
    )
    if summary.compressed_files:
        print(f"lz4 kept for {summary.compressed_files} files")
    if summary.transform:
        kept = ", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in summary.kept_files.items())
        print(
            f"transform {summary.transform} ({summary.codec}): {summary.transformed_files} files changed, "
            f"{_human(summary.source_bytes)} of source files stored in {_human(summary.bytes)}"
            + (f", stored unchanged: {kept}" if kept else "")
        )
    if summary.skipped_special or summary.skipped_errors:
        print(
            f"skipped {summary.skipped_special} special files and {summary.skipped_errors} unreadable entries"
        )
    return 0


def _cmd_mount(args: argparse.Namespace) -> int:
    from dlfs.fuse.mount import spawn

    options = MountOptions(
        cache_size=args.cache_size,
        memory_limit=args.memory_limit,
        allow_other=args.allow_other,
        threads=args.threads,
        log_file=args.log_file,
        debug=args.debug,
        seed=args.seed,
        order=args.order,
        block=args.block,
        window=args.window,
        prefetch_budget=args.prefetch_budget,
        prefetch_inflight=args.prefetch_inflight,
        prefetch_pause=args.prefetch_pause,
        readdirplus=args.readdirplus,
        native_threads=args.native_threads,
        region_ahead=args.region_ahead,
        store=_store_options(args),
        metrics_port=args.metrics_port,
        metrics_addr=args.metrics_addr,
    )
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

    def ready(notes: list[str]) -> None:
        if args.ready_fd is not None:
            os.write(args.ready_fd, "".join(f"{line}\n" for line in ["ok", *notes]).encode())
            os.close(args.ready_fd)
        if args.systemd:
            _notify_systemd()

    from dlfs.fuse.daemon import serve

    try:
        serve(args.dataset, args.mountpoint, options, ready)
    except DlfsError as exc:
        if args.ready_fd is not None:
            os.write(args.ready_fd, f"error: {exc}\n".encode())
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


def _cmd_umount(args: argparse.Namespace) -> int:
    from dlfs.fuse.mount import unmount

    unmount(args.mountpoint, lazy=args.lazy)
    return 0


def _cmd_install_system(args: argparse.Namespace) -> int:
    from dlfs.system_install import install

    changes = install(Path(args.root), keep_links=args.keep_links)
    if changes or not args.quiet:
        print("\n".join(changes) or f"dlfs is installed under {args.root} already")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from dlfs.core.verify import verify

    report = verify(
        args.dataset, jobs=args.jobs, progress=not args.quiet and not args.json, options=_store_options(args)
    )
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        for bad in report.bad:
            print(f"BAD {bad['path']}: {bad['problem']}")
        verdict = "OK" if report.ok else f"{len(report.bad)} BAD"
        print(f"{verdict}: checked {report.files} files ({_human(report.bytes)}) in {report.seconds:.2f} s")
        if report.transform:
            print(f"transform: {report.transform}; checked as stored")
    return 0 if report.ok else 1


def _ls_line(index: Index, row: int, shown: bytes, long: bool) -> str:
    name = os.fsdecode(shown) or "."
    if not long:
        return name
    a = index.attrs(row)
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(a.mtime_ns / 1e9))
    line = f"{stat.filemode(a.mode)} {a.nlink:>3} {a.uid:>5} {a.gid:>5} {a.size:>12} {when} {name}"
    if index.is_symlink(row):
        line += " -> " + os.fsdecode(index.readlink(row))
    return line


def _load_index(args: argparse.Namespace) -> Index:
    """The index of ``args.dataset``, from a directory or an object store (through its local copy)."""
    from dlfs.core.index import Index
    from dlfs.core.store import index_copies, open_store

    options = _store_options(args)
    store = open_store(args.dataset, options=options)
    try:
        return Index.load(store, index_copies(options))
    finally:
        store.close()


def _cmd_ls(args: argparse.Namespace) -> int:
    index = _load_index(args)
    row = index.resolve(os.fsencode(args.path))
    if row is None:
        raise DlfsError(f"{args.path}: no such file or directory in {args.dataset}")
    if args.long and index.transform:
        print(f"transform: {index.transform}; sizes are of the stored bytes")
    if not index.is_dir(row):
        print(_ls_line(index, row, index.path(row), args.long))
        return 0
    stack = [row]
    while stack:
        directory = stack.pop()
        children = index.children(directory)
        prefix = index.path(directory) + b"/" if args.recursive and directory else b""
        for child in children:
            print(_ls_line(index, child, prefix + index.name(child), args.long))
        if args.recursive:
            stack.extend(child for child in reversed(children) if index.is_dir(child))
    return 0


def _cmd_stats(args: argparse.Namespace) -> int:
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


def _listed(leftovers: list[str]) -> str:
    return f"{', '.join(leftovers)} (the next dlfs pack into it removes them)"


def _cmd_info(args: argparse.Namespace) -> int:
    from dlfs.core import format as fmt
    from dlfs.pack.destination import leftovers_at

    try:
        index = _load_index(args)
    except DatasetError as exc:  # no dataset, but perhaps what a killed pack left
        try:
            left = leftovers_at(args.dataset, _store_options(args), None).names()
        except DlfsError:
            left = []
        if left:
            raise DatasetError(f"{exc}; it holds what an interrupted pack left: {_listed(left)}") from None
        raise
    kinds = index.mode & fmt.TYPE_MASK
    files = kinds == stat.S_IFREG
    info = {
        "dataset": args.dataset,
        "dataset_id": index.dataset_id,
        "format_version": fmt.FORMAT_VERSION,
        "files": int(files.sum()),
        "directories": int((kinds == stat.S_IFDIR).sum()),
        "symlinks": int((kinds == stat.S_IFLNK).sum()),
        "bytes": int(index.size[files].sum()),
        "stored_bytes": int(sum(index.shard_sizes)),
        "shards": len(index.shard_names),
        "compressed_files": int(((index.flags & fmt.FLAG_LZ4) != 0).sum()),
        "dlfs_version": index.meta.get("dlfs_version"),
        "created": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(index.meta.get("created_ns", 0) / 1e9)),
        "transform": index.transform or "none",
        "build": index.meta.get("build", {}),
        "leftovers": leftovers_at(args.dataset, _store_options(args), index.dataset_id).names(),
    }
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    for key, value in info.items():
        if key == "build":
            value = " ".join(f"{k}={v}" for k, v in value.items())
        elif key == "leftovers":
            value = _listed(value) if value else "none"
        elif key in ("bytes", "stored_bytes"):
            value = f"{value} ({_human(value)})"
        print(f"{key + ':':<18}{value}")
    return 0


def _store_options(args: argparse.Namespace) -> StoreOptions:
    return StoreOptions(
        endpoint_url=args.endpoint_url,
        timeout=args.store_timeout,
        cache_dir=getattr(args, "cache_dir", None),
        cache_dir_size=getattr(args, "cache_dir_size", 0),
    )


def _store_flags(p: argparse.ArgumentParser, cache: bool = False) -> None:
    """Flags of the commands that take a dataset location, which may be ``s3://BUCKET/PREFIX``."""
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
        "--cache-dir",
        metavar="PATH",
        help="keep blocks of an s3:// dataset's shards in this local directory (e.g. on NVMe), so "
        "later epochs and remounts of the same dataset read them from there",
    )
    p.add_argument(
        "--cache-dir-size",
        type=parse_size,
        default=0,
        metavar="SIZE",
        help="bytes --cache-dir may hold; least recently used blocks go first (default: 80%% of "
        "the free space there)",
    )


def _cmd_bench(args: argparse.Namespace) -> int:
    from contextlib import ExitStack

    from dlfs import bench

    options = bench.Options(
        jobs=[job.strip() for job in args.job.split(",") if job.strip()],
        readers=args.readers,
        batch=args.batch,
        processes=args.workers == "process",
        cold=args.cold,
        repeat=args.repeat,
        seed=args.seed,
        epoch=args.epoch,
    )
    roots = [bench.Root.parse(text) for text in args.roots]
    built: dict[str, dict] = {}
    with ExitStack() as stack:
        if args.peers:
            from dlfs.bench.peers import peer_roots

            peers, built = stack.enter_context(peer_roots(Path(roots[0].path), Path(args.work), args.rebuild))
            roots.extend(peers)

        def progress(result: bench.Result) -> None:
            if not args.quiet and not args.json:
                rate = result.median["items_per_s"]
                print(f"{result.job} on {result.root}: {rate:,.0f} items/s", file=sys.stderr, flush=True)

        results = bench.run(roots, options, progress)
    if args.plot:
        bench.plot(results, args.plot)
    if args.json:
        report = {
            "options": vars(options) | {"jobs": list(options.jobs)},
            "peers": built,
            "results": [r.to_dict() for r in results],
        }
        print(json.dumps(report, indent=2))
        return 0
    cold = "cold (page cache dropped before each run)" if args.cold else "warm"
    print(f"{args.readers} {args.workers} reader(s), {cold}, median of {args.repeat}")
    print(bench.table(results))
    for name, facts in built.items():
        print(f"{name} image: {_human(facts['image_bytes'])}, built in {facts['build_seconds']:.1f} s")
    return 0


class _Version(argparse.Action):
    """``--version``: dlfs's, and the pyfuse3 and S3 client it would run with, since a stock pyfuse3
    or a missing s3 extra changes what it can do (the mount says the same in its log)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help=str(kwargs.get("help", "")))

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        from importlib import metadata

        lines = [f"dlfs {__version__}"]
        try:
            from dlfs.fuse.features import describe, installed_features

            features = describe(installed_features())
            lines.append(f"pyfuse3 {metadata.version('pyfuse3')}: {features[0]}")
            lines += [f"  {line}" for line in features[1:]]
        except ImportError as exc:
            lines.append(f"pyfuse3: not importable ({exc}); run make install")
        lines.append(_native_loops())
        try:
            lines.append(
                f"obstore {metadata.version('obstore')}, boto3 {metadata.version('boto3')}: s3:// datasets"
            )
        except metadata.PackageNotFoundError:
            lines.append("no s3 extra: s3:// datasets need pip install 'dlfs-data[s3]'")
        print("\n".join(lines))
        parser.exit()


def _native_loops() -> str:
    """``--version``'s line on the C loops, which pip or make builds beside the Python modules."""
    try:  # the FUSE side's modules need pyfuse3, whose absence the line before names
        from dlfs.fuse import dirents, server
        from dlfs.readahead import native
    except ImportError as exc:
        return f"C loops: not checked ({exc})"

    loops = {"read-ahead": native.LIBRARY, "listings": dirents.LIBRARY, "request server": server.LIBRARY}
    missing = [f"{name} ({path.name})" for name, path in loops.items() if not path.exists()]
    if missing:
        return f"C loops not built: {', '.join(missing)}; Python does their work, slower (pip builds them)"
    return f"C loops built: {', '.join(loops)}"


def build_parser() -> argparse.ArgumentParser:
    # -v/-q are taken before the command and after it: each subcommand has its own copy, with no
    # default, so that it sets them only when given there (its own actions: a parent's are shared).
    def global_flags(target: argparse.ArgumentParser, default: object) -> argparse.ArgumentParser:
        target.add_argument(
            "-v", "--verbose", action="store_true", default=default, help="log debug messages"
        )
        target.add_argument(
            "-q", "--quiet", action="store_true", default=default, help="no progress bars, warnings only"
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

    common = global_flags(argparse.ArgumentParser(add_help=False), argparse.SUPPRESS)
    parser = global_flags(argparse.ArgumentParser(prog="dlfs", description=DESCRIPTION), False)
    parser.add_argument("--version", action=_Version, help="the version, and what this dlfs runs with")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("pack", parents=[common], help="pack a directory tree into shards + index")
    p.add_argument("src", help="the directory tree to pack")
    p.add_argument("dst", help="the dataset directory to write (created if missing), or s3://BUCKET/PREFIX")
    p.add_argument(
        "--shard-size", type=parse_size, default="1G", help="target shard size, at most 4G (default 1G)"
    )
    p.add_argument("--jobs", "-j", type=int, help="parallel file readers (default 2 per CPU, at most 8)")
    p.add_argument(
        "--compress",
        choices=("none", "lz4"),
        default="none",
        help="lz4 per file, kept only where it saves space (default none)",
    )
    p.add_argument(
        "--transform",
        metavar="SPEC",
        help="store every file through a transform, in worker processes; it changes the data, so it "
        "is off by default. resize:SHORT[,quality=Q]: JPEGs whose short side exceeds SHORT px scaled "
        "down to it (aspect kept) and re-encoded at quality Q (default 90); other files stored as "
        "they are",
    )
    p.add_argument(
        "--order",
        choices=("source", "random"),
        default="source",
        help="file placement in shards: sorted tree order or seeded random (default source)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed for --order random (default 0)")
    p.add_argument("--force", action="store_true", help="replace a dataset already in DST")
    p.add_argument("--skip-errors", action="store_true", help="skip unreadable files with a warning")
    p.add_argument(
        "--no-sync",
        dest="sync",
        action="store_false",
        help="do not wait for the disk before publishing (like tar or cp): for scratch copies",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    _store_flags(p)
    p.set_defaults(func=_cmd_pack)

    p = sub.add_parser("mount", parents=[common], help="mount a dataset read-only")
    d, D = MOUNT_DEFAULTS, "(default %(default)s)"  # each flag's default is MountOptions' own
    p.add_argument("dataset", help="the dataset written by dlfs pack: a directory or s3://BUCKET/PREFIX")
    p.add_argument("mountpoint", help="an empty directory")
    p.add_argument(
        "--foreground", "-f", action="store_true", help="serve in this process (systemd, debugging)"
    )
    p.add_argument("--allow-other", action="store_true", help="let other users access the mount")
    p.add_argument(
        "--cache-size",
        type=parse_size,
        default=f"{d.cache_size >> 20}M",
        help=f"RAM for file payloads in the daemon; the read-ahead's budget and buffers add to it {D}",
    )
    p.add_argument(
        "--memory-limit",
        type=parse_size,
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
    p.add_argument("--debug", action="store_true", help="libfuse request tracing (foreground)")
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
        "--prefetch-budget",
        type=parse_size,
        default=f"{d.prefetch_budget >> 20}M",
        help=f"bytes read ahead of each reader; 0 turns read-ahead off {D}",
    )
    p.add_argument(
        "--prefetch-inflight",
        type=int,
        default=d.prefetch_inflight,
        help=f"storage batches the read-ahead keeps in flight {D}",
    )
    p.add_argument(
        "--prefetch-pause",
        type=float,
        default=d.prefetch_pause,
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
    _store_flags(p, cache=True)
    p.set_defaults(func=_cmd_mount)

    p = sub.add_parser("umount", parents=[common], help="unmount a dlfs mount")
    p.add_argument("mountpoint")
    p.add_argument("--lazy", "-z", action="store_true", help="detach now even if busy")
    p.set_defaults(func=_cmd_umount)

    p = sub.add_parser(
        "install-system",
        parents=[common],
        help="link dlfs and its mount helper (mount -t fuse.dlfs, fstab) into /usr/local/bin and /sbin "
        "and write its systemd unit dlfs@.service into /usr/local/lib/systemd/system (root)",
    )
    p.add_argument("--root", default="/", help="install under this directory instead of / (packaging)")
    p.add_argument(
        "--keep-links",
        action="store_true",
        help="leave links that point to another dlfs install which still exists (make install uses it)",
    )
    p.set_defaults(func=_cmd_install_system)

    p = sub.add_parser("verify", parents=[common], help="check every file of a dataset against its checksum")
    p.add_argument("dataset")
    p.add_argument("--jobs", "-j", type=int, default=4, help="parallel readers (default 4)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    _store_flags(p)
    p.set_defaults(func=_cmd_verify)

    p = sub.add_parser("ls", parents=[common], help="list a dataset's index without mounting")
    p.add_argument("dataset")
    p.add_argument("path", nargs="?", default="", help="a path inside the dataset (default: the root)")
    p.add_argument("-l", "--long", action="store_true", help="mode, links, owner, size, mtime")
    p.add_argument("-R", "--recursive", action="store_true", help="list subdirectories too, with full paths")
    _store_flags(p)
    p.set_defaults(func=_cmd_ls)

    p = sub.add_parser("stats", parents=[common], help="what a mount is doing: reads, caches, waits, latency")
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
    p.set_defaults(func=_cmd_stats)

    p = sub.add_parser(
        "info", parents=[common], help="what a dataset holds: files, bytes, shards, how it was packed"
    )
    p.add_argument("dataset")
    p.add_argument("--json", action="store_true", help="print it as JSON")
    _store_flags(p)
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser(
        "bench",
        parents=[common],
        help="fio-style jobs (scan, stat, reads) on dataset trees and mounts, side by side",
        description="Run the same jobs on every ROOT (a directory, a dlfs/squashfuse/ratarmount mount) "
        "and print one table. Jobs: scan (ImageFolder-style class scan), readdir, stat, seqread, "
        "randread, orderread (read every file whole in tree / seeded random / published dlfs order, "
        "unbuffered), shuffleload, orderload (seeded random / published order read the way "
        "torchvision's default loader does: buffered open(), which asks isatty() before Python 3.14).",
    )
    p.add_argument(
        "roots", nargs="+", metavar="ROOT", help="PATH or LABEL=PATH; with --peers the first is the source"
    )
    p.add_argument(
        "--job",
        default="scan,stat,seqread,randread",
        help="comma-separated jobs (default scan,stat,seqread,randread)",
    )
    p.add_argument("--readers", type=int, default=1, help="concurrent readers (default 1)")
    p.add_argument(
        "--batch",
        type=int,
        default=1,
        help="items a reader takes at a time, as a DataLoader worker takes a batch (default 1)",
    )
    p.add_argument(
        "--workers",
        choices=("process", "thread"),
        default="process",
        help="readers are processes, like DataLoader workers, or threads (default process)",
    )
    p.add_argument("--cold", action="store_true", help="drop the page cache before each run (root only)")
    p.add_argument(
        "--repeat", type=int, default=3, help="runs per job and root; the median is shown (default 3)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of randread's order (default 0)")
    p.add_argument(
        "--epoch",
        type=int,
        default=0,
        help="epoch whose published order orderread and orderload follow (default 0)",
    )
    p.add_argument(
        "--peers",
        action="store_true",
        help="also pack the first ROOT with dlfs, squashfs (squashfuse_ll) and tar (ratarmount), mount them "
        "and run the same jobs there",
    )
    p.add_argument(
        "--work", default="bench-peers", help="where --peers keeps its images (default ./bench-peers)"
    )
    p.add_argument("--rebuild", action="store_true", help="rebuild the --peers images even if up to date")
    p.add_argument("--plot", help="write bar charts of items/s and latency per root to this PNG")
    p.add_argument("--json", action="store_true", help="print every run as JSON")
    p.set_defaults(func=_cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    # File names are bytes; print the ones that are not valid UTF-8 back as the same bytes.
    sys.stdout.reconfigure(errors="surrogateescape")  # type: ignore[union-attr]
    if args.log_level:
        level = logging.getLevelNamesMapping()[args.log_level.upper()]
    else:
        level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
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


if __name__ == "__main__":
    sys.exit(main())
