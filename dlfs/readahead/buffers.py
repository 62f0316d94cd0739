"""Reused buffers for the storage reads of batches in flight, one per batch."""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Iterator

import numpy as np

#: Storage reads up to this size go into a buffer a batch borrows from a pool (one per batch in flight).
REUSED_BUFFER = 8 << 20


class BufferPool:
    """A fresh buffer per read cost page faults and allocator work on every file, in a daemon short
    of CPU (one per C call, a measurable share of a cold epoch). Buffers go back to the pool when their
    batch is done, so there are never more buffers than batches in flight, whichever of trio's
    worker threads runs them.
    """

    def __init__(self) -> None:
        self._lent = threading.local()  # the buffer a fetching thread holds for its batch
        self._spare: collections.deque[np.ndarray] = collections.deque()  # held by no batch now

    @contextlib.contextmanager
    def lent(self) -> Iterator[None]:
        """Lend this thread a ``REUSED_BUFFER`` for its batch's storage reads."""
        try:
            self._lent.buffer = self._spare.pop()  # deque: safe across threads
        except IndexError:
            self._lent.buffer = np.empty(REUSED_BUFFER, dtype=np.uint8)
        try:
            yield
        finally:
            self._spare.append(self._lent.buffer)
            del self._lent.buffer

    def get(self, length: int) -> np.ndarray:
        """Where storage reads go (a Python read of a file or a few, a C call's reads side by side):
        the buffer lent to this thread, or for a bigger read (block order coalesces megabytes) one
        of its own."""
        buffer: np.ndarray = self._lent.buffer
        return buffer if length <= buffer.size else np.empty(length, dtype=np.uint8)
