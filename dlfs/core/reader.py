"""File bytes from shards: fetch, decompress, verify, cache.

Every byte handed out has been checked against the checksum recorded at pack time; a mismatch is an
``IntegrityError`` (EIO at the mount), logged once per file, never wrong bytes. Files up to
``WHOLE_PAYLOAD_LIMIT`` are read whole (one storage request, then cached); larger ones are checked
once by streaming, then served by range. Storage reads run in threads, so a request waiting for the
disk holds up no other, except a small file whose bytes are all in the page cache: that one is read
in the event loop, where a thread hop would cost more than the read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import trio
import xxhash

from dlfs import format as fmt
from dlfs.cache import PayloadCache
from dlfs.errors import DlfsError, IntegrityError
from dlfs.index import Index
from dlfs.store import Store

log = logging.getLogger(__name__)

VERIFY_CHUNK = 8 << 20
#: Files up to this size whose stored bytes are all in the page cache are read in the event loop
#: itself, with a read that must not wait: the hop to a thread and back cost more than the read.
INLINE_LIMIT = 1 << 20
T = TypeVar("T")


class Reader:
    """Blocking methods (``load``, ``check``) for threads; ``read`` for the trio loop."""

    def __init__(self, index: Index, store: Store, cache: PayloadCache, max_threads: int = 16) -> None:
        self.index = index
        self.store = store
        self.cache = cache
        self.storage_reads = 0
        self.storage_bytes = 0
        self._limiter = trio.CapacityLimiter(max_threads)
        self._inflight: dict[int, _Pending] = {}
        self._reported = np.zeros(index.count, dtype=bool)
        self._verified = np.zeros(index.count, dtype=bool)

    def _raw(self, row: int, offset: int, length: int) -> bytes:
        """``length`` bytes of a file's stored payload, starting ``offset`` bytes into it."""
        self.storage_reads += 1
        self.storage_bytes += length
        return self.store.read(self.index.shard_of(row), int(self.index.offset[row]) + offset, length)

    def fetch_into(self, row: int, shard_offset: int, buffer: memoryview, wait: bool = True) -> int | None:
        """Any byte range of the shard holding ``row`` (read-ahead covers neighbours with one read);
        see ``Store.read_into``."""
        got = self.store.read_into(self.index.shard_of(row), shard_offset, buffer, wait)
        if got is not None:
            self.storage_reads += 1
            self.storage_bytes += got
        return got

    def will_fetch(self, row: int, shard_offset: int, length: int) -> None:
        self.store.will_read(self.index.shard_of(row), shard_offset, length)

    def _report(self, row: int, error: DlfsError) -> None:
        if not self._reported[row]:
            self._reported[row] = True
            log.error("%s: %s", self.index.location(row), error)

    def is_whole(self, row: int) -> bool:
        return int(self.index.size[row]) <= fmt.WHOLE_PAYLOAD_LIMIT

    def load(self, row: int) -> bytes:
        """The whole original file; only for files up to WHOLE_PAYLOAD_LIMIT."""
        return self.decode(row, self._raw(row, 0, int(self.index.stored[row])))

    def load_cached(self, row: int) -> bytes | None:
        """``load`` for a small file whose stored bytes are all in the page cache, never waiting for
        storage (so the event loop may call it); None when some are not."""
        stored = int(self.index.stored[row])
        if max(stored, int(self.index.size[row])) > INLINE_LIMIT:  # nor a long lz4 decompression
            return None
        buffer = memoryview(bytearray(stored))
        if self.fetch_into(row, int(self.index.offset[row]), buffer, wait=False) is None:
            return None
        return bytes(self.decode(row, buffer))

    def decode(self, row: int, stored: bytes | memoryview) -> bytes | memoryview:
        """Stored payload -> original bytes, verified against the file's checksum."""
        index = self.index
        return fmt.decode_payload(
            stored, int(index.flags[row]), int(index.size[row]), int(index.checksum[row])
        )

    def check(self, row: int) -> None:
        """Verify one file of any size against its checksum without holding it whole."""
        if self.is_whole(row):
            self.load(row)
            return
        size = int(self.index.size[row])
        hasher = xxhash.xxh3_64()
        for start in range(0, size, VERIFY_CHUNK):
            chunk = self._raw(row, start, min(VERIFY_CHUNK, size - start))
            if not chunk:
                break
            hasher.update(chunk)
        if hasher.intdigest() != int(self.index.checksum[row]):
            raise IntegrityError("checksum mismatch")

    async def _once(self, row: int, work: Callable[[int], T]) -> T:
        """Run ``work(row)`` in a thread; concurrent callers for the same row share one run."""
        pending = self._inflight.get(row)
        if pending is None:
            pending = self._inflight[row] = _Pending()
            try:
                pending.result = await trio.to_thread.run_sync(work, row, limiter=self._limiter)
            except Exception as exc:
                pending.error = exc
            finally:
                del self._inflight[row]
                pending.done.set()
        else:
            await pending.done.wait()
        if pending.error is not None:
            raise pending.error
        return pending.result

    async def read(self, row: int, offset: int, size: int) -> bytes:
        try:
            if self.is_whole(row):
                data = self.cache.get(row)
                if data is None:
                    data = self.load_cached(row)
                    if data is None:
                        data = await self._once(row, self.load)
                    self.cache.put(row, data)
                return data[offset : offset + size]
            if not self._verified[row]:
                await self._once(row, self.check)
                self._verified[row] = True
            return await trio.to_thread.run_sync(self._raw, row, offset, size, limiter=self._limiter)
        except DlfsError as error:
            self._report(row, error)
            raise


class _Pending:
    """One in-flight fetch that later callers for the same row wait on instead of repeating."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.result: Any = None
        self.error: Exception | None = None
