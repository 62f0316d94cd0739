"""``dlfs info DATASET``: what a dataset holds and how it was packed, from its index alone."""

from __future__ import annotations

import argparse
import json
import time

from dlfs.cli.common import Subparsers, add_command, human, load_index, store_flags


def add_parser(sub: Subparsers) -> None:
    p = add_command(sub, "info", run, help="what a dataset holds: files, bytes, shards, how it was packed")
    p.add_argument("dataset")
    p.add_argument("--json", action="store_true", help="print it as JSON")
    store_flags(p)


def run(args: argparse.Namespace) -> int:
    from dlfs.core import format as fmt

    index = load_index(args)
    created = time.localtime(index.meta.get("created_ns", 0) / 1e9)
    info = {
        "dataset": args.dataset,
        "dataset_id": index.dataset_id,
        "format_version": fmt.FORMAT_VERSION,
        **index.summary(),
        "dlfs_version": index.meta.get("dlfs_version"),
        "created": time.strftime("%Y-%m-%d %H:%M:%S", created),
        "transform": index.transform or "none",
        "build": index.meta.get("build", {}),
    }
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    for key, value in info.items():
        if key == "build":
            value = " ".join(f"{k}={v}" for k, v in value.items())
        elif key in ("bytes", "stored_bytes"):
            value = f"{value} ({human(value)})"
        print(f"{key + ':':<18}{value}")
    return 0
