#!/usr/bin/env python3
"""Metadata at ImageNet scale: pack, index size, mount time, daemon RSS, find and ImageFolder scan.

Builds (once, reused later) a tree of ``--files`` tiny files in ImageNet's 1000 class folders,
packs it, mounts it, and times ``find MNT | wc -l`` and an ImageFolder-style class scan on the
mount and on the native tree in the same run, and what a sampler waits for at an epoch's start
(the order file's LOOKUP, read and parse). Prints a table and, with ``--json``, JSON.
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import (
    DLFS,
    can_drop_caches,
    dlfs_mount,
    drop_caches,
    ensure_tree,
    find_count,
    imagefolder_scan,
    median_of,
    rss_bytes,
    spread,
    timed,
)

from dlfs.control import parse_order

#: Steps of reading an epoch's order file, as a sampler does at the start of each epoch.
ORDER_STEPS = ("order_lookup", "order_read", "order_parse")


def order_steps(mnt: Path, repeat: int) -> dict[str, dict[str, float]]:
    """Each step's wall time over ``repeat`` fresh epochs: the order file's LOOKUP (which arms the
    read-ahead and generates the text), its read, and the parse."""
    times: dict[str, list[float]] = {step: [] for step in ORDER_STEPS}
    for epoch in range(repeat):
        path = mnt / ".dlfs" / "order" / f"epoch-{epoch}"
        times["order_lookup"].append(timed(path.stat)[0])
        took, text = timed(path.read_bytes)
        times["order_read"].append(took)
        times["order_parse"].append(timed(functools.partial(parse_order, text))[0])
    return {step: spread(t) for step, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=1_281_167)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--work", type=Path, default=Path("bench-data/scale"))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--readdirplus",
        choices=("always", "auto"),
        default="always",
        help="the mount's listing mode (see dlfs mount --help)",
    )
    parser.add_argument(
        "--reuse-dataset",
        action="store_true",
        help="skip pack when the dataset exists (pack time is then not reported)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    src, dst, mnt = args.work / "src", args.work / "dataset", args.work / "mnt"
    ensure_tree(args.work, args.files, args.classes, "tiny")
    results: dict[str, object] = {"files": args.files, "classes": args.classes}

    if not (args.reuse_dataset and (dst / "index.dlfs").exists()):
        shutil.rmtree(dst, ignore_errors=True)
        command = [*DLFS, "-q", "pack", str(src), str(dst)]
        results["pack_seconds"] = timed(lambda: subprocess.run(command, check=True, capture_output=True))[0]
    results["index_bytes"] = (dst / "index.dlfs").stat().st_size
    results["entries"] = args.files + args.classes + 1
    results["readdirplus"] = args.readdirplus

    for _ in range(args.repeat):  # warm the native tree's dentry cache once before the native timings
        find_count(str(src))
    results["native_find"] = median_of(args.repeat, lambda: find_count(str(src)))
    results["native_scan"] = median_of(args.repeat, lambda: imagefolder_scan(str(src)))
    if can_drop_caches():
        results["native_find_cold"] = median_of(args.repeat, lambda: find_count(str(src)), before=drop_caches)
        results["native_scan_cold"] = median_of(
            args.repeat, lambda: imagefolder_scan(str(src)), before=drop_caches
        )

    mount_times = []
    for attempt in range(args.repeat):
        flags = ("--log-file", str(args.work / "mount.log"), "--readdirplus", args.readdirplus)
        with dlfs_mount(dst, mnt, *flags) as (pid, took):
            mount_times.append(took)
            if attempt < args.repeat - 1:
                continue
            results["rss_after_mount"] = rss_bytes(pid)
            first_find, count = timed(lambda: find_count(str(mnt)))
            assert count == results["entries"], (count, results["entries"])
            results["dlfs_find_first"] = first_find
            results["rss_after_find"] = rss_bytes(pid)
            results["dlfs_find"] = median_of(args.repeat, lambda: find_count(str(mnt)))
            assert imagefolder_scan(str(mnt)) == args.files
            results["dlfs_scan"] = median_of(args.repeat, lambda: imagefolder_scan(str(mnt)))
            if can_drop_caches():
                results["dlfs_find_cold"] = median_of(
                    args.repeat, lambda: find_count(str(mnt)), before=drop_caches
                )
                results["dlfs_scan_cold"] = median_of(
                    args.repeat, lambda: imagefolder_scan(str(mnt)), before=drop_caches
                )
            results["rss_after_all"] = rss_bytes(pid)
            results |= order_steps(mnt, args.repeat)  # last: it arms the read-ahead
    results["mount_seconds"] = sorted(mount_times)[len(mount_times) // 2]
    results["mount_seconds_all"] = mount_times
    results["when"] = time.strftime("%Y-%m-%d %H:%M:%S")

    if args.json:
        print(json.dumps(results, indent=2))
        return
    mib = 1 << 20
    print(f"\n{args.files:,} files in {args.classes} classes ({results['entries']:,} entries)")
    if "pack_seconds" in results:
        print(f"pack                    {results['pack_seconds']:8.1f} s")
    print(f"index on disk           {results['index_bytes'] / mib:8.1f} MiB")
    print(f"mount until ready       {results['mount_seconds']:8.2f} s  (median of {args.repeat})")
    print(f"daemon RSS after mount  {results['rss_after_mount'] / mib:8.1f} MiB")
    print(f"daemon RSS after find   {results['rss_after_find'] / mib:8.1f} MiB")
    print(f"daemon RSS at the end   {results['rss_after_all'] / mib:8.1f} MiB")
    print(f"{'':24}{'native':>10}{'dlfs':>10}{'dlfs/native':>13}")
    rows = [
        ("find | wc -l, warm", "native_find", "dlfs_find"),
        ("ImageFolder scan, warm", "native_scan", "dlfs_scan"),
        ("find | wc -l, cold", "native_find_cold", "dlfs_find_cold"),
        ("ImageFolder scan, cold", "native_scan_cold", "dlfs_scan_cold"),
    ]
    for label, native_key, dlfs_key in rows:
        if native_key in results:
            a = results[native_key]["median"]  # type: ignore[index]
            b = results[dlfs_key]["median"]  # type: ignore[index]
            print(f"{label:24}{a:9.2f}s{b:9.2f}s{b / a:12.2f}x")
    print(f"find on the mount right after mounting: {results['dlfs_find_first']:.2f} s")
    steps = ", ".join(f"{k.removeprefix('order_')} {results[k]['median']:.2f} s" for k in ORDER_STEPS)  # type: ignore[index]
    print(f"an epoch's order file: {steps}")


if __name__ == "__main__":
    main()
