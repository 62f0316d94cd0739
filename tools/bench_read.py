#!/usr/bin/env python3
"""Read every file in the published order: native vs dlfs with and without read-ahead, warm and cold.

The reading is ``dlfs bench``'s ``orderread`` job (processes, like DataLoader workers; every file
read whole and unbuffered, as ``dlfs.torch.pil_loader`` does). Reports files/s, MB/s, per-file
latency p50/p99, the CPU a file cost the readers and the daemon, and the disk's busy share (medians
over --repeat runs), as a table and JSON. What this adds to ``dlfs bench``: a fresh mount for every
run, so no run profits from pages an earlier one left in the mount, and a cold start the way a
training job has one: caches dropped, mount, ImageFolder's scan, then the epoch (``dlfs bench
--cold`` drops the caches after the scan, so the kernel forgets the inodes too).

Cases: native tree, dlfs with read-ahead, dlfs without; each warm and cold. "Cold" drops the page
cache first. "Warm" means the storage is in the page cache: the native files after an untimed pass,
the shard files after reading them; every dlfs run mounts afresh, so the mount's own pages and the
daemon's cache start empty and what is measured is the path from warm storage to the reader.
One more case is what every epoch after the first meets when the dataset fits in RAM: on one mount,
epoch 0 read untimed leaves every file in the mount's page cache, and epoch 1 (another order) is
timed.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchdoc import DASH, Json, number, print_document, ratio, table
from benchlib import dlfs_mount, ensure_packed, warm_storage

from dlfs import bench


def read_all(root: str, paths: list[str], readers: int, cold: bool, epoch: int = 0) -> dict[str, float]:
    """One pass of ``orderread`` over ``paths`` (relative to ``root``, epoch ``epoch``'s published
    order) with ``readers`` processes."""
    options = bench.Options(readers=readers, cold=cold, epoch=epoch)
    return bench.run_once(bench.Root("", root), "orderread", paths, options)


def cpu_per_file(row: dict[str, float], files: int) -> float:
    """Reader and daemon CPU per file, in microseconds: what a case costs, not only how fast it ran
    on the day. Where the run keeps every core busy (warm storage), files/s is the cores over this,
    so two cases' figures give their speed ratio on any machine as busy, whatever its speed."""
    return (row["reader_cpu_s"] + row.get("daemon_cpu_s", 0.0)) * 1e6 / files


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
    ensure_packed(args.work, args.files, args.classes, "jpeg", dst)
    temperatures = ["warm", "cold"] if os.access(bench.DROP_CACHES, os.W_OK) else ["warm"]
    with dlfs_mount(dst, mnt, "--log-file", str(args.work / "mount.log")):
        published = bench.published_order([bench.Root("dlfs", str(mnt))], epoch=0)

    def dlfs_run(flags: list[str], readers: int, cold: bool, epochs: int) -> dict[str, float]:
        """A fresh mount, ImageFolder's scan, then the epochs in turn; the last one is timed."""
        if cold:
            bench.drop_caches()  # before mounting: the scan below is part of a cold start
        else:
            warm_storage(dst)  # storage warm; the fresh mount's own pages start empty
        with dlfs_mount(dst, mnt, "--log-file", str(args.work / "mount.log"), *flags):
            bench.imagefolder_scan(str(mnt))  # what a training job does first (untimed)
            for epoch in range(epochs):
                order = bench.published_order([bench.Root("dlfs", str(mnt))], epoch)
                result = read_all(str(mnt), order, readers, cold=False, epoch=epoch)
            return result

    cases: dict[str, tuple[list[str] | None, int]] = {  # mount flags (None: the native tree), epochs
        "native": (None, 1),
        "dlfs read-ahead": ([], 1),
        # --readdirplus always: the scan itself builds the inodes the default builds after it.
        "dlfs read-ahead, always": (["--readdirplus", "always"], 1),
        "dlfs no read-ahead": (["--readahead-budget", "0"], 1),
        # Epoch 1 of one mount, after epoch 0 put the dataset in the mount's page cache (it fits in RAM).
        "dlfs read-ahead 2nd epoch": ([], 2),
    }
    results: dict[str, dict[str, dict[str, float]]] = {}
    for case, (flags, epochs) in cases.items():
        for temperature in temperatures if epochs == 1 else ["warm"]:
            cold = temperature == "cold"
            for readers in args.readers:
                runs = []
                for _ in range(args.repeat):
                    if flags is None:
                        if not cold:
                            read_all(str(src), published, readers, cold)
                        runs.append(read_all(str(src), published, readers, cold))
                    else:
                        runs.append(dlfs_run(flags, readers, cold, epochs))
                row = bench.median_runs(runs)
                results.setdefault(f"{case} {temperature}", {})[str(readers)] = row
                print(
                    f"{case:26} {temperature:5} {readers} readers: {row['items_per_s']:9,.0f} files/s,"
                    f" {cpu_per_file(row, args.files):5.0f} us CPU per file",
                    file=sys.stderr,
                    flush=True,
                )
    if args.json:
        print_document(results)
        return
    print(f"\n{args.files:,} files, read whole in the published order, median of {args.repeat}")
    print(f"{'case':36}{'readers':>8}{'files/s':>10}{'MB/s':>9}", end="")
    print(f"{'p50 us':>9}{'p99 us':>9}{'CPU us':>8}{'disk %':>7}")
    for case, by_readers in results.items():
        for readers, row in by_readers.items():
            print(
                f"{case:36}{readers:>8}{row['items_per_s']:10,.0f}{row['mb_per_s']:9,.0f}"
                f"{row['p50_us']:9,.0f}{row['p99_us']:9,.0f}{cpu_per_file(row, args.files):8.0f}"
                f"{100 * row.get('disk_busy', 0):7.0f}"
            )


