"""The read-ahead's C loop (``dlfs/readahead/_push.c``) against its contract, without a mount.

A pipe stands in for ``/dev/fuse``: every FUSE_NOTIFY_STORE message the loop writes can be read back
and taken apart, so the tests see exactly what the kernel would be told.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import xxhash
from page_cache import drop_from_memory

from dlfs.core.libc import cached_pages
from dlfs.readahead.native import LIBRARY, NativePusher

NOTIFY_STORE = 4
HEADER = struct.Struct("<IiQ")  # struct fuse_out_header: len, error (the notify code), unique
STORE = struct.Struct("<QQII")  # struct fuse_notify_store_out: nodeid, offset, size, padding
FIRST_INODE = 1
PIPE = 1 << 20  # /proc/sys/fs/pipe-max-size by default; the messages of a call take ~400 KB

#: Payloads of one shard, in storage order: small, empty, over a page, odd sizes, one large.
PAYLOADS = [os.urandom(n) for n in (100, 0, 5000, 4097, 70_001, 1, 300_000)]


@pytest.fixture
def kernel() -> Iterator[tuple[int, int]]:
    """(read end, write end) of a pipe as large as a call's messages."""
    assert LIBRARY.exists(), "make install builds dlfs/readahead/_push.so"
    out, into = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    fcntl.fcntl(into, fcntl.F_SETPIPE_SZ, PIPE)
    try:
        yield out, into
    finally:
        os.close(out)
        os.close(into)


def _messages(out: int) -> list[tuple[int, bytes]]:
    """(inode, data) of every message written so far; each must be a whole-file store at 0."""
    stream = b""
    while True:
        try:
            stream += os.read(out, PIPE)
        except BlockingIOError:
            break
    messages = []
    while stream:
        length, code, unique = HEADER.unpack_from(stream)
        nodeid, offset, size, _ = STORE.unpack_from(stream, HEADER.size)
        assert (code, unique, offset) == (NOTIFY_STORE, 0, 0)
        assert length == HEADER.size + STORE.size + size <= len(stream)
        messages.append((nodeid, stream[HEADER.size + STORE.size : length]))
        stream = stream[length:]
    return messages


class Shard:
    """The payloads written one after another into a file, with the arrays the loop takes."""

    def __init__(self, path: Path, gap: int = 0) -> None:
        self.path = path
        self.offsets = np.zeros(len(PAYLOADS), dtype=np.int64)
        with open(path, "wb") as f:
            for i, data in enumerate(PAYLOADS):
                f.write(os.urandom(gap))
                self.offsets[i] = f.tell()
                f.write(data)
        self.lengths = np.array([len(p) for p in PAYLOADS], dtype=np.int64)
        self.checksums = np.array([xxhash.xxh3_64_intdigest(p) for p in PAYLOADS], dtype=np.uint64)
        self.fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM)  # as the store opens shards for a mount
        self.direct_fd = os.open(path, os.O_RDONLY | os.O_DIRECT)

    def reads(self, groups: list[list[int]]) -> tuple[np.ndarray, ...]:
        """One read per group of neighbouring files (given in storage order)."""
        starts = np.array([self.offsets[g[0]] for g in groups], dtype=np.int64)
        stops = np.array([self.offsets[g[-1]] + self.lengths[g[-1]] for g in groups], dtype=np.int64)
        n = len(groups)
        return (
            np.full(n, self.fd),
            np.full(n, self.direct_fd),
            starts,
            stops - starts,
            np.cumsum([len(g) for g in groups]),
        )

    def close(self) -> None:
        os.close(self.fd)
        os.close(self.direct_fd)


@pytest.fixture
def shard(on_disk: Path) -> Iterator[Shard]:
    shard = Shard(on_disk / "shard", gap=1000)
    yield shard
    shard.close()


def _push(
    pusher: NativePusher,
    shard: Shard,
    groups: list[list[int]],
    rows: np.ndarray,
    direct_fds: list[int] | None = None,
) -> tuple[np.ndarray, bool]:
    reads = shard.reads(groups)
    if direct_fds is not None:
        reads = (reads[0], np.array(direct_fds), *reads[2:])
    order = [i for g in groups for i in g]
    files = (shard.offsets[order], shard.lengths[order], shard.checksums[order], rows)
    buffer = np.empty(NativePusher.buffer_size(reads[2], reads[3]), dtype=np.uint8)
    return pusher.push(buffer, reads, files)


GROUPS = [[0, 1, 2], [3], [4, 5], [6]]


