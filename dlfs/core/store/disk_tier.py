"""The disk tier: ranges of a remote store's shards kept in a local directory (``--disk-tier``).

An object store answers a GET in milliseconds; a local disk in microseconds. Shards are cached in
aligned blocks of ``BLOCK`` bytes. Each shard the tier holds blocks of is one sparse file
(``shards/<shard name>``) at the shard's own offsets, with a map beside it (``<name>.map``, one
byte per block, set once the block is written whole). Same offsets, so a span of cached blocks is
one ``pread``, and the read-ahead's C loop reads such spans itself through the file's descriptor
(``local_descriptor``), as from a local dataset: a later epoch read from the tier runs nearly as
fast as from local shards, where reading the tier through Python would not (docs/benchmarks.md).
A read takes what it can from the file and fetches each run of missing blocks from the store in
one ranged GET (the read-ahead asks for megabytes of neighbouring files at once; a lone file of a
shuffled read costs at most two blocks). Shard names carry the dataset id, so a remount of the same
dataset finds its blocks again, and another dataset's never match.

The budget is kept by evicting the least recently used blocks (their range punched back into a
hole, their mark cleared); blocks being written hold their room, so threads filling the tier at
once never overrun it together. The order lives in memory (about 150 bytes per block, 150 MB per TB
of cache) and a remount starts from the maps' order, not the last one. A block is marked only after
its bytes are written, so a crash leaves it unmarked (fetched again) or, after a power loss, marked
with bytes that fail their file's checksum (as may a read racing the eviction of its block, which
then reads the hole's zeros): every byte is checked by its reader, and a mismatch in
bytes from here makes ``FileBytes`` ``forget`` them and read the store again (``dlfs.core.file_bytes``),
so damage costs one refetch, never a wrong byte. One mount uses a cache directory at a time (a
lock): two would each keep their own budget and evict each other's blocks unknowingly.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import threading
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

from dlfs.core.errors import StoreError
from dlfs.core.format import IN_PLACE_SUFFIX, SHARD_SUFFIX
from dlfs.core.libc import punch_hole
from dlfs.core.store.interface import ShardWriter, Store

log = logging.getLogger(__name__)

#: Cache granularity. Large enough that the read-ahead's spans are a few blocks and the in-memory
#: LRU stays small; small enough that a shuffled read of one 110 KB file fetches at most 2 MiB.
BLOCK = 1 << 20
#: Share of the free space a cache directory takes when no ``--disk-tier-size`` is given.
DEFAULT_SHARE = 0.8
MAP_SUFFIX = ".map"
#: What the tier keeps blocks of: shards, an in-place dataset's too (those lie in its objects); the
#: index has a local copy of its own.
TIERED = (SHARD_SUFFIX, IN_PLACE_SUFFIX)

Key = tuple[str, int]


def default_budget(directory: Path) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    return int(shutil.disk_usage(directory).free * DEFAULT_SHARE)


def _within(number: int, start: int, end: int) -> tuple[int, int]:
    """The part of bytes ``start``..``end`` of an object that block ``number`` holds, as offsets
    into the block."""
    base = number * BLOCK
    return max(start, base) - base, min(end, base + BLOCK) - base


class _ShardFile:
    """One shard's sparse file and its map of written blocks."""

    def __init__(self, path: Path) -> None:
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
        self.path = path
        self.fd = os.open(path, flags, 0o644)
        self.map_fd = os.open(path.with_name(path.name + MAP_SUFFIX), flags, 0o644)
        self.direct_fd: int | None = None

    def marked(self) -> list[int]:
        marks = os.pread(self.map_fd, os.fstat(self.map_fd).st_size, 0)
        return [number for number, mark in enumerate(marks) if mark == 1]

    def mark(self, number: int, whole: bool) -> None:
        os.pwrite(self.map_fd, b"\x01" if whole else b"\x00", number)

    def direct(self) -> int | None:
        if self.direct_fd is None:
            try:
                self.direct_fd = os.open(self.path, os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC)
            except OSError:  # a filesystem without direct I/O (squashfs; tmpfs before Linux 6.6)
                self.direct_fd = -1
        return None if self.direct_fd < 0 else self.direct_fd

    def close(self) -> None:
        for fd in (self.fd, self.map_fd, self.direct_fd):
            if fd is not None and fd >= 0:
                os.close(fd)


