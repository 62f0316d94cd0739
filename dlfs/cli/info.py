"""``dlfs info DATASET``: what a dataset holds and how it was packed, from its index alone."""

from __future__ import annotations

import argparse
import json
import time

from dlfs.cli.common import Subparsers, add_command, human, load_index, store_flags, store_options


def add_parser(sub: Subparsers) -> None:
    p = add_command(sub, "info", run, help="what a dataset holds: files, bytes, shards, how it was packed")
    p.add_argument("dataset")
    p.add_argument("--json", action="store_true", help="print it as JSON")
    store_flags(p)


def _listed(leftovers: list[str]) -> str:
    return f"{', '.join(leftovers)} (the next dlfs pack into it removes them)"


def run(args: argparse.Namespace) -> int:
    from dlfs.core import archive_meta
    from dlfs.core import format as fmt
    from dlfs.core.errors import DatasetError, DlfsError
    from dlfs.pack.destination import leftovers_at

    try:
        index = load_index(args)
    except DatasetError as exc:  # no dataset, but perhaps what a killed pack left
        try:
            left = leftovers_at(args.dataset, store_options(args), None).names()
        except DlfsError:
            left = []
        if left:
            raise DatasetError(f"{exc}; it holds what an interrupted pack left: {_listed(left)}") from None
        raise
    created = time.localtime(index.meta.get("created_ns", 0) / 1e9)
    info = {
        "dataset": args.dataset,
        "dataset_id": index.dataset_id,
        "format_version": fmt.FORMAT_VERSION,
        **index.summary(),
        "dlfs_version": index.meta.get("dlfs_version"),
        "created": time.strftime("%Y-%m-%d %H:%M:%S", created),
        "transform": index.transform or "none",
        "archives": [archive_meta.archive_location(archive) for archive in index.archives],
        "build": index.meta.get("build", {}),
        "leftovers": leftovers_at(args.dataset, store_options(args), index.dataset_id).names(),
    }
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    for key, value in info.items():
        if key == "build":
            value = " ".join(f"{k}={v}" for k, v in value.items())
        elif key == "archives":
            value = index.in_place or "none (packed into shards)"
        elif key == "leftovers":
            value = _listed(value) if value else "none"
        elif key in ("bytes", "stored_bytes"):
            value = f"{value} ({human(value)})"
        print(f"{key + ':':<18}{value}")
    return 0
