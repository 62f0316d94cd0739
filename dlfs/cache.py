"""A byte-bounded LRU of whole-file payloads, keyed by index row.

The kernel asks for at most 128 KiB per read, so a 500 KB image arrives as several requests; the
cache makes the later ones free. It never holds more than its budget, whatever the file sizes.
"""

from __future__ import annotations

from collections import OrderedDict


class PayloadCache:
    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
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
            _, evicted = self._items.popitem(last=False)
            self.used -= len(evicted)
            self.evictions += 1
        self._items[row] = data
        self.used += len(data)

    def stats(self) -> dict[str, int]:
        return {
            "budget": self.budget,
            "used": self.used,
            "entries": len(self._items),
            "hits": self.hits,
            "misses": self.misses,
            "evictions": self.evictions,
        }
