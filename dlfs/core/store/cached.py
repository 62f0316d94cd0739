"""The disk tier: ranges of a remote store's shards kept in a local directory (``--cache-dir``).

An object store answers a GET in milliseconds; a local disk in microseconds. Shards are cached in
aligned blocks of ``BLOCK`` bytes, one file each (``blocks/<shard>/<number>``), written under a
temporary name and renamed, so a block file that exists is a whole block, even after a crash. A
read takes what it can from block files and fetches each run of missing blocks from the store in
one ranged GET (the read-ahead asks for megabytes of neighbouring files at once; a lone file of a
shuffled read costs at most two blocks). Shard names carry the dataset id, so a remount of the same
dataset finds its blocks again, and another dataset's never match.

The budget is kept by evicting the least recently used blocks: the order lives in memory (about
150 bytes per block, 150 MB per TB of cache) and is rebuilt at start from the files' mtimes, which
``touch`` on every hit would cost a syscall per read to maintain, so a remount starts from write
order. Every byte is checked by its reader against the file's checksum; a mismatch in bytes that
came from here makes the reader ``forget`` them and read the store again (``dlfs.core.reader``), so
a damaged block costs one refetch, never a wrong byte. One mount uses a cache directory at a time
(a lock), as two would each keep their own budget and evict each other's blocks unknowingly.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import threading
from collections import OrderedDict
from pathlib import Path

from dlfs.core.errors import StoreError
from dlfs.core.format import SHARD_SUFFIX
from dlfs.core.store.interface import ShardWriter, Store

log = logging.getLogger(__name__)

#: Cache granularity. Large enough that the read-ahead's spans are a few blocks and the in-memory
#: LRU stays small; small enough that a shuffled read of one 110 KB file fetches at most 2 MiB.
BLOCK = 1 << 20
#: Share of the free space a cache directory takes when no ``--cache-dir-size`` is given.
DEFAULT_SHARE = 0.8

Key = tuple[str, int]


def default_budget(directory: Path) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    return int(shutil.disk_usage(directory).free * DEFAULT_SHARE)


def _within(number: int, start: int, end: int) -> tuple[int, int]:
    """The part of bytes ``start``..``end`` of an object that block ``number`` holds, as offsets
    into the block."""
    base = number * BLOCK
    return max(start, base) - base, min(end, base + BLOCK) - base


class CachedStore:
    """``inner`` with a disk tier in ``directory`` of at most ``budget`` bytes (None: 80 % of the
    free space there). Reads go through the blocks; everything else straight to ``inner``."""

    def __init__(self, inner: Store, directory: str | os.PathLike[str], budget: int | None = None) -> None:
        self.inner = inner
        self.url = inner.url
        self.writes_in_place = inner.writes_in_place
        self.directory = Path(directory)
        self.budget = default_budget(self.directory) if budget is None else budget
        self._blocks = self.directory / "blocks"
        self._lock_fd = self._take_directory()
        self._lock = threading.Lock()
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
        self._blocks.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreError(
                f"cache directory {self.directory} is in use by another dlfs mount; "
                "give each mount its own --cache-dir"
            ) from None
        return fd

    def _load(self) -> None:
        """Find the blocks a previous mount left, oldest first; drop temporary files and whatever
        is over the budget."""
        found = []
        for shard in os.scandir(self._blocks):
            if not shard.is_dir():
                continue
            for entry in os.scandir(shard.path):
                if not entry.name.isdigit():
                    os.unlink(entry.path)  # a block a crash left half-written
                    continue
                info = entry.stat()
                found.append((info.st_mtime_ns, (shard.name, int(entry.name)), info.st_size))
        for _, key, size in sorted(found):
            self._lru[key] = size
            self.used += size
        self._unlink(self._evict(0))
        if found:
            log.info("cache %s: %d blocks, %d bytes kept", self.directory, len(self._lru), self.used)

    def _path(self, key: Key) -> Path:
        return self._blocks / key[0] / str(key[1])

    def _evict(self, room: int) -> list[Key]:
        """Drop least recently used blocks from the accounts until ``room`` more bytes fit the
        budget (the caller holds the lock); their files are the caller's to ``_unlink``."""
        doomed = []
        while self._lru and self.used + room > self.budget:
            key, size = self._lru.popitem(last=False)
            self.used -= size
            self.evictions += 1
            doomed.append(key)
        return doomed

    def _unlink(self, keys: list[Key]) -> None:
        for key in keys:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(key))

    def _read_block(self, key: Key, start: int, length: int) -> bytes | None:
        """``length`` bytes from ``start`` within a cached block; None when it is not cached."""
        with self._lock:
            if key not in self._lru:
                return None
            self._lru.move_to_end(key)
        try:
            fd = os.open(self._path(key), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:  # evicted meanwhile by another thread
            return None
        try:
            data = os.pread(fd, length, start)
        finally:
            os.close(fd)
        self.hits += 1
        self.hit_bytes += len(data)
        return data

    def _keep(self, key: Key, block: bytes | memoryview) -> None:
        """Write a fetched block; its room is taken from the budget before the write, so threads
        keeping blocks at once never overrun it together."""
        if len(block) > self.budget:
            return
        with self._lock:
            if key in self._lru or key in self._writing:
                return
            doomed = self._evict(len(block))
            room = self.used + len(block) <= self.budget  # else blocks being written hold it
            if room:
                self.used += len(block)
                self._writing.add(key)
        self._unlink(doomed)
        if not room:
            return
        path = self._path(key)
        temporary = path.with_name(f".{key[1]}.{threading.get_ident()}.tmp")
        kept = False
        try:
            path.parent.mkdir(exist_ok=True)
            with open(temporary, "wb") as f:
                f.write(block)
            os.replace(temporary, path)
            kept = True
        except OSError as exc:  # a full or failing cache disk costs speed, never a read
            log.warning("cache %s: cannot keep a block (%s); reading on without it", self.directory, exc)
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        with self._lock:
            self._writing.discard(key)
            if kept:
                self._lru[key] = len(block)
            else:
                self.used -= len(block)

    def _fetch(self, name: str, first: int, last: int) -> list[bytes]:
        """Blocks ``first``..``last`` of ``name`` from the store in one ranged read, each kept."""
        data = memoryview(self.inner.read(name, first * BLOCK, (last - first + 1) * BLOCK))
        self.misses += last - first + 1
        self.fetched_bytes += len(data)
        blocks = [bytes(data[k * BLOCK : (k + 1) * BLOCK]) for k in range(last - first + 1)]
        for number, block in enumerate(blocks, first):
            if block:
                self._keep((name, number), block)
        return blocks

    def read(self, name: str, offset: int, length: int) -> bytes:
        if not name.endswith(SHARD_SUFFIX):
            return self.inner.read(name, offset, length)  # the index has a local copy of its own
        if length <= 0:
            return b""
        end = offset + length
        first, last = offset // BLOCK, (end - 1) // BLOCK
        pieces: list[bytes] = []
        number = first
        while number <= last:
            lo, hi = _within(number, offset, end)
            piece = self._read_block((name, number), lo, hi - lo)
            if piece is not None:
                pieces.append(piece)
                number += 1
                continue
            run_end = self._missing_through(name, number, last)
            for k, block in enumerate(self._fetch(name, number, run_end), number):
                lo, hi = _within(k, offset, end)
                pieces.append(block[lo:hi])
            number = run_end + 1
        return b"".join(pieces)

    def _missing_through(self, name: str, number: int, last: int) -> int:
        """The last block of the run of missing blocks from ``number`` (missing) up to ``last``."""
        while number < last and not self._has((name, number + 1)):
            number += 1
        return number

    def _has(self, key: Key) -> bool:
        with self._lock:
            return key in self._lru

    def cached(self, name: str, offset: int, length: int) -> bool:
        """Are all of these bytes in the disk tier?"""
        blocks = range(offset // BLOCK, (offset + length - 1) // BLOCK + 1)
        return name.endswith(SHARD_SUFFIX) and all(self._has((name, k)) for k in blocks)

    def read_into(self, name: str, offset: int, buffer: memoryview, wait: bool = True) -> int | None:
        """``wait=False``: only from the disk tier (a local disk is what a read need not wait for)."""
        if not wait and not self.cached(name, offset, len(buffer)):
            return None
        data = self.read(name, offset, len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def will_read(self, name: str, offset: int, length: int) -> None:
        """Hint the store of the runs of missing blocks ``read`` will fetch for these bytes."""
        if not name.endswith(SHARD_SUFFIX) or length <= 0:
            return
        first, last = offset // BLOCK, (offset + length - 1) // BLOCK
        number = first
        while number <= last:
            if self._has((name, number)):
                number += 1
                continue
            run_end = self._missing_through(name, number, last)
            self.inner.will_read(name, number * BLOCK, (run_end - number + 1) * BLOCK)
            number = run_end + 1

    def forget(self, name: str, offset: int, length: int) -> None:
        """Drop the blocks holding these bytes: they failed a checksum."""
        doomed = []
        with self._lock:
            for number in range(offset // BLOCK, (offset + max(length, 1) - 1) // BLOCK + 1):
                size = self._lru.pop((name, number), None)
                if size is not None:
                    self.used -= size
                    self.forgotten += 1
                    doomed.append((name, number))
        for key in doomed:
            log.warning("cache %s: dropped %s block %d, which failed a check", self.directory, *key)
        self._unlink(doomed)

    def stats(self) -> dict[str, int]:
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

    def put_atomic(self, name: str, data: bytes) -> None:
        self.inner.put_atomic(name, data)

    def create(self, name: str) -> ShardWriter:
        return self.inner.create(name)

    def delete(self, name: str) -> None:
        self.inner.delete(name)

    def close(self) -> None:
        self.inner.close()
        os.close(self._lock_fd)
