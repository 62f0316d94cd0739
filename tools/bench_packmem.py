#!/usr/bin/env python3
"""pack's memory at ImageNet-1k and ImageNet-21k scale: peak RSS against the file count.

A tree of 14.2 M real files would need 14.2 M inodes and most of an hour to write here, so the
tree packed is a dlfs mount of the dataset ``bench_bigindex.py`` synthesises (ImageNet-like names
in class folders, 16 bytes a file): ``dlfs pack`` walks it, reads every file through FUSE and
writes a new dataset, as it would from a disk. For each shape and placement: pack's peak
RSS (``wait4``'s ``ru_maxrss``, see ``LAUNCHER``: the whole process, Python, its read pool's
buffers, the mapped column files' pages it holds), its wall time and files/s, and the index it
wrote.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_bigindex import SHAPES, ensure_dataset
from benchdoc import Json, print_document, table
from benchlib import DLFS, dlfs_mount

#: Runs the command in argv[2:] and writes its peak RSS (KiB) to the file argv[1]. The peak comes
#: from ``wait4`` in this small process: a child's ``ru_maxrss`` starts from the RSS of the process
#: that spawned it (exec keeps the old address space's high-water mark), and this benchmark's own
#: process holds hundreds of MB after synthesising a dataset.
LAUNCHER = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as out:
    out.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def pack_once(src: Path | str, dst: Path, *flags: str) -> dict[str, float]:
    """One ``dlfs pack --no-sync`` of ``src`` (a tree, or any source pack takes) into a fresh
    ``dst`` with ``flags``: its summary, peak RSS and wall time."""
    shutil.rmtree(dst, ignore_errors=True)
    peak = dst.with_name("peak-rss-kib")
    pack = [*DLFS, "pack", "--json", "--no-sync", *flags, str(src), str(dst)]
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", LAUNCHER, str(peak), *pack], stdout=subprocess.PIPE, check=False
    )
    took = time.perf_counter() - started
    if result.returncode:
        raise SystemExit(f"dlfs pack failed with exit code {result.returncode}")
    summary = json.loads(result.stdout)
    shutil.rmtree(dst, ignore_errors=True)
    return {
        "files": summary["files"],
        "bytes": summary["bytes"],
        "index_bytes": summary["index_bytes"],
        "pack_s": took,
        "files_per_s": summary["files"] / took,
        "peak_rss": int(peak.read_text()) * 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work", type=Path, default=Path("bench-data/bigindex"))
    parser.add_argument("--shape", nargs="+", choices=SHAPES, default=list(SHAPES))
    parser.add_argument("--placement", nargs="+", choices=("source", "random"), default=["source", "random"])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, dict[str, dict[str, float]]] = {}
    for shape in args.shape:
        results[shape] = {}
        with dlfs_mount(ensure_dataset(args.work, shape), args.work / "mnt"):
            for placement in args.placement:
                print(f"packing {shape} ({placement} placement) ...", file=sys.stderr, flush=True)
                results[shape][placement] = pack_once(
                    args.work / "mnt", args.work / "packed", "--placement", placement
                )
                print(
                    f"{shape} {placement}: {json.dumps(results[shape][placement])}",
                    file=sys.stderr,
                    flush=True,
                )
    if args.json:
        print_document(results)
        return
    for shape, placements in results.items():
        for placement, r in placements.items():
            print(
                f"{shape:>13} {placement:>6}: {r['files']:,} files, "
                f"peak RSS {r['peak_rss'] / 2**20:,.0f} MiB, {r['pack_s']:.0f} s "
                f"({r['files_per_s']:,.0f} files/s), index {r['index_bytes'] / 2**20:,.0f} MiB"
            )


TITLE = "pack's memory at 1.28 M and 14.2 M files"


def render(data: Json) -> list[str]:
    """This benchmark's section of docs/benchmarks.md, from its JSON results."""
    out = [
        "`dlfs pack --no-sync` of a dlfs mount of each `bench-bigindex` dataset (ImageNet-like names in "
        "class folders, 16 bytes a file; a tree of 14.2 M real files would need as many inodes), each "
        "file walked and read through FUSE: pack's peak RSS (`wait4`'s `ru_maxrss`), wall time and the "
        "index it wrote. The per-file columns live in files of a temporary folder beside the shards "
        "(design.md, *Pack's memory*).",
        "",
    ]
    mib = 1 << 20
    rows = [
        [
            shape,
            order,
            f"{r['files']:,}",
            f"{r['peak_rss'] / mib:,.0f}",
            f"{r['pack_s']:,.0f}",
            f"{r['files_per_s']:,.0f}",
            f"{r['index_bytes'] / mib:,.0f}",
        ]
        for shape, orders in data.items()
        for order, r in orders.items()
    ]
    header = ["shape", "placement", "files", "peak RSS MiB", "pack s", "files/s", "index MiB"]
    return [*out, *table(header, rows), ""]


if __name__ == "__main__":
    main()
