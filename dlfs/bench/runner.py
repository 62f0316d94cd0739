"""The runner: every job on every root, one timed pass after another, in one process.

Comparisons are only meaningful within one run, so every root runs every job in the same process,
one after the other, with the page cache dropped before each run when ``cold``. A run's clock
starts when its readers are ready, before a dlfs root's order file is read again: the read-ahead
gets no head start over the other roots.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlfs.bench.errors import BenchError
from dlfs.bench.jobs import JOBS, ORDER_JOBS, Tree, job_items
from dlfs.bench.probes import block_devices, daemon_pid, disk_counters, proc_cpu, proc_rss
from dlfs.bench.readers import run_readers
from dlfs.bench.report import Result
from dlfs.bench.roots import Root, first_dlfs, order_file, published_order, wait_idle
from dlfs.core.protocol import is_dlfs_mount

log = logging.getLogger(__name__)

DROP_CACHES = "/proc/sys/vm/drop_caches"


@dataclass
class Options:
    jobs: Sequence[str] = JOBS
    readers: int = 1
    #: Items a reader takes at a time, as a DataLoader worker takes a batch.
    batch: int = 1
    processes: bool = True
    cold: bool = False
    repeat: int = 1
    seed: int = 0
    epoch: int = 0


def check_can_drop_caches() -> None:
    if not os.access(DROP_CACHES, os.W_OK):
        raise BenchError(
            f"--cold needs to write {DROP_CACHES} (permission denied); run as root or drop --cold"
        )


def drop_caches() -> None:
    """Drop the page, dentry and inode caches: what a cold run starts from."""
    subprocess.run(["sync"], check=True)
    Path(DROP_CACHES).write_text("3\n")


def run_once(root: Root, job: str, items: Sequence[str], options: Options) -> dict[str, float]:
    """One timed pass of ``job`` over ``items`` on ``root``: throughput, latency, CPU, daemon RSS,
    and the disk figures where the root sits on block devices. A dlfs root's background listing
    (see ``wait_idle``) ends first."""
    waited = wait_idle(root.path)
    if options.cold:
        drop_caches()
    pid = daemon_pid(root.path)
    rss_before = proc_rss(pid) if pid else 0
    devices = block_devices(root.path, pid)

    def arm() -> None:  # re-arms a dlfs root's read-ahead, as the sampler does
        if job in ORDER_JOBS and is_dlfs_mount(root.path):
            order_file(root, options.epoch).read_bytes()

    disk = disk_counters(devices)
    daemon_cpu = proc_cpu(pid) if pid else 0.0
    seconds, shares = run_readers(
        job, root.path, items, options.readers, options.processes, arm, options.batch
    )
    disk = disk_counters(devices) - disk
    latencies = np.fromiter((x for s in shares for x in s.latencies), dtype=np.float64) * 1e6
    p50, p99, p999 = np.percentile(latencies, [50, 99, 99.9]) if latencies.size else (0.0, 0.0, 0.0)
    nbytes = sum(s.nbytes for s in shares)
    run = {
        "seconds": seconds,
        "items_per_s": len(items) / seconds,
        "mb_per_s": nbytes / seconds / 1e6,
        "bytes": float(nbytes),
        "p50_us": float(p50),
        "p99_us": float(p99),
        "p999_us": float(p999),
        "reader_cpu_s": sum(s.cpu for s in shares),
    }
    if pid:
        run |= {
            "daemon_cpu_s": proc_cpu(pid) - daemon_cpu,
            "daemon_rss_before": float(rss_before),
            "daemon_rss_after": float(proc_rss(pid)),
            "waited_for_background_s": waited,
        }
    if devices:  # the busiest device's share of the run with I/O in flight, as fio's util
        run |= {
            "disk_reads": float(disk[:, 0].sum()),
            "disk_read_mb": float(disk[:, 1].sum()) * 512 / 1e6,
            "disk_busy": min(float(disk[:, 2].max()) / 1e3 / seconds, 1.0),
        }
    return run


def run(
    roots: Sequence[Root], options: Options, progress: Callable[[Result], None] | None = None
) -> list[Result]:
    """Every job on every root, ``repeat`` times each; the jobs outermost so roots alternate."""
    unknown = set(options.jobs) - set(JOBS)
    if unknown:
        raise BenchError(f"unknown job(s) {', '.join(sorted(unknown))}; choose from {', '.join(JOBS)}")
    if options.readers < 1 or options.repeat < 1 or options.batch < 1:
        raise BenchError("--readers, --batch and --repeat must be at least 1")
    if options.cold:
        check_can_drop_caches()
    trees = {root.path: Tree.walk(root.path) for root in roots}
    if set(ORDER_JOBS) & set(options.jobs):
        first_dlfs(roots)  # fail early when there is no order to follow, without arming anything
    order = None
    results = []
    for job in options.jobs:
        if job in ORDER_JOBS and order is None:
            # Read only now: reading it arms a dlfs root's read-ahead, which must not work during
            # the jobs before this one.
            order = published_order(roots, options.epoch)
        for root in roots:
            items = job_items(job, trees[root.path], order, options.seed)
            if not items:
                raise BenchError(f"{root.path}: nothing for {job} to do (no files or class folders)")
            result = Result(root.label, root.path, job, options.readers, len(items))
            for _ in range(options.repeat):
                result.runs.append(run_once(root, job, items, options))
            log.debug("%s on %s: %s", job, root.label, result.median)
            if progress:
                progress(result)
            results.append(result)
    return results
