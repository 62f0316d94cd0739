"""A byte-bounded LRU of whole-file payloads, keyed by index row.

The kernel asks for at most 128 KiB per read, so a 500 KB image arrives as several requests; the
cache makes the later ones free. It never holds more than its budget, whatever the file sizes.

Evicted payloads go back to the C allocator, which keeps what is freed in its arenas (one per
thread that loaded payloads): after an epoch read without read-ahead, a 256 MiB cache left the
daemon at 433-452 MiB of RSS. So each time a quarter of the budget has been evicted, the cache
asks glibc to hand free pages back to the system (``malloc_trim``): 326-334 MiB, the index and the
budget plus what was evicted since.
"""

from __future__ import annotations

from collections import OrderedDict

from dlfs.core.libc import trim_allocator

#: Free memory goes back to the system each time evictions add up to this share of the budget.
TRIM_AFTER = 0.25


class RamCache:
    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.trims = 0
        self._evicted_since_trim = 0
        self._items: OrderedDict[int, bytes] = OrderedDict()

    def get(self, row: int) -> bytes | None:
        data = self._items.get(row)
        if data is None:
            self.misses += 1
            return None
        self._items.move_to_end(row)
        self.hits += 1
        return data

    def put(self, row: int, data: bytes) -> None:
        """Insert ``data``; a payload larger than the whole budget is simply not cached."""
        if len(data) > self.budget:
            return
        old = self._items.pop(row, None)
        if old is not None:
            self.used -= len(old)
        while self._items and self.used + len(data) > self.budget:
            evicted = len(self._items.popitem(last=False)[1])
            self.used -= evicted
            self._evicted_since_trim += evicted
            self.evictions += 1
        self._items[row] = data
        self.used += len(data)
        if self._evicted_since_trim > self.budget * TRIM_AFTER and trim_allocator is not None:
            self._evicted_since_trim = 0
            self.trims += 1
            trim_allocator()

    def stats(self) -> dict[str, int]:
        return {
            "budget": self.budget,
            "used": self.used,
            "entries": len(self._items),
            "hits": self.hits,
            "misses": self.misses,
            "evictions": self.evictions,
            "trims": self.trims,
        }
