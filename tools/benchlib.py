"""Small helpers shared by the benchmark scripts: timing, medians, page-cache control, mounts."""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from dlfs import bench
from dlfs.core import format as fmt
from dlfs.core.errors import DatasetError, MountError
from dlfs.fuse.mount import unmount

DLFS = [sys.executable, "-m", "dlfs.cli"]


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def median_of(
    runs: int, fn: Callable[[], object], before: Callable[[], None] | None = None
) -> dict[str, float]:
    """Median, min and max wall time of ``runs`` calls; ``before`` runs untimed ahead of each."""
    times = []
    for _ in range(runs):
        if before:
            before()
        times.append(timed(fn)[0])
    return spread(times)


def spread(times: list[float]) -> dict[str, float]:
    """Median, min and max of some timings, as every benchmark here reports them."""
    return {"median": statistics.median(times), "min": min(times), "max": max(times)}


#: A timed step, and what it writes (removed before each run; None: nothing).
Step = tuple[Callable[[], object], Path | None]


def cold_rounds(
    steps: dict[str, Step], repeat: int, say: Callable[[int, str, float], None]
) -> dict[str, dict[str, float]]:
    """Median, min and max seconds of every step over ``repeat`` rounds, each run from a cold page
    cache with its output removed first (untimed), the steps taking turns in an order that rotates
    each round; ``say`` hears (round, step, seconds) of each run."""
    names = list(steps)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_no in range(repeat):
        first = round_no % len(names)
        for name in names[first:] + names[:first]:
            step, output = steps[name]
            remove(output)
            drop_caches()
            times[name].append(timed(step)[0])
            say(round_no, name, times[name][-1])
    return {name: spread(times[name]) for name in names}


def remove(path: Path | None) -> None:
    """A step's output, file or folder, gone (nothing when None or absent)."""
    if path is None:
        return
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def ensure_tree(work: Path, files: int, classes: int, payload: str) -> bool:
    """Generate ``work/src`` once (a marker names its shape); True if it was (re)generated now."""
    from make_imagenet_like import generate

    marker = work / f"generated-{files}-{classes}-{payload}"
    if marker.exists():
        return False
    shutil.rmtree(work, ignore_errors=True)
    print(
        f"generating {files:,} {payload} files in {classes} classes under {work / 'src'} ...",
        file=sys.stderr,
        flush=True,
    )
    generate(work / "src", classes, files, payload=payload, seed=0, jobs=os.cpu_count() or 2)
    marker.touch()
    return True


def current_dataset(dataset: Path) -> bool:
    """Is ``dataset`` packed in the index format this dlfs mounts? A bench packs it again if not."""
    try:
        with open(dataset / fmt.INDEX_NAME, "rb") as f:
            fmt.index_header(f.read(fmt.HEADER_SIZE), str(dataset))
    except (OSError, DatasetError):
        return False
    return True


def ensure_packed(work: Path, files: int, classes: int, payload: str, dataset: Path, *flags: str) -> None:
    """``ensure_tree``'s tree packed into ``dataset`` (``dlfs pack`` with ``flags``): again whenever
    the tree was generated now or the dataset is not in this dlfs's index format."""
    if ensure_tree(work, files, classes, payload) or not current_dataset(dataset):
        command = [*DLFS, "-q", "pack", str(work / "src"), str(dataset), "--force", *flags]
        subprocess.run(command, check=True, capture_output=True)


def warm_storage(storage: Path) -> None:
    """Every byte of ``storage`` in the page cache: a file (an image), or every file under a folder
    (a tree, a dataset's shards), read in 8 MiB pieces so that no shard is held in memory whole."""
    paths = [storage] if storage.is_file() else [Path(d, n) for d, _, ns in os.walk(storage) for n in ns]
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.read(8 << 20):
                pass


def drop_caches() -> None:
    """Drop the page, dentry and inode caches (root only); the benchmark says so when it cannot."""
    bench.check_can_drop_caches()
    bench.drop_caches()


def can_drop_caches() -> bool:
    return os.access(bench.DROP_CACHES, os.W_OK)


rss_bytes = bench.proc_rss
imagefolder_scan = bench.imagefolder_scan


def find_count(root: str) -> int:
    out = subprocess.run(["find", root], capture_output=True, check=True).stdout
    return out.count(b"\n")


@contextmanager
def dlfs_mount(dataset: Path, mnt: Path, *extra: str) -> Iterator[tuple[int, float]]:
    """Mount with the real CLI; yield (daemon pid, seconds until the command returned)."""
    mnt.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    out = subprocess.run(
        [*DLFS, "mount", str(dataset), str(mnt), *extra], capture_output=True, text=True, check=True
    ).stdout
    took = time.perf_counter() - started
    pid = int(re.search(r"daemon pid (\d+)", out).group(1))  # type: ignore[union-attr]
    try:
        yield pid, took
    finally:
        try:
            unmount(str(mnt))
        except MountError:  # something still uses it: never leave a mount behind
            unmount(str(mnt), lazy=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            time.sleep(0.05)
