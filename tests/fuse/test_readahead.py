"""The read-ahead engine over a real mount: it follows the published order, pushes into the page
cache, stays inside its budget, and changes nothing about the bytes a reader gets (tests/readahead
drives it without a mount)."""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import random
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import dlfs, drop_from_memory, wait_until

from dlfs.core.libc import cached_pages, cachestat, in_memory
from dlfs.core.protocol import parse_order


def _stats(mnt: Path) -> dict:
    return json.loads((mnt / ".dlfs" / "stats").read_text())


def _published(mnt: Path, name: str) -> list[Path]:
    return [mnt / path for path in parse_order((mnt / ".dlfs" / "order" / name).read_bytes())]


def _settled(mnt: Path, epoch: str, files: int) -> Callable[[], bool]:
    """The read-ahead of ``epoch`` (rank 0 of 1) has fetched all ``files`` and has nothing in flight."""

    def settled() -> bool:
        readahead = _stats(mnt)["readahead"]
        return readahead["readings"][f"{epoch}.rank-0-of-1"]["fetched"] == files and not readahead["inflight"]

    return settled


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.mlock.argtypes = _libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


@contextmanager
def _pinned(paths: list[Path]) -> Iterator[None]:
    """Keep these files' pages in the page cache while the block runs: each mapped and locked.

    This VM's DAMON ``pageout`` scheme reclaims unmapped page-cache pages of regions it has seen
    idle, sometimes pages just read (see ``_lacking``); a test whose subject is what the kernel
    already holds pins what it read, so the kernel holds exactly that.
    """
    maps: list[tuple[int, int]] = []
    try:
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            try:
                size = os.fstat(fd).st_size
                address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
                if address in (None, ctypes.c_void_p(-1).value):
                    raise OSError(ctypes.get_errno(), f"mmap {path}")
                maps.append((address, size))
                if _libc.mlock(address, size) != 0:
                    raise OSError(ctypes.get_errno(), f"mlock {path}")
            finally:
                os.close(fd)
        yield
    finally:
        for address, size in maps:
            _libc.munmap(address, size)


def _read_all(paths: list[Path]) -> list[bytes]:
    out = []
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            out.append(f.read())
    return out


def _lacking(mnt: Path, paths: list[Path]) -> tuple[int, int]:
    """Files of ``paths`` the kernel does not hold whole in its page cache now, and how many of
    those lost pages to memory reclaim after they were cached (asked with ``cachestat``; opening
    a file sends no READ).

    The sentinels are among the first figure, and so may be files the read-ahead pushed: this VM
    runs a DAMON ``pageout`` scheme that reclaims page-cache pages in physical regions it has seen
    idle for a minute, and a page just pushed into such a region can go with them. Reclaim leaves
    a shadow entry for each page it takes, which ``cachestat`` counts, so the second figure tells
    those files apart from files that were never cached. (Every caller's files start without
    shadow entries: a fresh mount's inodes, or new ones after ``drop_caches`` forgot the old.)
    """
    lacking = reclaimed = 0
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            held = in_memory(fd, 0, size)  # the question the read-ahead asks (MountPageCache.holds)
            assert held is not None, "cachestat: Linux >= 6.5"
            if not held:
                lacking += 1
                reclaimed += cachestat(fd, size).evicted > 0  # type: ignore[union-attr]
        finally:
            os.close(fd)
    return lacking, reclaimed


