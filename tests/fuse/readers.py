"""Readers under load, for the soak and fault tests: the dataset they read (with every file's size
and checksum), and ``soak_reader.py`` processes started on a mount and finished with timeouts, so
that a reader that hangs fails its test instead of stalling it."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
import time
from pathlib import Path

import xxhash
from waits import Changes, Exit, bound, wait_for

from dlfs.pack import PackOptions, pack

READER = Path(__file__).with_name("soak_reader.py")


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


def start_readers(
    mnt: Path, expected: Path, work: Path, jobs: list[list[dict]], **extra: object
) -> list[tuple[subprocess.Popen[bytes], Path]]:
    """One ``soak_reader.py`` process per list of thread jobs; returns (process, result path) pairs
    once every process has its threads started. Specs and results go under ``work``; a process
    that ends before it is ready fails the test at once."""
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

    def ready() -> bool:
        ended = [process.pid for process, _ in started if process.poll() is not None]
        assert not ended, f"reader processes {ended} ended before they were ready"
        return all((work / f"ready-{k}").exists() for k in range(len(jobs)))

    wait_for(
        ready,
        f"{len(jobs)} reader processes to start their threads",
        Changes(work),
        *(Exit(process.pid) for process, _ in started),
        seconds=60,
    )
    return started


def finish_readers(started: list[tuple[subprocess.Popen[bytes], Path]], timeout: float) -> list[dict]:
    """Every reader thread's result; a process still running ``bound(timeout)`` seconds from now is
    killed and fails the test."""
    results = []
    limit = bound(timeout)
    deadline = time.monotonic() + limit
    for process, result in started:
        try:
            code = process.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise AssertionError(f"reader process {process.pid} still running after {limit:.0f} s") from None
        assert code == 0, f"reader process {process.pid} exited {code}"
        results.extend(json.loads(result.read_text()))
    return results
