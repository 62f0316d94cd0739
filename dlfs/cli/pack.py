"""``dlfs pack SRC DST``: a directory tree or an archive into shards and an index (``dlfs.pack``)."""

from __future__ import annotations

import argparse
import json

from dlfs.cli.common import (
    SIZES,
    Subparsers,
    add_command,
    hidden_alias,
    human,
    parse_size,
    store_flags,
    store_options,
)
from dlfs.core.choices import PLACEMENT_ALIASES, PLACEMENTS


def add_parser(sub: Subparsers) -> None:
    p = add_command(
        sub, "pack", run, help="pack a directory tree or an archive into shards + index", epilog=SIZES
    )
    p.add_argument(
        "src",
        help="what to pack: a directory tree; or an archive, read in one pass and never extracted: a tar "
        "(plain, gz, zst, xz or bz2, told by its first bytes), a zip, or - for a tar on standard input; "
        "or s3://BUCKET/PREFIX/, one object per file (keys' / make the folders)",
    )
    p.add_argument("dst", help="the dataset directory to write (created if missing), or s3://BUCKET/PREFIX")
    p.add_argument(
        "--shard-size",
        type=parse_size,
        default="1G",
        metavar="SIZE",
        help="target shard size, at most 4G (default 1G)",
    )
    p.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="files read at once (default 2 per CPU, at most 8; from an s3:// source, GETs in flight, "
        "default 64); with --transform, the worker processes that read and transform them: one per "
        "CPU, at most N",
    )
    hidden_alias(p, "--readers", "-j", dest="threads", type=int)
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
        "--placement",
        type=lambda value: PLACEMENT_ALIASES.get(value, value),
        choices=PLACEMENTS,
        default="tree",
        help="where file bytes go in the shards: in sorted tree order, or in a seeded random order "
        "so that a mount's --order block mixes folders (default tree)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of --placement random (default 0)")
    p.add_argument("--force", action="store_true", help="replace a dataset already in DST")
    p.add_argument("--skip-errors", action="store_true", help="skip unreadable files with a warning")
    p.add_argument(
        "--no-sync",
        dest="sync",
        action="store_false",
        help="do not wait for the disk before publishing (like tar or cp): for scratch copies",
    )
    p.add_argument(
        "--expand-tars",
        action="store_true",
        help="an archive's members named NAME.tar, at any depth, become folders NAME of their members "
        "(ImageNet's train tar of class tars packs into class folders)",
    )
    p.add_argument(
        "--in-place",
        action="store_true",
        help="write only an index: the mount serves every member from SRC itself, an uncompressed tar or a "
        "folder of .tar files (each a folder named after it), local or in S3 (s3://BUCKET/KEY.tar, "
        "s3://BUCKET/PREFIX/), which must then stay where and as it is",
    )
    p.add_argument(
        "--map",
        metavar="FILE",
        help="move members to where training code expects them: a CSV (or TSV) of 'source path,tree "
        "path' lines, e.g. a flat validation tar into class folders; members it does not name stay",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    store_flags(p)


def run(args: argparse.Namespace) -> int:
    from dlfs.core.store import is_s3
    from dlfs.pack import DEFAULT_THREADS, PackOptions, objects, pack
    from dlfs.pack.path_map import PathMap
    from dlfs.pack.transform import parse as parse_transform

    options = PackOptions(
        shard_size=args.shard_size,
        threads=args.threads or (objects.DEFAULT_THREADS if is_s3(args.src) else DEFAULT_THREADS),
        compress=args.compress == "lz4",
        placement=args.placement,
        seed=args.seed,
        force=args.force,
        skip_errors=args.skip_errors,
        progress=not args.quiet and not args.json,
        sync=args.sync,
        store=store_options(args),
        transform=parse_transform(args.transform) if args.transform else None,
        expand_tars=args.expand_tars,
        in_place=args.in_place,
        path_map=PathMap(args.map) if args.map else None,
    )
    summary = pack(args.src, args.dst, options)
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2))
        return 0
    seconds = max(summary.seconds, 1e-9)
    where = (
        f"in place in {summary.archives} tar(s), with an index of {human(summary.index_bytes)}"
        if summary.archives
        else f"into {summary.shards} shard(s) of {human(options.shard_size)}, "
        f"{human(summary.stored_bytes)} in all, and an index of {human(summary.index_bytes)}"
    )
    print(
        f"{'indexed' if summary.archives else 'packed'} {summary.files} files, {summary.directories} "
        f"directories, {summary.symlinks} symlinks ({human(summary.bytes)}) {where}, "
        f"in {summary.seconds:.2f} s ({summary.files / seconds:,.0f} files/s, "
        f"{summary.bytes / seconds / 1e6:,.1f} MB/s)"
    )
    if summary.compressed_files:
        print(f"lz4 kept for {summary.compressed_files} files")
    if summary.transform:
        kept = ", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in summary.kept_files.items())
        print(
            f"transform {summary.transform} ({summary.codec}): {summary.transformed_files} files changed, "
            f"{human(summary.source_bytes)} of source files stored in {human(summary.bytes)}"
            + (f", stored unchanged: {kept}" if kept else "")
        )
    if summary.duplicates:
        print(
            f"{summary.duplicates} archive members replaced by a later one at the same path (as tar x does)"
        )
    if options.path_map is not None:
        print(
            f"--map moved {summary.mapped} files and links, left {summary.unmapped} where they were"
            + (f"; {summary.map_unused} of its entries named no member" if summary.map_unused else "")
        )
    if summary.skipped_special or summary.skipped_errors:
        print(
            f"skipped {summary.skipped_special} special files and {summary.skipped_errors} unreadable entries"
        )
    return 0
