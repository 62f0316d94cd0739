#!/usr/bin/env python3
"""``dlfs pack --in-place --expand-tars`` of an ImageNet-shaped train tar (a tar of class tars of
JPEGs), and reads of the in-place mount against a packed mount of the same files.

Indexing, from a cold page cache each time: ``cat train.tar`` (the disk's bound), ``dlfs pack
--in-place --expand-tars`` and ratarmount ``--recursive`` indexing the same tar (``--no-mount``).
Then index bytes per file, and 8 DataLoader reader processes (``bench_loader.one_run``: a fresh
mount and ImageFolder's scan before each timed pass) with ``shuffle=True`` (``shuffleload``) and in
the published order (``orderload``), warm and cold, in place and packed, with the daemon's RSS
after the pass. Medians of --repeat runs; one JSON document with --json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_loader import one_run
from benchlib import DLFS, dlfs_mount, drop_caches, ensure_packed, median_of, rss_bytes
from make_imagenet_like import train_tar

from dlfs import bench
from dlfs.core import format as fmt

RATARMOUNT = Path(sys.executable).with_name("ratarmount")


@contextmanager
def mounted_noting_rss(dataset: Path, mnt: Path, log: Path, rss: list[int]) -> Iterator[None]:
    """A fresh mount (``dlfs_mount``); the daemon's RSS, as the pass ends, goes into ``rss``."""
    with dlfs_mount(dataset, mnt, "--log-file", str(log)) as (pid, _):
        yield
        rss.append(rss_bytes(pid))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--work", type=Path, default=Path("bench-data/in-place"))
    parser.add_argument("--readers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--jobs", default="shuffleload,orderload")
    parser.add_argument("--temperatures", default="warm,cold")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    work = args.work
    packed, in_place = work / "packed", work / "in-place"
    ensure_packed(work, args.files, args.classes, "jpeg", packed)
    train = work / "train.tar"
    if not train.exists():
        train_tar(work / "src", train)
    sqlite = work / "ratarmount.index.sqlite"
    commands = {
        "cat train.tar": ["sh", "-c", f"cat '{train}' > /dev/null"],
        "dlfs pack --in-place --expand-tars": [
            *DLFS, "-q", "pack", "--in-place", "--expand-tars", "--force", str(train), str(in_place)
        ],
        "ratarmount --recursive (index only)": [
            str(RATARMOUNT), "--recursive", "--no-mount", "--recreate-index", "--index-file", str(sqlite),
            str(train),
        ],
    }  # fmt: skip
    indexing = {}
    for name, command in commands.items():
        if not Path(command[0]).exists() and command[0] != "sh":
            continue
        indexing[name] = median_of(
            args.repeat, lambda c=command: subprocess.run(c, check=True, capture_output=True), drop_caches
        )
        print(f"{name:40} {indexing[name]['median']:7.2f} s", file=sys.stderr, flush=True)
    files = sum(1 for _ in (work / "src").rglob("*.JPEG"))
    sizes = {
        "dlfs in place": (in_place / fmt.INDEX_NAME).stat().st_size,
        "dlfs packed": (packed / fmt.INDEX_NAME).stat().st_size,
        "ratarmount": sqlite.stat().st_size if sqlite.exists() else None,
    }
    per_file = {name: None if size is None else size / files for name, size in sizes.items()}

    tree = bench.Tree.walk(str(work / "src"))
    mnt, log = work / "mnt", work / "mount.log"
    cases = {"in place": (in_place, train), "packed": (packed, packed)}
    reads: dict[str, dict[str, object]] = {}
    for job in args.jobs.split(","):
        for temperature in args.temperatures.split(","):
            for case, (dataset, storage) in cases.items():
                with dlfs_mount(dataset, mnt, "--log-file", str(log)):
                    order = bench.published_order([bench.Root("dlfs", str(mnt))], epoch=0)
                items = bench.job_items(job, tree, order, 0)
                rss: list[int] = []

                def mount(dataset: Path = dataset, rss: list[int] = rss) -> AbstractContextManager[None]:
                    return mounted_noting_rss(dataset, mnt, log, rss)

                runs = [
                    one_run(job, items, args.readers, args.batch, temperature, mount, storage, mnt)[0]
                    for _ in range(args.repeat)
                ]
                row = bench.median_runs(runs) | {"daemon_rss_bytes": max(rss)}
                reads.setdefault(f"{job} {temperature}", {})[case] = row
                print(f"{job} {temperature:5} {case:9} {row['items_per_s']:9,.0f} files/s", file=sys.stderr)
    result = {
        "options": vars(args) | {"work": str(work)},
        "files": files,
        "tar_bytes": train.stat().st_size,
        "indexing_seconds": indexing,
        "index_bytes_per_file": per_file,
        "reads": reads,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    cat = indexing["cat train.tar"]["median"]
    for name, spread in indexing.items():
        print(f"{name:40} {spread['median']:7.2f} s  {spread['median'] / cat:5.2f}x cat")
    for name, value in per_file.items():
        print(f"index bytes per file, {name:14} {value:8.1f}" if value else f"{name}: -")
    for key, by_case in reads.items():
        ratio = by_case["in place"]["items_per_s"] / by_case["packed"]["items_per_s"]  # type: ignore[index]
        shown = "  ".join(f"{case}: {row['items_per_s']:,.0f} files/s" for case, row in by_case.items())  # type: ignore[index]
        print(f"{key:18} {shown}  in place / packed {ratio:.2f}")


if __name__ == "__main__":
    main()
