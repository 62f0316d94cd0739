"""The mount's READs of file bytes: ``FileBytes``'s blocking work in threads, off the event loop.

A READ waiting for the disk must hold up no other request, so storage reads run in threads (at most
``--threads`` at once); concurrent READs of one file share one fetch. A small file whose bytes are
all in the page cache is the exception: it is read in the event loop, where the hop to a thread and
back cost more than the read itself. A file whose fetch the store gave up on (``--store-timeout``)
fails at once for a moment after: the kernel follows a failed read-ahead READ with a READ of the
page itself straight away, and a reader's ``read`` waited two or three whole timeouts for its EIO.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import trio

from dlfs.core.errors import DlfsError, StoreError
from dlfs.core.file_bytes import FileBytes
from dlfs.core.index import Index
from dlfs.core.ram_cache import RamCache
from dlfs.core.store import Store

T = TypeVar("T")

#: Seconds a file's store failure is answered again without asking the store.
STORE_FAILURE_HOLD = 1.0


class TrioFileBytes(FileBytes):
    """``FileBytes`` with ``read``, the event loop's way in."""

    def __init__(self, index: Index, store: Store, cache: RamCache, max_threads: int = 16) -> None:
        super().__init__(index, store, cache)
        self._limiter = trio.CapacityLimiter(max_threads)
        self._inflight: dict[int, _Pending] = {}
        #: Rows whose fetch the store gave up on: (when, the error), kept for STORE_FAILURE_HOLD.
        self._failed: dict[int, tuple[float, StoreError]] = {}
        self._verified = np.zeros(index.count, dtype=bool)
        #: READs that waited for storage (a thread's fetch), and for how long in all.
        self.storage_waits = 0
        self.storage_wait_seconds = 0.0

    async def _once(self, row: int, work: Callable[[int], T]) -> T:
        """Run ``work(row)`` in a thread; concurrent callers for the same row share one run. Each
        caller's wait counts in ``storage_waits`` and ``storage_wait_seconds``."""
        started = time.perf_counter()
        try:
            return await self._shared(row, work)
        finally:
            self.storage_waits += 1
            self.storage_wait_seconds += time.perf_counter() - started

    async def _shared(self, row: int, work: Callable[[int], T]) -> T:
        failed = self._failed.get(row)
        if failed is not None and time.monotonic() - failed[0] < STORE_FAILURE_HOLD:
            raise failed[1]
        pending = self._inflight.get(row)
        if pending is None:
            pending = self._inflight[row] = _Pending()
            try:
                pending.result = await trio.to_thread.run_sync(work, row, limiter=self._limiter)
            except Exception as exc:
                pending.error = exc
                if isinstance(exc, StoreError):
                    self._remember_failure(row, exc)
            finally:
                del self._inflight[row]
                pending.done.set()
        else:
            await pending.done.wait()
        if pending.error is not None:
            raise pending.error
        return pending.result

    def _remember_failure(self, row: int, error: StoreError) -> None:
        now = time.monotonic()
        if len(self._failed) >= 1024:  # a store down for long: keep only the recent failures
            self._failed = {r: f for r, f in self._failed.items() if now - f[0] < STORE_FAILURE_HOLD}
        self._failed[row] = (now, error)

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
            return await trio.to_thread.run_sync(
                self.read_file_range, row, offset, size, limiter=self._limiter
            )
        except DlfsError as error:
            self.report(row, error)
            raise


class _Pending:
    """One in-flight fetch that later callers for the same row wait on instead of repeating."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.result: Any = None
        self.error: Exception | None = None
