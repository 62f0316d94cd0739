"""The soak test: 64 readers (8 processes of 8 threads) on one mount for ``DLFS_SOAK_SECONDS``
(60 in ``make test``, 600 in ``make soak``), reading in two published epochs at once, at random,
and stat-ing, listing and reading the control files. Nothing may fail, every byte must match, the
daemon's RSS must stay within its budgets plus a fixed overhead, and its descriptors and threads
must come back to what they were. Read latency percentiles are printed and recorded."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from footprint import PeakRss, counts
from mounts import daemon_of, mount_stats, mounted
from readers import finish_readers, start_readers
from waits import Asked, wait_for

from dlfs.readahead.buffers import REUSED_BUFFER

SECONDS = float(os.environ.get("DLFS_SOAK_SECONDS", "60"))
PROCESSES, THREADS = 8, 8
CACHE_SIZE, PREFETCH_BUDGET = 32 << 20, 32 << 20
#: The read-ahead's read buffers: one per batch in flight (16 by default), allocated as they go.
READ_BUFFERS = 16 * REUSED_BUFFER
#: What the daemon holds besides its budgets and buffers: 44 MiB idle after mounting this dataset
#: (interpreter, numpy, trio, pyfuse3, the index), plus allocator arenas and thread stacks under
#: load. Peaks measured: docs/design.md, *Soak and faults*.
FIXED_OVERHEAD = 128 << 20

pytestmark = pytest.mark.timeout(SECONDS + 240)


def soak_jobs(processes: int, threads: int) -> list[list[dict]]:
    """64 readers: a quarter in epoch 0 (16 workers sharing it), a quarter in epoch 1 as ranks 0 and
    1 of 2 (8 workers each), a quarter at random, a quarter on metadata and control files. Roles are
    dealt round-robin, so every process holds each kind."""
    kinds: list[dict] = []
    kinds += [
        {"role": "order", "epoch": 0, "world": 1, "rank": 0, "worker": k, "workers": 16} for k in range(16)
    ]
    kinds += [
        {"role": "order", "epoch": 1, "world": 2, "rank": r, "worker": k, "workers": 8}
        for r in range(2)
        for k in range(8)
    ]
    kinds += [{"role": "random", "seed": k} for k in range(16)]
    kinds += [{"role": "meta", "seed": 100 + k} for k in range(16)]
    assert len(kinds) == processes * threads
    return [kinds[p::processes] for p in range(processes)]


def percentiles(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        name: round(ordered[min(int(q * len(ordered)), len(ordered) - 1)] * 1e3, 3)
        for name, q in (("p50_ms", 0.5), ("p99_ms", 0.99), ("p99.9_ms", 0.999))
    }


def _quiet(mnt: Path) -> bool:
    """Nothing in flight: no batch fetching, no folder being listed."""
    stats = mount_stats(mnt)
    return stats["listing_folders"] == 0 and not (stats["readahead"] or {}).get("inflight")


@pytest.fixture
def soak_mount(soak_dataset: tuple[Path, Path], tmp_path: Path) -> Iterator[tuple[Path, int]]:
    flags = ("--ram-cache-size", str(CACHE_SIZE), "--readahead-budget", str(PREFETCH_BUDGET))
    with mounted(soak_dataset[0], tmp_path / "mnt", *flags) as mnt:
        yield mnt, daemon_of(mnt)


def test_soak_64_readers_two_epochs_nothing_fails_leaks_or_outgrows_its_budgets(
    soak_dataset: tuple[Path, Path],
    soak_mount: tuple[Path, int],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    record_property,
) -> None:
    _, expected = soak_dataset
    mnt, pid = soak_mount
    # A few seconds of the same load first: the daemon opens some descriptors once, at first use
    # (its private view of the mount, each shard's O_DIRECT descriptor), and those are no leak.
    warm_up = start_readers(mnt, expected, tmp_path / "warm-up", soak_jobs(2, 32), deadline=time.time() + 5)
    assert sum(result["error_count"] for result in finish_readers(warm_up, 60)) == 0
    wait_for(lambda: _quiet(mnt), "the warm-up's read-ahead and listings to end", Asked(pid))
    before = counts(pid)
    work = tmp_path / "work"
    with PeakRss(pid) as rss:
        started = start_readers(
            mnt, expected, work, soak_jobs(PROCESSES, THREADS), deadline=time.time() + SECONDS
        )
        results = finish_readers(started, SECONDS + 120)
    errors = [error for result in results for error in result["errors"]]
    assert sum(result["error_count"] for result in results) == 0, errors
    assert all(result["files"] or result["stats"] for result in results), "a reader did nothing"
    wait_for(lambda: _quiet(mnt), "the soak's read-ahead and listings to end", Asked(pid))
    # Worker threads the daemon started under load end once idle (trio's after 10 s).
    wait_for(
        lambda: counts(pid)[0] <= before[0] and counts(pid)[1] <= before[1],
        f"descriptors and threads back to {before}",
        Asked(pid),
        seen=lambda: counts(pid),
    )
    after = counts(pid)
    bound = CACHE_SIZE + PREFETCH_BUDGET + READ_BUFFERS + FIXED_OVERHEAD
    latencies = [seconds for result in results for seconds in result["latencies"]]
    report = {
        "seconds": SECONDS,
        "readers": PROCESSES * THREADS,
        "files_read": sum(result["files"] for result in results),
        "bytes_verified": sum(result["bytes"] for result in results),
        "stats": sum(result["stats"] for result in results),
        "listings": sum(result["listings"] for result in results),
        "control_reads": sum(result["controls"] for result in results),
        **percentiles(latencies),
        "peak_rss_mib": round(rss.peak / 2**20, 1),
        "rss_bound_mib": bound >> 20,
        "fds_before_after": before[0:1] + after[0:1],
        "threads_before_after": before[1:] + after[1:],
    }
    for key, value in report.items():
        record_property(key, value)
    with capsys.disabled():
        print(f"\nsoak: {json.dumps(report)}")
    assert rss.peak <= bound, report
