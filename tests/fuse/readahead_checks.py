"""What the read-ahead tests over a real mount share: class trees to pack, the published order, a
wait for the read-ahead to settle, pages held in or dropped from the kernel's page cache, and the
check that a read of an epoch was served from the page cache (``read_checked``)."""

from __future__ import annotations

import ctypes
import json
import mmap
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from mounts import counters_of, mount_stats
from waits import wait_for

from dlfs.core.libc import cachestat, in_memory
from dlfs.core.protocol import parse_order

#: The reading of an epoch, rank 0 of 1, as the read-ahead names it.
RANK_0 = "rank-0-of-1"


def published(mnt: Path, name: str) -> list[Path]:
    """The files of the published order ``name`` (``epoch-0``, ``epoch-1.rank-0-of-2``), in order."""
    return [mnt / path for path in parse_order((mnt / ".dlfs" / "order" / name).read_bytes())]


def wait_settled(mnt: Path, epoch: str, files: int) -> None:
    """Until the read-ahead of ``epoch`` (rank 0 of 1) has fetched all ``files`` and has nothing in
    flight."""

    def settled() -> bool:
        readahead = mount_stats(mnt)["readahead"]
        return readahead["readings"][f"{epoch}.{RANK_0}"]["fetched"] == files and not readahead["inflight"]

    what = f"the read-ahead of {epoch} to fetch its {files} files"
    wait_for(settled, what, counters_of(mnt), seen=lambda: json.dumps(mount_stats(mnt)["readahead"]))


def forget_everything(mnt: Path, forgets: int) -> None:
    """Have the kernel forget every entry and page, and wait until ``forgets`` FORGETs more have
    reached the daemon (its C threads gather them, apart from the reads)."""
    before = mount_stats(mnt)["requests"].get("forget", 0)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
    wait_for(
        lambda: mount_stats(mnt)["requests"].get("forget", 0) >= before + forgets,
        f"{forgets} FORGETs to reach the daemon after drop_caches",
        counters_of(mnt),
    )


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
def pinned(paths: list[Path]) -> Iterator[None]:
    """Keep these files' pages in the page cache while the block runs: each mapped and locked.

    This VM's DAMON ``pageout`` scheme reclaims unmapped page-cache pages of regions it has seen
    idle, sometimes pages just read (see ``uncached``); a test whose subject is what the kernel
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


def read_all(paths: list[Path]) -> list[bytes]:
    """Each file's bytes, read unbuffered in one go, as a loader reads a sample."""
    out = []
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            out.append(f.read())
    return out


def uncached(mnt: Path, paths: list[Path]) -> tuple[int, int]:
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


def read_checked(mnt: Path, paths: list[Path], files: int) -> tuple[list[bytes], dict, dict]:
    """Read ``paths`` in order (part of an epoch of ``files``) once the read-ahead has settled, and
    check that it did its job: every file but the sentinels (one in ``sentinel_every``) was pushed;
    when reading began the kernel lacked only those and files memory reclaim took since; and the
    files it lacked reached the daemon, with one READ more (the ``after`` snapshot itself) and at
    most one file in 100 besides: a full run now and then sees a file the kernel reported whole
    reach the daemon anyway (2 of 480 in one CI run), which reclaim between the question and the
    read would explain, though it is not shown. Returns the bytes read and the stats before and
    after."""
    lacking, reclaimed = uncached(mnt, paths)
    before = mount_stats(mnt)
    data = read_all(paths)
    after = mount_stats(mnt)
    reads = after["requests"].get("read", 0) - before["requests"].get("read", 0)
    sentinels = -(-files // after["readahead"]["sentinel_every"])
    detail = f"read-ahead {json.dumps(after['readahead'])}"  # a string: pytest shows it whole
    assert after["readahead"]["pushed_files"] >= files - sentinels, detail
    lacked = f"the kernel lacked {lacking} of {files} files, {reclaimed} reclaimed after caching; {detail}"
    assert lacking - reclaimed <= sentinels, lacked
    unexplained = reads - lacking - 1
    assert unexplained <= files // 100, f"{reads} of {files} read by the daemon, {lacking} lacking; {detail}"
    return data, before, after


def make_classes(root: Path, classes: int = 8, per_class: int = 60, size: int = 20_000) -> Path:
    """ImageNet-shaped class folders of random files, each a byte longer than the one before."""
    for c in range(classes):
        for k in range(per_class):
            path = root / f"n{c:08d}" / f"n{c:08d}_{k}.JPEG"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(os.urandom(size + k))
    return root


def epoch_read_ahead(
    dataset: Path, mount: Callable[..., AbstractContextManager[Path]], launcher: Sequence[str] = ()
) -> tuple[list[Path], list[bytes], dict]:
    """Mount ``dataset``, let the read-ahead fetch epoch 0 and read it, checked (``read_checked``).
    Returns the files in the order read (relative to the mount), their bytes and the stats after."""
    with mount(dataset, "--readahead-budget", "64M", launcher=launcher) as mnt:
        for path in mnt.rglob("*.JPEG"):  # the kernel must know an inode before pages can be pushed to it
            path.stat()
        paths = published(mnt, "epoch-0")
        wait_settled(mnt, "epoch-0", len(paths))
        data, _, after = read_checked(mnt, paths, len(paths))
    return [path.relative_to(mnt) for path in paths], data, after