class DiskTier:
    """``inner`` with a disk tier in ``directory`` of at most ``budget`` bytes (None: 80 % of the
    free space there). Reads of shards go through the tier; everything else straight to ``inner``."""

    def __init__(self, inner: Store, directory: str | os.PathLike[str], budget: int | None = None) -> None:
        self.inner = inner
        self.url = inner.url
        self.hints_in_memory = inner.hints_in_memory
        self.directory = Path(directory)
        self.budget = default_budget(self.directory) if budget is None else budget
        self._shards = self.directory / "shards"
        self._lock_fd = self._take_directory()
        self._lock = threading.Lock()
        self._files: dict[str, _ShardFile] = {}
        self._lru: OrderedDict[Key, int] = OrderedDict()
        #: Blocks being written: counted in ``used``, not yet readable.
        self._writing: set[Key] = set()
        self.used = 0
        self.hits = 0
        self.hit_bytes = 0
        self.misses = 0
        self.fetched_bytes = 0
        self.evictions = 0
        self.forgotten = 0
        self._load()

    def _take_directory(self) -> int:
        self._shards.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreError(
                f"cache directory {self.directory} is in use by another dlfs mount; "
                "give each mount its own --disk-tier"
            ) from None
        return fd

    def _load(self) -> None:
        """Find the blocks a previous mount left; drop whatever is over the budget."""
        for entry in sorted(os.scandir(self._shards), key=lambda e: e.name):
            if not entry.name.endswith(TIERED):
                continue
            shard = self._file(entry.name)
            size = os.fstat(shard.fd).st_size
            for number in shard.marked():
                length = min(BLOCK, size - number * BLOCK)
                if length > 0:
                    self._lru[(entry.name, number)] = length
                    self.used += length
        with self._lock:
            doomed = self._evict(0)
        self._drop(doomed)
        if self._lru:
            log.info("cache %s: %d blocks, %d bytes kept", self.directory, len(self._lru), self.used)

    def _file(self, name: str) -> _ShardFile:
        shard = self._files.get(name)
        if shard is None:
            with self._lock:
                shard = self._files.get(name)
                if shard is None:
                    shard = self._files[name] = _ShardFile(self._shards / name)
        return shard

    def _evict(self, room: int) -> list[tuple[Key, int]]:
        """Take least recently used blocks off the books until ``room`` more bytes fit the budget
        (the caller holds the lock); the caller ``_drop``s them from the files."""
        doomed = []
        while self._lru and self.used + room > self.budget:
            key, size = self._lru.popitem(last=False)
            self.used -= size
            self.evictions += 1
            doomed.append((key, size))
        return doomed

    def _drop(self, blocks: list[tuple[Key, int]]) -> None:
        """Clear the blocks' marks, then punch their bytes out of the files."""
        for (name, number), size in blocks:
            shard = self._file(name)
            try:
                shard.mark(number, False)
                punch_hole(shard.fd, number * BLOCK, size)
            except OSError as exc:
                log.warning("cache %s: cannot free a block of %s (%s)", self.directory, name, exc)

    def _touch(self, name: str, first: int, last: int) -> bool:
        """Are blocks ``first``..``last`` all cached? If so they become the most recently used."""
        keys = [(name, number) for number in range(first, last + 1)]
        with self._lock:
            if not all(key in self._lru for key in keys):
                return False
            for key in keys:
                self._lru.move_to_end(key)
        return True

    def _keep(self, key: Key, block: bytes | memoryview) -> None:
        """Write a fetched block; its room is taken from the budget before the write, so threads
        keeping blocks at once never overrun it together."""
        with self._lock:
            if key in self._lru or key in self._writing:
                return
            doomed = self._evict(len(block))
            room = self.used + len(block) <= self.budget  # else blocks being written hold it
            if room:
                self.used += len(block)
                self._writing.add(key)
        self._drop(doomed)
        if not room:
            return
        shard, kept = self._file(key[0]), False
        try:
            os.pwrite(shard.fd, block, key[1] * BLOCK)
            shard.mark(key[1], True)
            kept = True
        except OSError as exc:  # a full or failing cache disk costs speed, never a read
            log.warning("cache %s: cannot keep a block (%s); reading on without it", self.directory, exc)
        with self._lock:
            self._writing.discard(key)
            if kept:
                self._lru[key] = len(block)
            else:
                self.used -= len(block)

    def _fetch(self, name: str, first: int, last: int) -> list[memoryview]:
        """Blocks ``first``..``last`` of ``name`` from the store in one ranged read, each kept:
        views of the one buffer the read returned, never copies of it."""
        data = memoryview(self.inner.read_buffer(name, first * BLOCK, (last - first + 1) * BLOCK))
        self.misses += last - first + 1
        self.fetched_bytes += len(data)
        blocks = [data[k * BLOCK : (k + 1) * BLOCK] for k in range(last - first + 1)]
        for number, block in enumerate(blocks, first):
            if block:
                self._keep((name, number), block)
        return blocks

    def _hit(self, name: str, offset: int, length: int, blocks: int) -> bytes:
        data = os.pread(self._file(name).fd, length, offset)
        self.hits += blocks
        self.hit_bytes += len(data)
        return data

    def read(self, name: str, offset: int, length: int) -> bytes:
        if not name.endswith(TIERED):
            return self.inner.read(name, offset, length)  # the index has a local copy of its own
        if length <= 0:
            return b""
        end = offset + length
        first, last = offset // BLOCK, (end - 1) // BLOCK
        if self._touch(name, first, last):  # all here: one pread
            return self._hit(name, offset, length, last - first + 1)
        pieces: list[bytes | memoryview] = []
        number = first
        while number <= last:
            lo, hi = _within(number, offset, end)
            if self._touch(name, number, number):
                pieces.append(self._hit(name, number * BLOCK + lo, hi - lo, 1))
                number += 1
                continue
            run_end = self._missing_through(name, number, last)
            for k, block in enumerate(self._fetch(name, number, run_end), number):
                lo, hi = _within(k, offset, end)
                pieces.append(block[lo:hi])
            number = run_end + 1
        return b"".join(pieces)

    read_buffer = read  # the pieces are joined: there is no one buffer to lend

    def _missing_through(self, name: str, number: int, last: int) -> int:
        """The last block of the run of missing blocks from ``number`` (missing) up to ``last``."""
        while number < last and not self._has((name, number + 1)):
            number += 1
        return number

    def _missing_runs(self, name: str, offset: int, length: int) -> Iterator[tuple[int, int]]:
        """The runs (first, last) of blocks holding these bytes of a shard that the tier lacks."""
        number, last = offset // BLOCK, (offset + length - 1) // BLOCK
        while number <= last:
            if self._has((name, number)):
                number += 1
                continue
            run_end = self._missing_through(name, number, last)
            yield number, run_end
            number = run_end + 1

    def _has(self, key: Key) -> bool:
        with self._lock:
            return key in self._lru

    def local(self, name: str, offset: int, length: int) -> bool:
        """Are all of these bytes in the disk tier?"""
        blocks = range(offset // BLOCK, (offset + max(length, 1) - 1) // BLOCK + 1)
        return name.endswith(TIERED) and all(self._has((name, k)) for k in blocks)

    def local_descriptor(self, name: str, direct: bool = False) -> int | None:
        if not name.endswith(TIERED):
            return None
        shard = self._file(name)
        return shard.direct() if direct else shard.fd

    def read_into(self, name: str, offset: int, buffer: memoryview, wait: bool = True) -> int | None:
        """``wait=False``: only from the disk tier (a local disk is what a read need not wait for)."""
        if not wait and not self.local(name, offset, len(buffer)):
            return None
        data = self.read(name, offset, len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def will_read(self, name: str, offset: int, length: int) -> None:
        """Hint the store of the runs of missing blocks ``read`` will fetch for these bytes."""
        if not name.endswith(TIERED) or length <= 0:
            return
        for first, last in self._missing_runs(name, offset, length):
            self.inner.will_read(name, first * BLOCK, (last - first + 1) * BLOCK)

    def fill(self, name: str, offset: int, length: int) -> None:
        """Fetch the blocks of these bytes that the tier lacks into it, and nothing more: whoever
        asks reads them from the local file (the read-ahead's C loop), so they are not gathered
        into one result as ``read`` gathers them."""
        if not name.endswith(TIERED) or length <= 0:
            return
        with self._lock:  # the held blocks are read next: last out, as a read would make them
            for number in range(offset // BLOCK, (offset + length - 1) // BLOCK + 1):
                if (name, number) in self._lru:
                    self._lru.move_to_end((name, number))
        for first, last in self._missing_runs(name, offset, length):
            self._fetch(name, first, last)

    def forget(self, name: str, offset: int, length: int) -> None:
        """Drop the blocks holding these bytes: they failed a checksum."""
        doomed = []
        with self._lock:
            for number in range(offset // BLOCK, (offset + max(length, 1) - 1) // BLOCK + 1):
                size = self._lru.pop((name, number), None)
                if size is not None:
                    self.used -= size
                    self.forgotten += 1
                    doomed.append(((name, number), size))
        for (shard, number), _ in doomed:
            log.warning("cache %s: dropped %s block %d, which failed a check", self.directory, shard, number)
        self._drop(doomed)

    def stats(self) -> dict[str, dict[str, int]]:
        return {"disk_tier": self._tier_stats(), **self.inner.stats()}

    def _tier_stats(self) -> dict[str, int]:
        return {
            "budget": self.budget,
            "used": self.used,
            "blocks": len(self._lru),
            "hits": self.hits,
            "hit_bytes": self.hit_bytes,
            "misses": self.misses,
            "fetched_bytes": self.fetched_bytes,
            "evictions": self.evictions,
            "forgotten": self.forgotten,
        }

    def size(self, name: str) -> int | None:
        return self.inner.size(name)

    def sizes(self) -> dict[str, int]:
        return self.inner.sizes()

    def names(self) -> list[str]:
        return self.inner.names()

    def map_index(self, name: str) -> memoryview:
        return self.inner.map_index(name)

    def put_file(self, name: str, path: Path) -> None:
        self.inner.put_file(name, path)

    def create(self, name: str) -> ShardWriter:
        return self.inner.create(name)

    def delete(self, name: str) -> None:
        self.inner.delete(name)

    def abort_uploads(self) -> None:
        self.inner.abort_uploads()

    def unfinished_uploads(self) -> list[str]:
        return self.inner.unfinished_uploads()

    def front(self, inner: Store) -> None:
        """Stand in front of ``inner`` from now on, and close the store it stood in front of: an
        in-place dataset's index, read from a bucket through this tier, names the objects the
        tier is for (``shard_store.shard_store``). One tier a directory: a second would find it locked."""
        replaced, self.inner = self.inner, inner
        self.url = inner.url
        replaced.close()

    def close(self) -> None:
        self.inner.close()
        with self._lock:
            for shard in self._files.values():
                shard.close()
            self._files.clear()
        with contextlib.suppress(OSError):
            os.close(self._lock_fd)
