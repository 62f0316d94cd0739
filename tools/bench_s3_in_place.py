#!/usr/bin/env python3
"""WebDataset-style shards in S3 served in place (``dlfs pack --in-place s3://…/shards/``) against
the same files packed into S3 (``dlfs pack``), on a real S3 server behind bench-s3's shaped network
(``tools/netshape.py``; default 1 Gbit/s, 10 ms RTT; ``--no-shape``: SeaweedFS on loopback).

The files are bench-read's generated ImageNet-shaped tree, cut into --shards tars written by GNU
tar (``shard-NNNNNN.tar``, each a folder in the mount); the packed dataset is the same tree, so
both mounts list the same paths. Measured, medians of --repeat:

1. making the dataset: the in-place index (every tar read by large ranged GETs and checksummed)
   against ``dlfs pack`` of the files into S3 (every byte uploaded);
2. one epoch through a fresh mount, page cache dropped, with 8 DataLoader reader processes
   (``bench_loader.one_run``) in the published order (``orderload``) and with ``shuffle=True``
   (``shuffleload``), with the GETs each made.

Needs root (network namespace, dropping caches). --json prints one document.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_loader import one_run
from benchdoc import Json, number, print_document, ratio, table
from benchlib import DLFS, dlfs_mount, ensure_tree, median_of
from netshape import shaped_seaweed
from seaweed import SeaweedServer

from dlfs import bench

BUCKET = "bench"
TITLE = "WebDataset shards in S3, served in place"


@contextlib.contextmanager
def s3_server(root: Path, shape: bool, rate_mbit: float, rtt_ms: float) -> Iterator[Any]:
    """A SeaweedFS server behind the shaped link, or on loopback; the environment points at it."""
    with shaped_seaweed(root, rate_mbit, rtt_ms) if shape else SeaweedServer(root) as server:
        os.environ.update(server.env())
        server.client().create_bucket(Bucket=BUCKET)
        yield server


def shard_tree(src: Path, by_shard: Path, shards: int) -> list[Path]:
    """``src``'s files cut into ``shards`` folders in order (hard links), and a GNU tar of each:
    the tree both datasets serve, and the tars."""
    files = bench.Tree.walk(str(src)).files
    per = -(-len(files) // shards)
    tars = []
    shutil.rmtree(by_shard, ignore_errors=True)
    for shard in range(shards):
        folder = by_shard / "tree" / f"shard-{shard:06d}"
        for rel in files[shard * per : (shard + 1) * per]:
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            os.link(src / rel, folder / rel)
        tar = by_shard / f"shard-{shard:06d}.tar"
        subprocess.run(["tar", "--format=gnu", "-cf", tar, "-C", folder, "."], check=True)
        tars.append(tar)
    return tars


def upload(server: Any, tars: list[Path], prefix: str) -> None:
    client = server.client()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda tar: client.upload_file(str(tar), BUCKET, f"{prefix}/{tar.name}"), tars))


def gets(mnt: Path) -> int:
    return int(json.loads((mnt / ".dlfs" / "stats").read_bytes())["store"]["requests"])


def epoch(url: str, mnt: Path, log: Path, job: str, items: list[str], args: argparse.Namespace) -> Json:
    """One cold pass of ``job`` through a fresh mount of ``url``, and the GETs it made."""
    counted: list[int] = []

    @contextlib.contextmanager
    def mount() -> Iterator[None]:
        with dlfs_mount(url, mnt, "--log-file", str(log)):
            before = gets(mnt)
            yield
            counted.append(gets(mnt) - before)

    run = one_run(job, items, args.readers, args.batch, "cold", mount, mnt, mnt)[0]
    return run | {"gets": counted[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--shards", type=int, default=32)
    parser.add_argument("--work", type=Path, default=Path("bench-data/read"))
    parser.add_argument("--s3-work", type=Path, default=Path("bench-data/s3-in-place"))
    parser.add_argument("--rate-mbit", type=float, default=1000)
    parser.add_argument("--rtt-ms", type=float, default=10)
    parser.add_argument("--no-shape", action="store_true", help="SeaweedFS on loopback, no shaped link")
    parser.add_argument("--readers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--jobs", default="orderload,shuffleload")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    ensure_tree(args.work, args.files, args.classes, "jpeg")
    shutil.rmtree(args.s3_work, ignore_errors=True)
    args.s3_work.mkdir(parents=True)
    tars = shard_tree(args.work / "src", args.s3_work / "shards", args.shards)
    tree_root = args.s3_work / "shards" / "tree"
    tree = bench.Tree.walk(str(tree_root))
    mnt, log = args.s3_work / "mnt", args.s3_work / "mount.log"
    in_place, packed = f"s3://{BUCKET}/in-place", f"s3://{BUCKET}/packed"
    results: dict[str, Any] = {
        "files": len(tree.files),
        "shards": len(tars),
        "tar_bytes": sum(tar.stat().st_size for tar in tars),
        "cores": os.cpu_count(),
    }

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    with s3_server(args.s3_work / "weed", not args.no_shape, args.rate_mbit, args.rtt_ms) as server:
        upload(server, tars, "shards")
        commands = {
            "in place": [*DLFS, "-q", "pack", "--in-place", "--force", f"s3://{BUCKET}/shards/", in_place],
            "packed": [*DLFS, "-q", "pack", "--force", str(tree_root), packed],
        }
        results["making"] = {
            name: median_of(args.repeat, lambda c=command: subprocess.run(c, check=True, capture_output=True))
            for name, command in commands.items()
        }
        say("making: " + ", ".join(f"{k} {v['median']:.2f} s" for k, v in results["making"].items()))
        with dlfs_mount(in_place, mnt, "--log-file", str(log)):
            order = bench.published_order([bench.Root("dlfs", str(mnt))], epoch=0)
        results["epochs"] = {}
        for job in args.jobs.split(","):
            items = bench.job_items(job, tree, order, 0)
            row = {}
            for case, url in (("in place", in_place), ("packed", packed)):
                runs = [epoch(url, mnt, log, job, items, args) for _ in range(args.repeat)]
                row[case] = bench.median_runs(runs)
                say(f"{job} {case:9} {row[case]['items_per_s']:9,.0f} files/s, {row[case]['gets']:,.0f} GETs")
            results["epochs"][job] = row
    shutil.rmtree(args.s3_work, ignore_errors=True)
    options = vars(args) | {"work": str(args.work), "s3_work": str(args.s3_work)}
    if args.json:
        print_document({"options": options, "results": results})
    else:
        print("\n".join(render({"options": options, "results": results})))


def render(data: Json) -> list[str]:
    """The section of docs/benchmarks.md: making each dataset, and one epoch through each."""
    o, r = data["options"], data["results"]
    link = "loopback" if o["no_shape"] else f"{o['rate_mbit'] / 1000:g} Gbit/s, {o['rtt_ms']:g} ms RTT"
    place, pack = r["making"]["in place"]["median"], r["making"]["packed"]["median"]
    making = [
        ["`dlfs pack --in-place s3://…/shards/` (index only)", number(place, 2), ratio(place, pack)],
        ["`dlfs pack` of the same files into S3", number(pack, 2), ""],
    ]
    out = [
        f"{r['files']:,} files in {r['shards']} GNU tars ({r['tar_bytes'] / 2**30:.2f} GiB), {link}, "
        f"{r['cores']} cores; medians of {o['repeat']}.",
        "",
        *table(["making the dataset", "seconds", "in place / packed"], making),
        "",
    ]
    rows = []
    for job, by_case in r["epochs"].items():
        served, copied = by_case["in place"], by_case["packed"]
        rows.append(
            [
                f"`{job}`",
                number(served["items_per_s"]),
                number(copied["items_per_s"]),
                ratio(served["items_per_s"], copied["items_per_s"]),
                f"{served['gets']:,.0f} / {copied['gets']:,.0f}",
            ]
        )
    header = ["one cold epoch, 8 readers", "in place files/s", "packed files/s", "in place / packed", "GETs"]
    return out + table(header, rows) + [""]


if __name__ == "__main__":
    main()
