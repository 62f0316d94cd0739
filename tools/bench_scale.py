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
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchdoc import DASH, Json, print_document, ratio, table
from benchlib import (
    DLFS,
    can_drop_caches,
    current_dataset,
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

from dlfs import bench
from dlfs.core.protocol import parse_order
from dlfs.fuse.mount import MountOptions

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


def cold_scans(root: Path, runs: int, daemon: int | None = None) -> dict[str, dict[str, float]]:
    """``runs`` ImageFolder scans of ``root``, each after dropping the caches: the wall time
    (``wall``) and where the CPU went, the scanning process's user and system seconds and a FUSE
    daemon's. A READDIRPLUS makes the kernel build an inode and a dentry per entry, in the scanner's
    system time: what separates a cold ``--readdirplus always`` scan from native's. On a mount
    (``daemon`` given), also how long the daemon went on listing in the background after the scan
    (``background``) and its CPU meanwhile (``background_cpu``)."""
    seen: dict[str, list[float]] = {"wall": [], "scanner_user": [], "scanner_sys": [], "daemon": []}
    if daemon:
        seen |= {"background": [], "background_cpu": []}
    for _ in range(runs):
        drop_caches()
        before, daemon_before = os.times(), bench.proc_cpu(daemon) if daemon else 0.0
        seen["wall"].append(timed(lambda: imagefolder_scan(str(root)))[0])
        after = os.times()
        seen["scanner_user"].append(after.user - before.user)
        seen["scanner_sys"].append(after.system - before.system)
        if daemon:
            daemon_after = bench.proc_cpu(daemon)
            seen["daemon"].append(daemon_after - daemon_before)
            seen["background"].append(bench.wait_idle(str(root)))
            seen["background_cpu"].append(bench.proc_cpu(daemon) - daemon_after)
        else:
            seen["daemon"].append(0.0)
    return {name: spread(values) for name, values in seen.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=1_281_167)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--work", type=Path, default=Path("bench-data/scale"))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--readdirplus",
        choices=("always", "auto"),
        default=MountOptions().readdirplus,
        help="the mount's listing mode (see dlfs mount --help; default: dlfs mount's)",
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

    if not (args.reuse_dataset and current_dataset(dst)):
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
        cold = cold_scans(src, args.repeat)
        results["native_scan_cold"], results["native_scan_cold_cpu"] = cold.pop("wall"), cold

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
            results["background_after_find"] = bench.wait_idle(str(mnt))
            results["rss_after_find"] = rss_bytes(pid)
            results["dlfs_find"] = median_of(args.repeat, lambda: find_count(str(mnt)))
            assert imagefolder_scan(str(mnt)) == args.files
            results["dlfs_scan"] = median_of(args.repeat, lambda: imagefolder_scan(str(mnt)))
            if can_drop_caches():

                def idle_and_cold() -> None:
                    bench.wait_idle(str(mnt))
                    drop_caches()

                results["dlfs_find_cold"] = median_of(
                    args.repeat, lambda: find_count(str(mnt)), before=idle_and_cold
                )
                bench.wait_idle(str(mnt))
                cold = cold_scans(mnt, args.repeat, pid)
                results["dlfs_scan_cold"], results["dlfs_scan_cold_cpu"] = cold.pop("wall"), cold
            results["rss_after_all"] = rss_bytes(pid)
            results |= order_steps(mnt, args.repeat)  # last: it arms the read-ahead
    results["mount_seconds"] = sorted(mount_times)[len(mount_times) // 2]
    results["mount_seconds_all"] = mount_times
    results["when"] = time.strftime("%Y-%m-%d %H:%M:%S")

    if args.json:
        print_document(results)
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
    if "dlfs_scan_cold_cpu" in results:
        for side in ("native", "dlfs"):
            cpu = {k: v["median"] for k, v in results[f"{side}_scan_cold_cpu"].items()}  # type: ignore[attr-defined]
            print(
                f"cold scan CPU, {side:6}  scanner {cpu['scanner_user']:.2f} s user + "
                f"{cpu['scanner_sys']:.2f} s system, daemon {cpu['daemon']:.2f} s (medians)"
            )
        background = {k: v["median"] for k, v in results["dlfs_scan_cold_cpu"].items()}  # type: ignore[attr-defined]
        print(
            f"after a cold scan the daemon listed in the background for {background['background']:.2f} s "
            f"({background['background_cpu']:.2f} s CPU; medians)"
        )
    print(f"find on the mount right after mounting: {results['dlfs_find_first']:.2f} s")
    steps = ", ".join(f"{k.removeprefix('order_')} {results[k]['median']:.2f} s" for k in ORDER_STEPS)  # type: ignore[index]
    print(f"an epoch's order file: {steps}")


TITLE = "Metadata at ImageNet scale"


def render(always: Json, auto: Json | None) -> list[str]:
    """This benchmark's section of docs/benchmarks.md: ``--readdirplus auto`` (the default) first,
    beside ``always``."""
    runs = [(name, data) for name, data in (("auto", auto), ("always", always)) if data]
    first = runs[0][1]
    out = [
        f"{first['files']:,} tiny files in {first['classes']:,} class folders ({first['entries']:,} "
        f"entries). Index {first['index_bytes'] / 2**20:.0f} MiB. Times in seconds, median of the runs "
        f"(min{DASH}max beside it); native is the same tree on ext4, timed in the same run; the ratio is "
        "dlfs time / native time (below 1: dlfs faster). `--readdirplus auto` is the default.",
        "",
    ]

    def cell(stat: Any) -> str:
        if isinstance(stat, dict):
            return f"{stat['median']:.2f} ({stat['min']:.2f}{DASH}{stat['max']:.2f})"
        return f"{stat:.2f}"

    def med(stat: Any) -> float:
        return stat["median"] if isinstance(stat, dict) else stat

    header = ["", *[f"`{name}`" for name, _ in runs]]
    rows: list[list[str]] = [
        ["mount, until live", *[cell(d["mount_seconds"]) for _, d in runs]],
        ["daemon RSS after mount / after find / at the end (MiB)"]
        + [
            f"{d['rss_after_mount'] / 2**20:.0f} / {d['rss_after_find'] / 2**20:.0f} / "
            f"{d['rss_after_all'] / 2**20:.0f}"
            for _, d in runs
        ],
        ["first `find` after mounting", *[cell(d["dlfs_find_first"]) for _, d in runs]],
        ["background listing after it", *[cell(d["background_after_find"]) for _, d in runs]],
    ]
    for label, key in (
        ("`find`, warm", "find"),
        ("`find`, cold", "find_cold"),
        ("ImageFolder scan, warm", "scan"),
        ("ImageFolder scan, cold", "scan_cold"),
    ):
        rows.append(
            [
                label,
                *[
                    f"{cell(d['dlfs_' + key])} vs native {med(d['native_' + key]):.2f}: "
                    f"**{ratio(med(d['dlfs_' + key]), med(d['native_' + key]))}**"
                    for _, d in runs
                ],
            ]
        )
    rows.append(
        [
            "cold scan CPU: scanner user+sys, daemon (s)",
            *[
                f"{med(c['scanner_user']) + med(c['scanner_sys']):.2f}, {med(c['daemon']):.2f} "
                f"(native {med(n['scanner_user']) + med(n['scanner_sys']):.2f})"
                for c, n in ((d["dlfs_scan_cold_cpu"], d["native_scan_cold_cpu"]) for _, d in runs)
            ],
        ]
    )
    rows.append(
        [
            "background listing after the cold scan: wall, CPU (s)",
            *[
                f"{med(d['dlfs_scan_cold_cpu']['background']):.2f}, "
                f"{med(d['dlfs_scan_cold_cpu']['background_cpu']):.2f}"
                for _, d in runs
            ],
        ]
    )
    rows.append(
        [
            "epoch start: order file LOOKUP, read, parse",
            *[
                f"{med(d['order_lookup']):.2f}, {med(d['order_read']):.2f}, {med(d['order_parse']):.2f}"
                for _, d in runs
            ],
        ]
    )
    out += table(header, rows)
    when = ", ".join(f"`{name}` {d['when']}" for name, d in runs if "when" in d)
    out += [
        "",
        f"Run at: {when}. The background listing is `auto`'s inode work (the kernel building an inode "
        "per file for the read-ahead's pushes), done after the scan instead of inside it, while a job "
        "sets up; with `always` the scan does it itself, which is its cold-scan ratio.",
        "",
    ]
    return out


if __name__ == "__main__":
    main()
