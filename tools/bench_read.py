#!/usr/bin/env python3
"""Read every file in the published order: native vs dlfs with and without read-ahead, warm and cold.

Readers are processes (like DataLoader workers): with N readers, reader i takes files i, i+N, ...
of the sequence, so together they advance through it the way a DataLoader does. Each file is read
whole with ``open(path, 'rb').read()`` — exactly what torchvision's default loader does. Reports
files/s, MB/s and per-file latency p50/p99 (medians over --repeat runs), as a table and JSON.

Cases: native tree, dlfs with read-ahead, dlfs without; each warm and cold. "Cold" drops the page
cache first. "Warm" means the storage is in the page cache: the native files after an untimed pass,
the shard files after reading them; every dlfs run mounts afresh, so the mount's own pages and the
daemon's cache start empty and what is measured is the path from warm storage to the reader.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import DLFS, can_drop_caches, dlfs_mount, drop_caches, ensure_tree, imagefolder_scan

from dlfs.control import parse_order


def _reader(paths: list[str], buffering: int, start: float, out: mp.Queue) -> None:
    latencies = []
    total = 0
    while time.time() < start:
        time.sleep(0.001)
    for path in paths:
        began = time.perf_counter()
        with open(path, "rb", buffering=buffering) as f:
            total += len(f.read())
        latencies.append(time.perf_counter() - began)
    out.put((latencies, total, time.time()))


def read_all(paths: list[str], readers: int, buffering: int = -1) -> dict[str, float]:
    """Files/s, MB/s and latency percentiles for ``readers`` processes sharing ``paths``."""
    queue: mp.Queue = mp.Queue()
    start = time.time() + 0.3
    procs = [
        mp.Process(target=_reader, args=(paths[k::readers], buffering, start, queue)) for k in range(readers)
    ]
    for proc in procs:
        proc.start()
    results = [queue.get() for _ in procs]
    for proc in procs:
        proc.join()
    seconds = max(end for _, _, end in results) - start
    latencies = sorted(lat for lats, _, _ in results for lat in lats)
    total = sum(size for _, size, _ in results)

    def pct(q: float) -> float:
        return latencies[min(int(q * len(latencies)), len(latencies) - 1)] * 1e6

    return {
        "files_per_s": len(paths) / seconds,
        "mb_per_s": total / seconds / 1e6,
        "p50_us": pct(0.50),
        "p99_us": pct(0.99),
        "seconds": seconds,
    }


def median_runs(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def order_paths(mnt: Path) -> list[str]:
    """Epoch 0's published paths, relative to the mount root."""
    return parse_order((mnt / ".dlfs" / "order" / "epoch-0").read_bytes())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--work", type=Path, default=Path("bench-data/read"))
    parser.add_argument("--readers", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    src, dst, mnt = args.work / "src", args.work / "dataset", args.work / "mnt"
    if ensure_tree(args.work, args.files, args.classes, "jpeg") or not (dst / "index.dlfs").exists():
        subprocess.run([*DLFS, "-q", "pack", str(src), str(dst), "--force"], check=True, capture_output=True)
    temperatures = ["warm", *(["cold"] if can_drop_caches() else [])]
    with dlfs_mount(dst, mnt, "--log-file", str(args.work / "mount.log")):
        published = order_paths(mnt)
    native_paths = [str(src / path) for path in published]
    shards = [str(p) for p in dst.iterdir()]
    # (mount flags or None for the native tree, open() buffering: -1 is Python's default, which
    # costs an isatty() ioctl round trip per file on FUSE; 0 skips it, as dlfs.torch.pil_loader does)
    cases = {
        "native": (None, -1),
        "native, unbuffered": (None, 0),
        "dlfs read-ahead": ([], -1),
        "dlfs read-ahead, unbuffered": ([], 0),
        "dlfs no read-ahead": (["--prefetch-budget", "0"], -1),
    }
    results: dict[str, dict[str, dict[str, float]]] = {}
    for case, (flags, buffering) in cases.items():
        for temperature in temperatures:
            for readers in args.readers:
                runs = []
                for _ in range(args.repeat):
                    if temperature == "cold":
                        drop_caches()
                    if flags is None:
                        if temperature == "warm":
                            read_all(native_paths, readers)
                        runs.append(read_all(native_paths, readers, buffering))
                        continue
                    if temperature == "warm":
                        read_all(shards, 2)  # storage warm; the fresh mount's own pages start empty
                    with dlfs_mount(dst, mnt, "--log-file", str(args.work / "mount.log"), *flags):
                        imagefolder_scan(str(mnt))  # what a training job does first (untimed)
                        order_paths(mnt)  # resolving the order arms the read-ahead, as the sampler does
                        runs.append(read_all([str(mnt / path) for path in published], readers, buffering))
                row = median_runs(runs)
                results.setdefault(f"{case} {temperature}", {})[str(readers)] = row
                print(
                    f"{case:20} {temperature:5} {readers} readers: {row['files_per_s']:9,.0f} files/s",
                    file=sys.stderr,
                    flush=True,
                )
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"\n{args.files:,} files, read whole in the published order, median of {args.repeat}")
    print(f"{'case':36}{'readers':>8}{'files/s':>10}{'MB/s':>9}{'p50 us':>9}{'p99 us':>9}")
    for case, by_readers in results.items():
        for readers, row in by_readers.items():
            print(
                f"{case:28}{readers:>8}{row['files_per_s']:10,.0f}{row['mb_per_s']:9,.0f}"
                f"{row['p50_us']:9,.0f}{row['p99_us']:9,.0f}"
            )


if __name__ == "__main__":
    main()
