"""The soak test: 64 readers (8 processes of 8 threads) on one mount for ``DLFS_SOAK_SECONDS``
(60 in ``make test``, 600 in ``make soak``), reading in two published epochs at once, at random,
and stat-ing, listing and reading the control files. Nothing may fail, every byte must match, the
daemon's RSS must stay within its budgets plus a fixed overhead, and its descriptors and threads
must come back to what they were. Read latency percentiles are printed and recorded."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import xxhash
from conftest import mounted, wait_until
from test_mount import _daemon_of

from dlfs.pack import PackOptions, pack
from dlfs.readahead.buffers import REUSED_BUFFER

SECONDS = float(os.environ.get("DLFS_SOAK_SECONDS", "60"))
READER = Path(__file__).with_name("soak_reader.py")
PROCESSES, THREADS = 8, 8
CACHE_SIZE, PREFETCH_BUDGET = 32 << 20, 32 << 20
#: The read-ahead's read buffers: one per batch in flight (16 by default), allocated as they go.
READ_BUFFERS = 16 * REUSED_BUFFER
#: What the daemon holds besides its budgets and buffers: 44 MiB idle after mounting this dataset
#: (interpreter, numpy, trio, pyfuse3, the index), plus allocator arenas and thread stacks under
#: load. Peaks measured: docs/design.md, *Soak and faults*.
FIXED_OVERHEAD = 128 << 20

pytestmark = pytest.mark.timeout(SECONDS + 240)


def make_dataset(root: Path, folders: int = 25, per_folder: int = 100, seed: int = 25) -> dict[str, list]:
    """Files of 4-200 KB (log-uniform, as photos are) in class folders; their sizes and xxh3-64."""
    rng = random.Random(seed)
    expected = {}
    for folder in range(folders):
        for k in range(per_folder):
            relpath = f"n{folder:08d}/n{folder:08d}_{k:04d}.JPEG"
            data = rng.randbytes(int(math.exp(rng.uniform(math.log(4 << 10), math.log(200 << 10)))))
            path = root / relpath
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            expected[relpath] = [len(data), xxhash.xxh3_64_hexdigest(data)]
    return expected


def pack_soak_dataset(root: Path) -> tuple[Path, Path]:
    """(dataset, expected.json) of 2,500 files, ~125 MB: twice the soak's two budgets together."""
    expected = make_dataset(root / "src")
    pack(root / "src", root / "dataset", PackOptions(shard_size=16 << 20, progress=False))
    (root / "expected.json").write_text(json.dumps(expected))
    return root / "dataset", root / "expected.json"


@pytest.fixture(scope="module")
def soak_dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return pack_soak_dataset(tmp_path_factory.mktemp("soak"))


def start_readers(mnt: Path, expected: Path, work: Path, jobs: list[list[dict]], **extra) -> list[tuple]:
    """One ``soak_reader.py`` process per list of thread jobs; returns (process, result path) pairs
    once every process has its threads started. Specs and results go under ``work``."""
    work.mkdir(exist_ok=True)
    started = []
    for k, threads in enumerate(jobs):
        spec = {
            "mount": str(mnt),
            "expected": str(expected),
            "threads": threads,
            "ready": str(work / f"ready-{k}"),
            "result": str(work / f"result-{k}.json"),
            **extra,
        }
        (work / f"spec-{k}.json").write_text(json.dumps(spec))
        process = subprocess.Popen([sys.executable, str(READER), str(work / f"spec-{k}.json")])
        started.append((process, work / f"result-{k}.json"))
    assert wait_until(lambda: all((work / f"ready-{k}").exists() for k in range(len(jobs))), 60)
    return started


def finish_readers(started: list[tuple], timeout: float) -> list[dict]:
    """Every reader thread's result; a process still running after ``timeout`` is killed and fails."""
    results = []
    deadline = time.monotonic() + timeout
    for process, result in started:
        try:
            code = process.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise AssertionError(
                f"reader process {process.pid} still running after {timeout:.0f} s"
            ) from None
        assert code == 0, f"reader process {process.pid} exited {code}"
        results.extend(json.loads(result.read_text()))
    return results


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


def _status(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def counts(pid: int) -> tuple[int, int]:
    """(open descriptors, threads) of a process."""
    return len(os.listdir(f"/proc/{pid}/fd")), len(os.listdir(f"/proc/{pid}/task"))


class PeakRss:
    """The highest RSS a process reached, sampled every 50 ms on a thread of its own."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, _status(self.pid, "VmRSS") << 10)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def percentiles(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        name: round(ordered[min(int(q * len(ordered)), len(ordered) - 1)] * 1e3, 3)
        for name, q in (("p50_ms", 0.5), ("p99_ms", 0.99), ("p99.9_ms", 0.999))
    }


def _stats(mnt: Path) -> dict:
    return json.loads((mnt / ".dlfs" / "stats").read_bytes())


def _quiet(mnt: Path) -> bool:
    """Nothing in flight: no batch fetching, no folder being listed."""
    stats = _stats(mnt)
    return stats["listing_folders"] == 0 and not (stats["readahead"] or {}).get("inflight")


@pytest.fixture
def soak_mount(soak_dataset: tuple[Path, Path], tmp_path: Path) -> Iterator[tuple[Path, int]]:
    flags = ("--cache-size", str(CACHE_SIZE), "--readahead-budget", str(PREFETCH_BUDGET))
    with mounted(soak_dataset[0], tmp_path / "mnt", *flags) as mnt:
        yield mnt, _daemon_of(mnt)


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
    assert wait_until(lambda: _quiet(mnt), 30)
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
    assert wait_until(lambda: _quiet(mnt), 30)
    # Worker threads the daemon started under load end once idle (trio's after 10 s).
    assert wait_until(lambda: counts(pid)[0] <= before[0] and counts(pid)[1] <= before[1], 30), (
        f"descriptors and threads {before} before, {counts(pid)} after"
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
