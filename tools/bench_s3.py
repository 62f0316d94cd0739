#!/usr/bin/env python3
"""dlfs over S3 against one object per file, on a real S3 server behind a shaped network.

The server is SeaweedFS in a network namespace whose link is capped (``tbf``) and delayed by a
proxy (``tools/netshape.py``; default 1 Gbit/s, 10 ms RTT), so loopback does not flatter either
side. On one generated ImageNet-shaped tree (the 20k JPEGs of bench-read):

1. upload: one object per file with a pool of threads (the best of --threads, chosen on a subset of
   --probe-files, then the whole tree), against ``dlfs pack SRC s3://...``;
2. epoch read: every file in the published order, one GET per file (the best of --threads)
   against the mount of the bucket (read-ahead on, no disk tier, page cache dropped), with the daemon's
   RSS sampled throughout; and the same mount on local shards (cold), the figure to approach;
3. the disk tier: an epoch that fills --disk-tier, then remounts whose epochs read from it, against
   the local shards (alternating, medians of --repeat); the disk tier's hit latency for one file
   (read and checksum verified, as the daemon serves it) beside a memcached GET of the same size on
   loopback.

Needs root (network namespace, dropping caches). One run; --json prints one document.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchdoc import print_document
from benchlib import DLFS, dlfs_mount, drop_caches, ensure_packed, rss_bytes
from netshape import shaped_seaweed
from s3_baselines import Result, get_objects, memcached_latency, s3_store, upload_objects

from dlfs import bench
from dlfs.bench.probes import proc_cpu, rusage_cpu
from dlfs.core import format as fmt
from dlfs.core.index import Index
from dlfs.core.store import StoreOptions, index_copies
from dlfs.core.store.disk_tier import DiskTier
from dlfs.core.store.s3.store import S3Store

BUCKET = "bench"
ORDERS = ("full", "block")


@contextmanager
def rss_sampled(pid: int, every: float = 0.1) -> Iterator[list[int]]:
    """The daemon's RSS every ``every`` seconds while the block runs."""
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(every):
            try:
                samples.append(rss_bytes(pid))
            except OSError:
                return

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join()


@contextmanager
def cpu_used(processes: dict[str, int]) -> Iterator[dict[str, float]]:
    """CPU seconds that each of ``processes`` (name: pid) used while the block ran, and its
    ``wall`` seconds: filled in on exit. On a few cores, what the S3 server and the proxy take
    bounds what is left for the side being measured."""

    def now() -> dict[str, float]:
        return {**{name: proc_cpu(pid) for name, pid in processes.items()}, "wall": time.perf_counter()}

    used: dict[str, float] = {}
    before = now()
    try:
        yield used
    finally:
        after = now()
        used.update({key: round(after[key] - before[key], 2) for key in before})


def stats(mnt: Path) -> dict:
    return json.loads((mnt / ".dlfs" / "stats").read_bytes())


def epoch(
    mnt: Path, items: list[str], readers: int, batch: int, processes: dict[str, int] | None = None
) -> tuple[dict, dict]:
    """One published-order epoch through a fresh mount, after ImageFolder's scan (untimed); given
    ``processes``, with the CPU they took meanwhile (``cpu``; the daemon's and the readers' are
    ``run_once``'s own figures). And what it moved per tier."""
    bench.imagefolder_scan(str(mnt))
    before = stats(mnt)
    with cpu_used(processes or {}) as used:
        run = bench.run_once(
            bench.Root("mnt", str(mnt)), "orderread", items, bench.Options(readers=readers, batch=batch)
        )
    if processes is not None:
        run = run | {"cpu": used}
    after = stats(mnt)
    moved = {
        tier: {key: after[tier][key] - before[tier][key] for key in after[tier]}
        for tier in ("store", "disk_tier")
        if after.get(tier)
    }
    return run, moved


def best(
    counts: list[int], work: Callable[[int], Result], processes: dict[str, int] | None = None
) -> tuple[int, Result, dict, dict[str, float]]:
    """The thread count whose run moved the most objects per second, every run's figure, and what
    ``cpu_used`` measured of ``processes`` during that run."""
    tried: dict[int, tuple[Result, dict[str, float]]] = {}
    for threads in counts:
        with cpu_used(processes or {}) as used:
            result = work(threads)
        tried[threads] = result, used
    threads = max(tried, key=lambda t: tried[t][0].objects_per_s)
    result, used = tried[threads]
    return threads, result, {t: round(r.objects_per_s) for t, (r, _) in tried.items()}, used