def _read_checked(mnt: Path, paths: list[Path], files: int) -> tuple[list[bytes], dict, dict]:
    """Read ``paths`` in order (part of an epoch of ``files``) once the read-ahead has settled, and
    check that it did its job: every file but the sentinels (one in ``sentinel_every``) was pushed;
    when reading began the kernel lacked only those and files memory reclaim took since; and the
    files it lacked reached the daemon, with one READ more (the ``after`` snapshot itself) and at
    most one file in 100 besides: a full run now and then sees a file the kernel reported whole
    reach the daemon anyway (2 of 480 in one CI run), which reclaim between the question and the
    read would explain, though it is not shown. Returns the bytes read and the stats before and
    after."""
    lacking, reclaimed = _lacking(mnt, paths)
    before = _stats(mnt)
    data = _read_all(paths)
    after = _stats(mnt)
    reads = after["requests"].get("read", 0) - before["requests"].get("read", 0)
    sentinels = -(-files // after["readahead"]["sentinel_every"])
    detail = f"read-ahead {json.dumps(after['readahead'])}"  # a string: pytest shows it whole
    assert after["readahead"]["pushed_files"] >= files - sentinels, detail
    lacked = f"the kernel lacked {lacking} of {files} files, {reclaimed} reclaimed after caching; {detail}"
    assert lacking - reclaimed <= sentinels, lacked
    unexplained = reads - lacking - 1
    assert unexplained <= files // 100, f"{reads} of {files} read by the daemon, {lacking} lacking; {detail}"
    return data, before, after


def _make_classes(root: Path, classes: int = 8, per_class: int = 60, size: int = 20_000) -> Path:
    for c in range(classes):
        for k in range(per_class):
            path = root / f"n{c:08d}" / f"n{c:08d}_{k}.JPEG"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(os.urandom(size + k))
    return root


def _epoch_read_ahead(
    dataset: Path, mount, launcher: Sequence[str] = ()
) -> tuple[list[Path], list[bytes], dict]:
    """Mount ``dataset``, let the read-ahead fetch epoch 0 and read it, checked (``_read_checked``).
    Returns the files in the order read (relative to the mount), their bytes and the stats after."""
    with mount(dataset, "--readahead-budget", "64M", launcher=launcher) as mnt:
        mnt = Path(mnt)
        for path in mnt.rglob("*.JPEG"):  # the kernel must know an inode before pages can be pushed to it
            path.stat()
        paths = _published(mnt, "epoch-0")
        assert wait_until(_settled(mnt, "epoch-0", len(paths)), 30), "the read-ahead never fetched the epoch"
        data, _, after = _read_checked(mnt, paths, len(paths))
    return [path.relative_to(mnt) for path in paths], data, after


@pytest.mark.parametrize("filesystem", ["on_disk", "in_tmpfs"])
def test_reads_in_published_order_are_served_from_the_page_cache(
    filesystem: str, request: pytest.FixtureRequest, mount
) -> None:
    """Also from a dataset on tmpfs, which refuses the C loop's reads that must not wait."""
    root: Path = request.getfixturevalue(filesystem)
    src = _make_classes(root / "src")
    dlfs("pack", src, root / "ds", "--shard-size", "1M")
    paths, data, after = _epoch_read_ahead(root / "ds", mount)
    assert data == [(src / path).read_bytes() for path in paths]
    readahead = after["readahead"]
    assert readahead["storage_reads"] < readahead["issued_files"], "neighbours share a storage read"


def test_an_in_place_dataset_is_read_ahead_from_its_tar_cold(on_disk: Path, mount) -> None:
    """``dlfs pack --in-place``: the shards are windows of the tar, which the C loop reads at each
    window's base, here directly (O_DIRECT) from a tar not in memory, at offsets the base leaves
    unaligned."""
    src = _make_classes(on_disk / "src")
    tar = on_disk / "src.tar"
    subprocess.run(["tar", "-cf", tar, "-C", src, "."], check=True, timeout=60)
    dlfs("pack", "--in-place", tar, on_disk / "ds")
    drop_from_memory(tar)
    paths, data, after = _epoch_read_ahead(on_disk / "ds", mount)
    assert data == [(src / path).read_bytes() for path in paths]
    assert after["readahead"]["cold_batches"] >= 1, after["readahead"]


WITHOUT_CACHESTAT = [sys.executable, str(Path(__file__).with_name("without_cachestat.py"))]


def test_without_cachestat_files_are_read_ahead_and_answered_natively(on_disk: Path, mount) -> None:
    """A kernel before 6.5 (those of most clusters) has no cachestat, which the read-ahead and the
    native request server ask before reading: a seccomp filter takes it away here. The read-ahead
    then asks with reads that must not wait (on a disk, which takes them), and the native server
    reads on."""
    probe = "import os; from dlfs.core.libc import cachestat; print(cachestat(os.open('/', os.O_RDONLY), 1))"
    asked = subprocess.run([*WITHOUT_CACHESTAT, sys.executable, "-c", probe], capture_output=True, text=True)
    assert asked.stdout.strip() == "None", asked  # the filter works: no cachestat in what it starts
    src = _make_classes(on_disk / "src")
    dlfs("pack", src, on_disk / "ds", "--shard-size", "1M")
    paths, data, _ = _epoch_read_ahead(on_disk / "ds", mount, launcher=WITHOUT_CACHESTAT)
    assert data == [(src / path).read_bytes() for path in paths]
    shuffled = random.Random(0).sample(paths, len(paths))
    with mount(on_disk / "ds", "--readahead-budget", "0", launcher=WITHOUT_CACHESTAT) as mnt:
        mnt = Path(mnt)
        again = _read_all([mnt / p for p in shuffled])
        native = _stats(mnt)["native"]
    assert again == [(src / p).read_bytes() for p in shuffled]
    assert native["answered"].get("read", 0) >= len(paths), json.dumps(native)


def test_read_ahead_stays_within_its_budget(tmp_path: Path, mount) -> None:
    src = _make_classes(tmp_path / "src", classes=4, per_class=100, size=50_000)
    dlfs("pack", src, tmp_path / "ds")
    budget = 1 << 20
    with mount(tmp_path / "ds", "--readahead-budget", str(budget), "--readahead-inflight", "2") as mnt:
        mnt = Path(mnt)
        paths = _published(mnt, "epoch-1.rank-0-of-2")
        for k in range(0, len(paths), 25):
            _read_all(paths[k : k + 25])
            reading = _stats(mnt)["readahead"]["readings"]["epoch-1.rank-0-of-2"]
            assert reading["lead_bytes"] <= budget + 50_100, "at most one file beyond the budget"
            assert reading["fetched"] <= min(len(paths), k + 25 + budget // 50_000 + 1)


def test_without_a_published_order_nothing_is_read_ahead(packed: Path, odd_tree: Path, mount) -> None:
    with mount(packed) as mnt:
        mnt = Path(mnt)
        for path in sorted(mnt.glob("many/*.dat"), reverse=True):
            assert path.read_bytes() == (odd_tree / path.relative_to(mnt)).read_bytes()
        assert _stats(mnt)["readahead"]["issued_files"] == 0


def test_restarting_an_epoch_is_followed(tmp_path: Path, mount) -> None:
    src = _make_classes(tmp_path / "src", classes=2, per_class=150, size=4000)
    dlfs("pack", src, tmp_path / "ds")
    with mount(tmp_path / "ds", "--readahead-budget", "200K") as mnt:
        mnt = Path(mnt)
        paths = _published(mnt, "epoch-0")
        _read_all(paths[:250])
        Path("/proc/sys/vm/drop_caches").write_text("3\n")  # forget the pages: the restart must refetch
        _read_all(paths[:30])
        stats = _stats(mnt)["readahead"]
        assert stats["restarts"] >= 1


def test_read_ahead_off_still_reads_correctly(packed: Path, odd_tree: Path, mount) -> None:
    with mount(packed, "--readahead-budget", "0") as mnt:
        mnt = Path(mnt)
        for path in _published(mnt, "epoch-0"):
            assert path.read_bytes() == (odd_tree / path.relative_to(mnt)).read_bytes()
        assert _stats(mnt)["readahead"] is None


def test_interleaved_workers_are_one_reader_not_restarts(tmp_path: Path, mount) -> None:
    """8 workers taking files k, k+8, ... never keep step; that must not look like restarts or skips.

    Like DataLoader workers, they drift apart only so far: the loader hands each worker its next
    indices as batches are consumed in order (at most workers x prefetch_factor batches out). Here
    a barrier every 16 files per worker bounds the drift to 128 positions, less than the 1 MiB
    window (333 files). Free-running threads drifted a window apart on a loaded machine, which is
    exactly what an epoch restart looks like.
    """
    from concurrent.futures import ThreadPoolExecutor

    in_step = threading.Barrier(8, timeout=60)

    def worker(share: list[Path]) -> list[bytes]:
        out = []
        for k in range(0, len(share), 16):
            in_step.wait()
            out += _read_all(share[k : k + 16])
        return out

    src = _make_classes(tmp_path / "src", classes=4, per_class=200, size=3000)
    dlfs("pack", src, tmp_path / "ds")
    with mount(tmp_path / "ds", "--readahead-budget", "1M", "--cache-size", "1M") as mnt:
        mnt = Path(mnt)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")  # the kernel knows no file: every push lists first
        paths = _published(mnt, "epoch-0")
        with ThreadPoolExecutor(8) as pool:
            shares = list(pool.map(worker, [paths[k::8] for k in range(8)]))
        # The read-ahead may finish its last batches after the readers are done.
        assert wait_until(lambda: not _stats(mnt)["readahead"]["inflight"], 30)
        stats = _stats(mnt)
    assert sorted(b for share in shares for b in share) == sorted(
        _read_all([src / p.relative_to(mnt) for p in paths])
    )
    assert stats["readahead"]["restarts"] == 0 and stats["readahead"]["misses_ahead"] == 0, json.dumps(stats)
    readahead = stats["readahead"]
    # Each file is fetched ahead once, or skipped because a worker already read it into the kernel.
    assert readahead["issued_files"] + readahead["already_cached"] == len(paths), json.dumps(readahead)


def test_files_the_kernel_already_caches_are_not_pushed_again(tmp_path: Path, mount) -> None:
    src = _make_classes(tmp_path / "src", classes=4, per_class=100, size=20_000)
    dlfs("pack", src, tmp_path / "ds")
    with mount(tmp_path / "ds", "--readahead-budget", "64M") as mnt:
        mnt = Path(mnt)
        first = _published(mnt, "epoch-0")
        _read_all(first)
        with _pinned(first):  # every file now sits in the mount's page cache, and stays there
            assert _lacking(mnt, first) == (0, 0)
            before = _stats(mnt)["readahead"]
            second = _published(mnt, "epoch-1")  # a new epoch: its read-ahead starts at once
            assert wait_until(_settled(mnt, "epoch-1", len(second)), 30)
            after = _stats(mnt)["readahead"]
            data = _read_all(second)
    assert data == [(src / p.relative_to(mnt)).read_bytes() for p in second]
    assert after["already_cached"] - before["already_cached"] >= 0.9 * len(second)
    assert after["pushed_files"] - before["pushed_files"] <= 0.05 * len(second), "nothing copied twice"


def test_files_never_looked_up_are_pushed_after_listing_their_directory(tmp_path: Path, mount) -> None:
    """A cold start: the kernel knows no inode, so a push is refused until the directory is listed."""
    src = _make_classes(tmp_path / "src", classes=4, per_class=50, size=20_000)
    dlfs("pack", src, tmp_path / "ds")
    with mount(tmp_path / "ds", "--readahead-budget", "64M") as mnt:
        mnt = Path(mnt)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        paths = _published(mnt, "epoch-0")
        assert wait_until(_settled(mnt, "epoch-0", len(paths)), 30)
        data, before, after = _read_checked(mnt, paths, len(paths))
    assert data == [(src / p.relative_to(mnt)).read_bytes() for p in paths]
    readahead = after["readahead"]
    assert readahead["revealed_dirs"] >= 4 and readahead["push_refused"] == 0, readahead
    assert after["requests"]["lookup"] - before["requests"]["lookup"] <= 4, "the listing made the entries"


@pytest.mark.parametrize(
    ("readdirplus", "scanned", "in_background", "by_read_ahead"),
    [("always", 4, 0, 0), ("auto", 4, 4, 0), ("auto", 3, 0, 4)],
)
def test_entries_a_scan_listed_are_pushed(
    tmp_path: Path, mount, readdirplus: str, scanned: int, in_background: int, by_read_ahead: int
) -> None:
    """A training job scans its classes first (ImageFolder). With ``--readdirplus always`` those
    listings carry attributes, so the kernel knows every inode and the read-ahead pushes at once.
    With ``auto`` they give files none, and the kernel keeps the listings: once the scan has listed
    every folder, the daemon lists them all again with attributes in the background, before any
    epoch. After a partial scan it does not, and the read-ahead drops and lists each folder again
    itself, once, with attributes (the unscanned one too: the kernel knows none of its files)."""
    src = _make_classes(tmp_path / "src", classes=4, per_class=50, size=20_000)
    dlfs("pack", src, tmp_path / "ds")
    with mount(tmp_path / "ds", "--readahead-budget", "64M", "--readdirplus", readdirplus) as mnt:
        mnt = Path(mnt)
        for class_dir in sorted(os.scandir(mnt), key=lambda entry: entry.name)[:scanned]:
            list(os.scandir(class_dir.path))
        assert wait_until(lambda: _stats(mnt)["listed_folders"] == in_background, 15)
        assert wait_until(lambda: _stats(mnt)["listing_folders"] == 0, 15)
        paths = _published(mnt, "epoch-0")
        assert wait_until(_settled(mnt, "epoch-0", len(paths)), 30)
        data = _read_all(paths)
        stats = _stats(mnt)
    readahead = stats["readahead"]
    assert data == [(src / p.relative_to(mnt)).read_bytes() for p in paths]
    assert stats["listed_folders"] == in_background, stats
    assert readahead["revealed_dirs"] == by_read_ahead and readahead["push_refused"] == 0, readahead
    assert readahead["pushed_files"] > 0.95 * len(paths), readahead


def test_a_scan_after_the_kernel_forgot_the_tree_is_a_plain_one_again(tmp_path: Path, mount) -> None:
    """Under ``auto`` the background listing wants every file's attributes; once the kernel forgot
    the tree, the next scan gets plain listings again (and the background listing follows it), not
    listings with attributes that would make the scanner build every inode as ``always`` does."""
    src = _make_classes(tmp_path / "src", classes=4, per_class=50, size=1_000)
    dlfs("pack", src, tmp_path / "ds")
    with mount(tmp_path / "ds", "--readdirplus", "auto") as mnt:
        mnt = Path(mnt)
        for scan in (1, 2):
            for class_dir in sorted(os.scandir(mnt), key=lambda entry: entry.name):
                list(os.scandir(class_dir.path))
            assert wait_until(lambda n=4 * scan: _stats(mnt)["listed_folders"] == n, 15), _stats(mnt)
            assert wait_until(lambda: _stats(mnt)["listing_folders"] == 0, 15)
            forgets = _stats(mnt)["requests"].get("forget", 0)
            Path("/proc/sys/vm/drop_caches").write_text("3\n")
            assert wait_until(lambda n=forgets + 200: _stats(mnt)["requests"].get("forget", 0) >= n, 15)


def test_pages_dropped_by_the_kernel_are_fetched_again(tmp_path: Path, mount) -> None:
    """Pushed files the kernel forgets before the reader comes (memory pressure) are pushed again."""
    src = _make_classes(tmp_path / "src", classes=4, per_class=50, size=20_000)
    dlfs("pack", src, tmp_path / "ds")
    with mount(tmp_path / "ds", "--readahead-budget", "64M") as mnt:
        mnt = Path(mnt)
        paths = _published(mnt, "epoch-0")
        assert wait_until(_settled(mnt, "epoch-0", len(paths)), 30)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        assert wait_until(lambda: _stats(mnt)["readahead"]["forgotten_ahead"] > 0, 15), "no forget seen"
        assert wait_until(_settled(mnt, "epoch-0", len(paths)), 30)
        data, _, _ = _read_checked(mnt, paths, len(paths))
    assert data == [(src / p.relative_to(mnt)).read_bytes() for p in paths]


def _drop_caches(mnt: Path, times: int) -> None:
    """Have the kernel forget every entry and page, ``times`` times, each time until the FORGETs
    of the mount's files have reached the daemon."""
    for _ in range(times):
        forgets = _stats(mnt)["requests"].get("forget", 0)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        assert wait_until(lambda n=forgets + 100: _stats(mnt)["requests"].get("forget", 0) >= n, 15)


def test_an_abandoned_reading_pauses_until_its_reader_reads_again(tmp_path: Path, mount) -> None:
    """A job that stops mid-epoch: once its reader is quiet for ``--readahead-pause``, its reading
    shows paused, and evictions fetch nothing again; the reader's next read resumes the read-ahead
    from there."""
    src = _make_classes(tmp_path / "src", classes=4, per_class=150, size=20_000)
    dlfs("pack", src, tmp_path / "ds")
    with mount(tmp_path / "ds", "--readahead-budget", "2M", "--readahead-pause", "2") as mnt:
        mnt = Path(mnt)
        paths = _published(mnt, "epoch-0")
        _read_all(paths[:100])
        assert wait_until(lambda: _stats(mnt)["readahead"]["readings"]["epoch-0.rank-0-of-1"]["paused"], 15)
        paused = _stats(mnt)["readahead"]
        assert paused["paused_readings"] == 1 and paused["pauses"] == 1, json.dumps(paused)
        _drop_caches(mnt, 5)
        assert wait_until(lambda: not _stats(mnt)["readahead"]["inflight"], 15)
        evicted = _stats(mnt)["readahead"]
        assert evicted["forgotten_ahead"] > 0, "the engine saw the window forgotten"
        assert evicted["issued_files"] == paused["issued_files"], json.dumps(evicted)
        assert _read_all(paths[100:101]) == [(src / paths[100].relative_to(mnt)).read_bytes()]
        assert wait_until(lambda: _stats(mnt)["readahead"]["resumes"] == 1, 15)
        # The budget holds 100 files: most of them are fetched ahead of the reader again.
        assert wait_until(lambda: _stats(mnt)["readahead"]["pushed_files"] >= paused["pushed_files"] + 50, 15)
        assert _stats(mnt)["readahead"]["readings"]["epoch-0.rank-0-of-1"]["cursor"] == 100


def test_block_order_runs_are_read_whole_from_a_wide_window(tmp_path: Path, mount) -> None:
    """A window of many runs spreads each run's files over the window; the read-ahead still reads a
    run with one storage request instead of one per file."""
    src = _make_classes(tmp_path / "src", classes=6, per_class=100, size=150_000)
    dlfs("pack", src, tmp_path / "ds")
    flags = ("--order", "block", "--block", "20", "--window", "300", "--readahead-budget", "64M")
    with mount(tmp_path / "ds", *flags) as mnt:
        mnt = Path(mnt)
        paths = _published(mnt, "epoch-0")
        data = _read_all(paths)
        readahead = _stats(mnt)["readahead"]
    assert data == [(src / p.relative_to(mnt)).read_bytes() for p in paths]
    assert readahead["issued_files"] >= 0.9 * len(paths), readahead
    assert readahead["storage_reads"] <= len(paths) // 5, f"{readahead['storage_reads']} reads for 30 runs"


def test_a_pass_after_the_kernel_forgot_everything_is_pushed_again(tmp_path: Path, mount) -> None:
    """``drop_caches`` between two passes over one epoch: the second restarts the read-ahead, which
    must list the directories again (the kernel forgot every entry) to push anything."""
    src = _make_classes(tmp_path / "src", classes=4, per_class=100, size=20_000)
    dlfs("pack", src, tmp_path / "ds")
    with mount(tmp_path / "ds", "--readahead-budget", "64M") as mnt:
        mnt = Path(mnt)
        paths = _published(mnt, "epoch-0")
        assert wait_until(_settled(mnt, "epoch-0", len(paths)), 30)
        _read_all(paths)
        forgets = _stats(mnt)["requests"].get("forget", 0)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        # The FORGETs reach the daemon apart from the reads (its C threads gather them): a training
        # job's next epoch starts long after; here, let them arrive before the restart.
        assert wait_until(lambda: _stats(mnt)["requests"].get("forget", 0) >= forgets + len(paths), 15)
        restarts = _stats(mnt)["readahead"]["restarts"]
        data = _read_all(paths[:1])  # the first file is a sentinel: reading it restarts the epoch
        assert wait_until(_settled(mnt, "epoch-0", len(paths)), 30)
        rest, before, _ = _read_checked(mnt, paths[1:], len(paths))
    assert data + rest == [(src / p.relative_to(mnt)).read_bytes() for p in paths]
    assert before["readahead"]["restarts"] == restarts + 1


def test_an_epoch_from_cold_storage_is_read_past_the_shards_page_cache(on_disk: Path, mount) -> None:
    """Shards not in memory: the C loop reads them directly (O_DIRECT), so the files arrive intact
    and the dataset is cached once, in the mount, instead of twice (the shards too)."""
    src = _make_classes(on_disk / "src", classes=4, per_class=100, size=50_000)
    dlfs("pack", src, on_disk / "ds")
    shards = sorted((on_disk / "ds").glob("*.shard"))
    with mount(on_disk / "ds") as mnt:
        mnt = Path(mnt)
        for shard in shards:
            drop_from_memory(shard)
        paths = _published(mnt, "epoch-0")
        assert wait_until(_settled(mnt, "epoch-0", len(paths)), 30), "the read-ahead never fetched the epoch"
        cached = 0
        for shard in shards:
            fd = os.open(shard, os.O_RDONLY)
            cached += cached_pages(fd, shard.stat().st_size) * 4096
            os.close(fd)
        data = _read_all(paths)
        readahead = _stats(mnt)["readahead"]
    assert data == [(src / p.relative_to(mnt)).read_bytes() for p in paths]
    assert readahead["cold_batches"] >= 1 and readahead["pushed_files"] > 0.9 * len(paths), readahead
    # What did go through the page cache: the sentinels, one probe read per batch.
    assert cached < 0.1 * sum(shard.stat().st_size for shard in shards), (cached, json.dumps(readahead))
