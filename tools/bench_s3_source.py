#!/usr/bin/env python3
"""``dlfs pack s3://BUCKET/PREFIX/ DST``: a prefix of one object per file packed, against the GETs
alone.

The objects (``--objects`` of them, ImageNet-like names in class folders, sizes drawn around
``--size`` bytes) are uploaded to a real S3 server (SeaweedFS) behind bench-s3's network shape
(``tools/netshape.py``: default 1 Gbit/s, 10 ms RTT; ``--loopback`` for the server on loopback,
unshaped). Then, alternating, medians of ``--repeat``:

- the baseline: every object fetched whole by a pool of threads (``s3_baselines.get_objects``), for
  each of ``--threads``; the best of them is what a hand-written downloader would get;
- ``dlfs pack`` of the prefix into a local folder (``--no-sync``), for each of ``--pack-threads`` (GETs in
  flight), with its peak RSS (``bench_packmem.pack_once``).

Needs root for the shaped network. ``--json`` prints one document.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_packmem import pack_once
from benchdoc import DASH, TIMES, Json, print_document, table
from netshape import shaped_seaweed
from s3_baselines import Result, get_objects, s3_store, upload_objects
from seaweed import SeaweedServer

BUCKET = "bench"
PREFIX = "objects/train"
TITLE = "dlfs pack from an S3 prefix of objects"


@contextmanager
def s3_server(root: Path, loopback: bool, rate_mbit: float, rtt_ms: float) -> Iterator[Any]:
    """A SeaweedFS server on loopback, or behind the shaped network; ``env()`` and ``client()``."""
    if loopback:
        with SeaweedServer(root) as server:
            yield server
    else:
        with shaped_seaweed(root, rate_mbit, rtt_ms) as shaped:
            yield shaped


def make_tree(root: Path, objects: int, size: int, seed: int = 0) -> int:
    """``objects`` files of random bytes under ``root``, 100 to a class folder, sizes uniform in
    [size/2, 3size/2]; their total bytes."""
    rng = random.Random(seed)
    total = 0
    for i in range(objects):
        path = root / f"n{i // 100:08d}" / f"n{i // 100:08d}_{i}.JPEG"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = rng.randbytes(rng.randint(size // 2, size * 3 // 2))
        path.write_bytes(data)
        total += len(data)
    return total


def median_result(runs: list[Result]) -> Json:
    """The run of median time, with every run's seconds."""
    middle = sorted(runs, key=lambda r: r.seconds)[len(runs) // 2]
    return middle.__dict__ | {"runs_s": [round(r.seconds, 3) for r in runs]}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--objects", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=110_000, help="mean object size in bytes")
    parser.add_argument("--work", type=Path, default=Path("bench-data/s3-source"))
    parser.add_argument("--rate-mbit", type=float, default=1000)
    parser.add_argument("--rtt-ms", type=float, default=10)
    parser.add_argument("--loopback", action="store_true", help="the server on loopback, no shaped network")
    parser.add_argument(
        "--threads", type=int, nargs="+", default=[16, 64, 256], help="GET pools of the baseline"
    )
    parser.add_argument(
        "--pack-threads", type=int, nargs="+", default=[16, 64, 256], help="dlfs pack --threads"
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    shutil.rmtree(args.work, ignore_errors=True)
    src = args.work / "src"
    total = make_tree(src, args.objects, args.size)
    keys = sorted(path.relative_to(src).as_posix() for path in src.rglob("*.JPEG"))
    results: Json = {
        "objects": len(keys),
        "bytes": total,
        "network": "loopback" if args.loopback else {"rate_mbit": args.rate_mbit, "rtt_ms": args.rtt_ms},
        "repeat": args.repeat,
    }
    gets: dict[int, list[Result]] = {t: [] for t in args.threads}
    packs: dict[int, list[dict[str, float]]] = {r: [] for r in args.pack_threads}
    with s3_server(args.work / "weed", args.loopback, args.rate_mbit, args.rtt_ms) as s3:
        os.environ.update(s3.env())
        s3.client().create_bucket(Bucket=BUCKET)
        store = s3_store(s3.env(), BUCKET, PREFIX)
        upload_objects(store, src, max(args.threads))
        shutil.rmtree(src)
        url = f"s3://{BUCKET}/{PREFIX}/"
        for run in range(args.repeat):
            for threads in args.threads:
                gets[threads].append(get_objects(store, keys, threads))
                say(f"run {run}: GETs, {threads} threads: {gets[threads][-1].objects_per_s:,.0f} objects/s")
            for readers in args.pack_threads:
                done = pack_once(url, args.work / "packed", "--threads", str(readers))
                assert (done["files"], done["bytes"]) == (len(keys), total), done
                packs[readers].append(done)
                say(f"run {run}: dlfs pack --threads {readers}: {done['files_per_s']:,.0f} objects/s")
    shutil.rmtree(args.work, ignore_errors=True)
    results["get_objects"] = {str(t): median_result(runs) for t, runs in gets.items()}
    results["dlfs_pack"] = {}
    for readers, runs in packs.items():
        seconds = statistics.median(run["pack_s"] for run in runs)
        result = Result.of(len(keys), total, seconds)
        results["dlfs_pack"][str(readers)] = result.__dict__ | {
            "runs_s": [round(run["pack_s"], 3) for run in runs],
            "peak_rss": max(run["peak_rss"] for run in runs),
        }
    best_get = max(results["get_objects"].values(), key=lambda r: r["objects_per_s"])
    best_pack = max(results["dlfs_pack"].values(), key=lambda r: r["objects_per_s"])
    results["pack_vs_best_get"] = best_pack["objects_per_s"] / best_get["objects_per_s"]
    if args.json:
        print_document(results)
        return
    print("\n".join(render(results)))


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def render(data: Json) -> list[str]:
    """This benchmark's section of docs/benchmarks.md, from its JSON results."""
    network = data["network"]
    shape = (
        "SeaweedFS on loopback"
        if network == "loopback"
        else f"SeaweedFS behind {network['rate_mbit']:,.0f} Mbit/s and {network['rtt_ms']:g} ms RTT"
    )
    out = [
        f"{data['objects']:,} objects ({data['bytes'] / 1e6:,.0f} MB) below one prefix, {shape}, medians "
        f"of {data['repeat']}: every object fetched whole by a pool of threads (the baseline), against "
        "`dlfs pack s3://…/ DST` into a local folder (`--no-sync`), which also writes the shards and "
        "the index; its peak RSS is `wait4`'s.",
        "",
    ]
    rows = [
        [f"GETs, {threads} threads", f"{r['objects_per_s']:,.0f}", f"{r['mb_per_s']:,.1f}", DASH]
        for threads, r in data["get_objects"].items()
    ]
    rows += [
        [
            f"`dlfs pack --threads {readers}`",
            f"{r['objects_per_s']:,.0f}",
            f"{r['mb_per_s']:,.1f}",
            f"{r['peak_rss'] / 2**20:,.0f}",
        ]
        for readers, r in data["dlfs_pack"].items()
    ]
    out += table(["", "objects/s", "MB/s", "peak RSS MiB"], rows)
    return [*out, "", f"Best pack against the best GET pool: {data['pack_vs_best_get']:.2f}{TIMES}.", ""]


if __name__ == "__main__":
    main()