def hit_latency(url: str, disk_tier: Path, samples: int, seed: int = 0) -> dict[str, float]:
    """Per-file reads from the disk tier as the daemon does them: the stored bytes, then the
    checksum check. Warm: the block files in the page cache, as memcached's value is in RAM."""
    store = DiskTier(S3Store(url), disk_tier)
    try:
        index = Index.load(store, index_copies(StoreOptions(disk_tier=str(disk_tier))))
        rows = np.random.default_rng(seed).choice(index.file_rows(), samples, replace=False)
        spans = [(index.shard_of(r), int(index.offset[r]), int(index.stored[r])) for r in rows.tolist()]
        checks = [(int(index.flags[r]), int(index.size[r]), int(index.checksum[r])) for r in rows.tolist()]
        for span in spans:  # untimed: the blocks into the page cache
            store.read(*span)
        requests = store.inner.requests
        times = []
        for span, (flags, size, checksum) in zip(spans, checks, strict=True):
            started = time.perf_counter_ns()
            fmt.decode_payload(store.read(*span), flags, size, checksum)
            times.append(time.perf_counter_ns() - started)
        assert store.inner.requests == requests, "a disk-tier hit went to the store"
    finally:
        store.close()
    p50, p99 = np.percentile(np.array(times) / 1e3, [50, 99])
    sizes = [span[2] for span in spans]
    return {
        "p50_us": float(p50),
        "p99_us": float(p99),
        "samples": samples,
        "mean_bytes": float(np.mean(sizes)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--work", type=Path, default=Path("bench-data/read"))
    parser.add_argument("--s3-work", type=Path, default=Path("bench-data/s3"))
    parser.add_argument("--rate-mbit", type=float, default=1000)
    parser.add_argument("--rtt-ms", type=float, default=10)
    parser.add_argument("--threads", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--probe-files", type=int, default=4000)
    parser.add_argument("--readers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--latency-samples", type=int, default=2000)
    parser.add_argument(
        "--repeat", type=int, default=3, help="epochs from the disk tier and from local shards"
    )
    parser.add_argument(
        "--tier-order", choices=ORDERS, default="block", help="published order of the disk-tier epochs"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    src, local = args.work / "src", args.work / "dataset"
    ensure_packed(args.work, args.files, args.classes, "jpeg", local)
    shutil.rmtree(args.s3_work, ignore_errors=True)
    args.s3_work.mkdir(parents=True)
    tree = bench.Tree.walk(str(src))
    keys = tree.files  # relative to src, sorted
    total = sum(os.path.getsize(src / key) for key in keys)
    mnt, log = args.s3_work / "mnt", args.s3_work / "mount.log"
    results: dict[str, object] = {"files": len(keys), "bytes": total, "cores": os.cpu_count()}

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    with shaped_seaweed(args.s3_work / "weed", args.rate_mbit, args.rtt_ms) as s3:
        os.environ.update(s3.env())
        client = s3.client()
        client.create_bucket(Bucket=BUCKET)  # one: SeaweedFS gives each bucket volumes of its own
        env = s3.env()
        url = f"s3://{BUCKET}/packed/train"
        per_file = s3_store(env, BUCKET, "objects/train")

        # 1. Upload.
        probe = args.s3_work / "probe"
        for key in keys[: args.probe_files]:
            (probe / key).parent.mkdir(parents=True, exist_ok=True)
            os.link(src / key, probe / key)
        threads, _, tried, _ = best(
            args.threads,
            lambda t: upload_objects(s3_store(env, BUCKET, f"probe-{t}"), probe, t),
        )
        shape = {"server": s3.server.pid, "proxy": s3.proxy.pid}
        with_threads = shape | {"threads": os.getpid()}  # one object per file: this process's pool
        with cpu_used(with_threads) as objects_cpu:
            per_object = upload_objects(per_file, src, threads)
        children = rusage_cpu(resource.RUSAGE_CHILDREN)
        with cpu_used(shape) as pack_cpu:
            subprocess.run([*DLFS, "-q", "pack", str(src), url], check=True, capture_output=True)
        packed = Result.of(len(keys), total, pack_cpu["wall"])
        pack_cpu["pack"] = round(rusage_cpu(resource.RUSAGE_CHILDREN) - children, 2)
        results["upload"] = {
            "objects": per_object.__dict__
            | {"threads": threads, "tried_objects_per_s": tried, "cpu": objects_cpu},
            "dlfs_pack": packed.__dict__ | {"cpu": pack_cpu},
            "speedup": packed.seconds and per_object.seconds / packed.seconds,
        }
        say(
            f"upload: objects {per_object.objects_per_s:,.0f}/s ({threads} threads), "
            f"pack {packed.objects_per_s:,.0f}/s"
        )

        # 2. Epoch read in the published order, uniform (full) and by runs of neighbours (block).
        orders = {}
        for mode in ORDERS:
            with dlfs_mount(local, mnt, "--log-file", str(log), "--order", mode):
                orders[mode] = bench.published_order([bench.Root("dlfs", str(mnt))], epoch=0)
        drop_caches()
        threads, got, tried, get_cpu = best(
            args.threads, lambda t: get_objects(per_file, orders["full"], t), with_threads
        )
        results["epoch"] = {
            "objects": got.__dict__ | {"threads": threads, "tried_objects_per_s": tried, "cpu": get_cpu}
        }
        say(f"epoch: objects {got.objects_per_s:,.0f}/s ({threads} threads)")
        local_runs = {}
        for mode, order in orders.items():
            items = bench.job_items("orderread", tree, order, 0)
            flags = ("--log-file", str(log), "--order", mode)
            drop_caches()
            with dlfs_mount(url, mnt, *flags) as (pid, _), rss_sampled(pid) as rss:
                run, moved = epoch(mnt, items, args.readers, args.batch, shape)
                budgets = {
                    "readahead": stats(mnt)["readahead"]["budget"],
                    "cache": stats(mnt)["ram_cache"]["budget"],
                }
            drop_caches()
            with dlfs_mount(local, mnt, *flags):
                local_runs[mode], _ = epoch(mnt, items, args.readers, args.batch)
            results["epoch"][mode] = {
                "dlfs_s3": run | {"moved": moved, "rss_peak": max(rss, default=0), "rss_samples": len(rss)},
                "dlfs_local_cold": local_runs[mode],
                "speedup_vs_objects": run["items_per_s"] / got.objects_per_s,
                "vs_local": run["items_per_s"] / local_runs[mode]["items_per_s"],
                "budgets": budgets,
            }
            peak, local_rate = max(rss, default=0) / 2**20, local_runs[mode]["items_per_s"]
            say(
                f"epoch, order {mode}: dlfs s3 {run['items_per_s']:,.0f}/s ({moved['store']['requests']} "
                f"GETs, RSS peak {peak:.0f} MiB), local {local_rate:,.0f}/s"
            )

        # 3. The disk tier: an epoch that fills it, then one from it after a remount.
        cache = args.s3_work / "cache"
        flags = ("--log-file", str(log), "--disk-tier", str(cache), "--order", args.tier_order)
        items = bench.job_items("orderread", tree, orders[args.tier_order], 0)
        drop_caches()
        with dlfs_mount(url, mnt, *flags):
            first, first_moved = epoch(mnt, items, args.readers, args.batch, shape)
        # Later epochs from the tier against the local shards, alternating, medians of --repeat:
        # both are local reads, where this machine's run-to-run noise is larger than any one gap.
        seconds, locals_ = [], []
        for _ in range(args.repeat):
            drop_caches()
            with dlfs_mount(url, mnt, *flags):
                run, second_moved = epoch(mnt, items, args.readers, args.batch)
                seconds.append(run | {"store_bytes": second_moved["store"]["bytes"]})
            drop_caches()
            with dlfs_mount(local, mnt, "--log-file", str(log), "--order", args.tier_order):
                locals_.append(epoch(mnt, items, args.readers, args.batch)[0])
        second, local_tier = bench.median_runs(seconds), bench.median_runs(locals_)
        results["disk_tier"] = {
            "order": args.tier_order,
            "repeat": args.repeat,
            "first_epoch": first | {"moved": first_moved},
            "second_epoch": second,
            "local_cold": local_tier,
            "second_vs_local": second["items_per_s"] / local_tier["items_per_s"],
            "hit_latency": hit_latency(url, cache, args.latency_samples),
            "memcached_get": memcached_latency(110_000, args.latency_samples),
        }
        say(
            f"disk tier: first {first['items_per_s']:,.0f}/s, later {second['items_per_s']:,.0f}/s "
            f"(local {local_tier['items_per_s']:,.0f}/s); "
            f"hit p50 {results['disk_tier']['hit_latency']['p50_us']:.0f} us, "
            f"memcached p50 {results['disk_tier']['memcached_get']['p50_us']:.0f} us"
        )
    shutil.rmtree(args.s3_work, ignore_errors=True)
    options = vars(args) | {"work": str(args.work), "s3_work": str(args.s3_work)}
    if args.json:
        print_document({"options": options, "results": results})


if __name__ == "__main__":
    main()