TITLE = "Reading in the published order"


READ_CASES = [
    ("native warm", "native warm"),
    ("native cold", "native cold"),
    ("dlfs read-ahead warm", "dlfs read-ahead warm"),
    ("dlfs read-ahead cold", "dlfs read-ahead cold"),
    ("dlfs read-ahead, always warm", "dlfs `--readdirplus always` warm"),
    ("dlfs read-ahead, always cold", "dlfs `--readdirplus always` cold"),
    ("dlfs no read-ahead warm", "dlfs no read-ahead warm"),
    ("dlfs no read-ahead cold", "dlfs no read-ahead cold"),
    ("dlfs read-ahead 2nd epoch warm", "dlfs read-ahead, 2nd epoch of one mount"),
]


def _cpu_us(row: Json) -> float:
    files = row["items_per_s"] * row["seconds"]
    return (row["reader_cpu_s"] + row.get("daemon_cpu_s", 0.0)) / files * 1e6 if files else 0.0


def render(data: Json) -> list[str]:
    """This benchmark's section of docs/benchmarks.md, from its JSON results."""
    readers = sorted({int(k) for case in data.values() for k in case}, key=int)
    out = [
        "20,000 JPEGs (2.2 GB, ImageNet's size distribution) read whole in epoch 0's published order by "
        "1 and 8 processes; a fresh mount for every run, medians of 3. Each cell: files/s, then the CPU "
        "one file cost the readers and the daemon together, in µs; then p99 latency in µs. *Warm*: the "
        "shards (or the native files) read just before, the mount's own cache empty. *Cold*: page cache "
        "dropped, mount, ImageFolder scan, then the epoch. The last row is a second epoch on one mount, "
        "what every later epoch meets when the dataset fits in RAM.",
        "",
    ]
    rows = []
    for key, label in READ_CASES:
        if key not in data:
            continue
        cells = []
        for n in readers:
            row = data[key].get(str(n))
            cells.append(
                f"{number(row['items_per_s'])} ({_cpu_us(row):.0f} µs), p99 {number(row['p99_us'])}"
                if row
                else DASH
            )
        rows.append([label, *cells])
    out += table(["case", *[f"{n} reader{'s' if n > 1 else ''}" for n in readers]], rows)

    def fps(key: str, n: int) -> float:
        return data.get(key, {}).get(str(n), {}).get("items_per_s", 0.0)

    ratios = []
    for n in readers:
        ratios.append(
            f"{n} reader{'s' if n > 1 else ''}: read-ahead / native warm "
            f"**{ratio(fps('dlfs read-ahead warm', n), fps('native warm', n))}**, cold "
            f"**{ratio(fps('dlfs read-ahead cold', n), fps('native cold', n))}**; read-ahead / none warm "
            f"{ratio(fps('dlfs read-ahead warm', n), fps('dlfs no read-ahead warm', n))}, cold "
            f"{ratio(fps('dlfs read-ahead cold', n), fps('dlfs no read-ahead cold', n))}; 2nd epoch / "
            f"native warm {ratio(fps('dlfs read-ahead 2nd epoch warm', n), fps('native warm', n))}"
        )
    disk = data.get("dlfs read-ahead cold", {}).get(str(readers[-1]), {})
    native_disk = data.get("native cold", {}).get(str(readers[-1]), {})
    out += ["", "Ratios of files/s: " + "; ".join(ratios) + "."]
    if disk and native_disk:
        out.append(
            f"Cold, {readers[-1]} readers: dlfs read {disk['mb_per_s']:,.0f} MB/s with the disk "
            f"{disk['disk_busy']:.0%} busy, native {native_disk['mb_per_s']:,.0f} MB/s at "
            f"{native_disk['disk_busy']:.0%}."
        )
    return [*out, ""]


if __name__ == "__main__":
    main()
