"""One reader process of the soak and fault tests: several reader threads on a mount, until a deadline.

Run as ``python soak_reader.py SPEC.json``; the spec names the mount, the expected size and xxh3 of
every file (``expected``, a JSON file), the deadline (``time.time()``), where to write the result,
and one entry per thread: ``{"role": "order", "epoch": E, "world": W, "rank": R, "worker": k,
"workers": N}`` reads positions k, k+N, … of that published order, pass after pass, as a DataLoader
worker does; ``{"role": "random", "seed": S}`` reads files picked at random; ``{"role": "meta",
"seed": S}`` stats files, lists folders, reads ``.dlfs/stats`` and order files. Every file is read
whole and compared by size and checksum, never kept in memory. A separate process, so that the
test can kill it, and so that readers are processes and threads at once.

``{"role": "until-error"}`` (the SIGKILL test) reads files in a loop and stops at the first
``OSError``, recording its errno and how long after the daemon's death it came.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from pathlib import Path

import xxhash

from dlfs.core.protocol import order_path, parse_order

CHUNK = 1 << 20
#: Errors kept as text per thread; the rest are only counted.
KEEP_ERRORS = 20


def read_whole(path: Path) -> tuple[int, str]:
    """Size and xxh3-64 of a file, read unbuffered in 1 MiB chunks as a loader reads it.

    Its pages are dropped from the kernel's cache afterwards, as if the dataset were far larger
    than memory: otherwise the whole test dataset stays cached after one pass and the daemon idles.
    """
    digest = xxhash.xxh3_64()
    size = 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    return size, digest.hexdigest()


class Reader:
    """One reader thread's loop and its tally."""

    def __init__(self, mnt: Path, expected: dict[str, list], folders: dict[str, set[str]], deadline: float):
        self.mnt = mnt
        self.expected = expected
        self.folders = folders
        self.deadline = deadline
        self.tally = {
            "files": 0,
            "bytes": 0,
            "stats": 0,
            "listings": 0,
            "controls": 0,
            "error_count": 0,
            "mismatches": 0,
        }
        self.errors: list[str] = []
        self.latencies: list[float] = []
        self.orders: dict[str, str] = {}

    def fail(self, what: str) -> None:
        self.tally["error_count"] += 1
        if len(self.errors) < KEEP_ERRORS:
            self.errors.append(what)

    def read(self, relpath: str) -> None:
        started = time.perf_counter()
        try:
            got = read_whole(self.mnt / relpath)
        except OSError as exc:
            self.tally["slowest_error"] = max(
                self.tally.get("slowest_error", 0.0), time.perf_counter() - started
            )
            errnos = self.tally.setdefault("errnos", {})
            errnos[str(exc.errno)] = errnos.get(str(exc.errno), 0) + 1
            self.fail(f"read {relpath}: {exc!r}")
            return
        self.latencies.append(time.perf_counter() - started)
        size, digest = self.expected[relpath]
        if got != (size, digest):
            self.tally["mismatches"] += 1
            self.fail(f"read {relpath}: got {got}, expected {(size, digest)}")
            return
        self.tally["files"] += 1
        self.tally["bytes"] += size

    def order(self, epoch: int, world: int, rank: int) -> list[str]:
        """The published order, read (and so announced) again; it must never change."""
        path = order_path(self.mnt, epoch, world, rank)
        text = path.read_bytes()
        self.tally["controls"] += 1
        digest = xxhash.xxh3_64_hexdigest(text)
        if self.orders.setdefault(path.name, digest) != digest:
            self.fail(f"{path.name} changed between two reads")
        return parse_order(text)

    def run_order(self, epoch: int, world: int, rank: int, worker: int, workers: int) -> None:
        while time.time() < self.deadline:
            for relpath in self.order(epoch, world, rank)[worker::workers]:
                if time.time() >= self.deadline:
                    return
                self.read(relpath)

    def run_random(self, seed: int) -> None:
        rng = random.Random(seed)
        names = sorted(self.expected)
        while time.time() < self.deadline:
            self.read(rng.choice(names))

    def run_meta(self, seed: int) -> None:
        rng = random.Random(seed)
        names = sorted(self.expected)
        folders = sorted(self.folders)
        while time.time() < self.deadline:
            relpath = rng.choice(names)
            try:
                size = os.stat(self.mnt / relpath).st_size
                self.tally["stats"] += 1
                if size != self.expected[relpath][0]:
                    self.fail(f"stat {relpath}: size {size}, expected {self.expected[relpath][0]}")
                folder = rng.choice(folders)
                listed = set(os.listdir(self.mnt / folder))
                self.tally["listings"] += 1
                if listed != self.folders[folder]:
                    self.fail(f"listing {folder}: {len(listed)} names, expected {len(self.folders[folder])}")
                json.loads((self.mnt / ".dlfs" / "stats").read_bytes())
                self.tally["controls"] += 1
                self.order(rng.randrange(2), 2, rng.randrange(2))
            except (OSError, ValueError) as exc:
                self.fail(f"metadata near {relpath}: {exc!r}")

    def run_until_error(self, seed: int, died_at: Path) -> None:
        """Read until the first error; record its errno and how long after ``died_at`` was written."""
        rng = random.Random(seed)
        names = sorted(self.expected)
        while True:
            relpath = rng.choice(names)
            try:
                got = read_whole(self.mnt / relpath)
            except OSError as exc:
                self.tally["errno"] = exc.errno
                if died_at.exists():
                    self.tally["after_death"] = time.time() - float(died_at.read_text())
                return
            self.tally["files"] += 1
            if got != tuple(self.expected[relpath]):
                self.tally["mismatches"] += 1


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    mnt = Path(spec["mount"])
    expected = json.loads(Path(spec["expected"]).read_text())
    folders: dict[str, set[str]] = {}
    for relpath in expected:
        folder, _, name = relpath.rpartition("/")
        folders.setdefault(folder, set()).add(name)
    readers = [Reader(mnt, expected, folders, spec.get("deadline", 0.0)) for _ in spec["threads"]]
    threads = []
    for reader, job in zip(readers, spec["threads"], strict=True):
        role = job.pop("role")
        if role == "until-error":
            job["died_at"] = Path(spec["died_at"])
        threads.append(threading.Thread(target=getattr(reader, f"run_{role.replace('-', '_')}"), kwargs=job))
    for thread in threads:
        thread.start()
    Path(spec["ready"]).touch()
    for thread in threads:
        thread.join()
    Path(spec["result"]).write_text(
        json.dumps(
            [{**r.tally, "errors": r.errors, "latencies": r.latencies} for r in readers],
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