def test_every_file_is_pushed_whole_as_its_inode(kernel: tuple[int, int], shard: Shard) -> None:
    pusher = NativePusher(kernel[1], FIRST_INODE)
    rows = np.arange(10, 10 + len(PAYLOADS))
    status, direct = _push(pusher, shard, GROUPS, rows)
    assert status.tolist() == [0] * len(PAYLOADS) and not direct
    expected = [(row + FIRST_INODE, data) for row, data in zip(rows.tolist(), PAYLOADS, strict=True) if data]
    assert _messages(kernel[0]) == expected  # an empty file needs no pages


def test_a_damaged_file_is_refused_and_the_others_go_on(kernel: tuple[int, int], shard: Shard) -> None:
    pusher = NativePusher(kernel[1], FIRST_INODE)
    shard.checksums[2] ^= 1
    status, _ = _push(pusher, shard, GROUPS, np.arange(len(PAYLOADS)))
    assert status.tolist() == [0, 0, errno.EIO, 0, 0, 0, 0]
    assert [inode for inode, _ in _messages(kernel[0])] == [1, 4, 5, 6, 7]


def test_a_file_past_the_end_of_its_shard_fails_with_eio(kernel: tuple[int, int], shard: Shard) -> None:
    os.truncate(shard.path, int(shard.offsets[6]) + 10)
    status, _ = _push(NativePusher(kernel[1], FIRST_INODE), shard, GROUPS, np.arange(len(PAYLOADS)))
    assert status.tolist() == [0, 0, 0, 0, 0, 0, errno.EIO]


def test_files_without_a_row_are_checked_but_not_pushed(kernel: tuple[int, int], shard: Shard) -> None:
    rows = np.array([0, -1, 2, -1, 4, 5, 6])
    shard.checksums[3] ^= 1
    status, _ = _push(NativePusher(kernel[1], FIRST_INODE), shard, GROUPS, rows)
    assert status.tolist() == [0, 0, 0, errno.EIO, 0, 0, 0]
    assert [inode for inode, _ in _messages(kernel[0])] == [1, 3, 5, 6, 7]


def test_cold_storage_is_read_directly_and_stays_out_of_the_page_cache(
    kernel: tuple[int, int], shard: Shard
) -> None:
    pusher = NativePusher(kernel[1], FIRST_INODE)
    rows = np.arange(len(PAYLOADS))
    drop_from_memory(shard.path)
    status, direct = _push(pusher, shard, GROUPS, rows)
    assert direct and status.tolist() == [0] * len(PAYLOADS)
    assert _messages(kernel[0]) == [(row + 1, data) for row, data in enumerate(PAYLOADS) if data]
    # Nothing went through the page cache: the shard's stays (almost) empty.
    first_read, everything = (-(-n // 4096) for n in (int(shard.offsets[3]), os.path.getsize(shard.path)))
    assert cached_pages(shard.fd, os.path.getsize(shard.path)) <= first_read < everything // 10


def test_reads_the_page_cache_holds_skip_the_disk_in_a_cold_call(
    kernel: tuple[int, int], shard: Shard
) -> None:
    """A read goes where its bytes are. A call used to read everything after its first cold read
    directly: a few pages missing from a warm shard sent hundreds of cached files to the disk."""
    # Reading the cached ones directly would read a decoy: every byte flipped, every file damaged.
    decoy = shard.path.with_name("decoy")
    decoy.write_bytes(bytes(b ^ 0xFF for b in shard.path.read_bytes()))
    drop_from_memory(shard.path)
    for group in GROUPS[1], GROUPS[3]:  # the second and the last read are cached, the others not
        os.pread(shard.fd, int(shard.lengths[group[0]]), int(shard.offsets[group[0]]))
    decoy_fd = os.open(decoy, os.O_RDONLY | os.O_DIRECT)
    try:
        direct_fds = [shard.direct_fd, decoy_fd, shard.direct_fd, decoy_fd]
        status, direct = _push(
            NativePusher(kernel[1], FIRST_INODE), shard, GROUPS, np.arange(len(PAYLOADS)), direct_fds
        )
    finally:
        os.close(decoy_fd)
    assert direct and status.tolist() == [0] * len(PAYLOADS)
    assert sorted(_messages(kernel[0])) == sorted(
        (row + 1, data) for row, data in enumerate(PAYLOADS) if data
    )


def test_storage_that_turns_slow_midway_is_read_directly_from_there(
    kernel: tuple[int, int], shard: Shard
) -> None:
    drop_from_memory(shard.path)
    os.pread(shard.fd, int(shard.lengths[:3].sum()) + 2000, int(shard.offsets[0]))  # the first read is cached
    status, direct = _push(NativePusher(kernel[1], FIRST_INODE), shard, GROUPS, np.arange(len(PAYLOADS)))
    assert direct and status.tolist() == [0] * len(PAYLOADS)
    assert [data for _, data in _messages(kernel[0])] == [p for p in PAYLOADS if p]
