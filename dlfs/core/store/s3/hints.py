"""GETs started ahead of the reads that take them (``will_read``), and the count of every GET.

The read-ahead hints every read of a batch before it reads them one by one, so a batch's GETs are
all in flight at once: a batch of files scattered over the shards (a uniform order) waits one
round trip, not one per file. The hint cache is handed the ``get`` that fetches a range, so it
knows nothing of S3 and is tested without a server.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from obstore import Bytes

#: GETs that hints keep in flight at once, and the bytes hinted but not yet read.
AHEAD_THREADS = 64
AHEAD_BYTES = 256 << 20
#: Seconds after which a hint whose GET is done but that nobody read counts as abandoned (two
#: batches in flight at once may both hint a block that only one of them fetches): its bytes are
#: let go when a new hint needs the room. The read-ahead reads its hints within its batch.
HINT_TTL = 30.0

#: A range of an object: (name, offset, length).
Range = tuple[str, int, int]
#: Fetches a range: obstore's response body, or (in tests) bytes.
Get = Callable[[str, int, int], "Bytes | bytes"]


class HintCache:
    """Ranges fetched ahead by ``get`` on ``threads`` threads, at most ``budget`` bytes of them
    unread; ``requests`` and ``received`` count every GET and its bytes, hinted or not (the mount's
    store statistics)."""

    def __init__(
        self, get: Get, threads: int = AHEAD_THREADS, budget: int = AHEAD_BYTES, ttl: float = HINT_TTL
    ) -> None:
        self._get = get
        self._budget = budget
        self._ttl = ttl
        self.requests = 0
        self.received = 0
        self._lock = threading.Lock()
        #: GETs started by ``hint``, by range, and when each was hinted.
        self._ahead: dict[Range, tuple[Future[Bytes | bytes], float]] = {}
        self.held = 0
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="dlfs-s3-ahead")

    def hinted(self) -> list[Range]:
        with self._lock:
            return list(self._ahead)

    def fetch(self, name: str, offset: int, length: int) -> Bytes | bytes:
        """One GET, counted (from the caller's thread or from one of the hints')."""
        data = self._get(name, offset, length)
        with self._lock:
            self.requests += 1
            self.received += len(data)
        return data

    def read(self, name: str, offset: int, length: int) -> memoryview:
        """The range in the GET's own buffer: from a GET ``hint`` started for it, or for a range
        holding it, or a new GET.

        A hint is used up by the first read inside it: the disk tier hints each run of blocks it
        lacks, and when two runs shared a block that the first one's read then kept, the second
        read asks for its run less that block. Matched exactly only, that hint would never be read
        and would hold its bytes, and its share of the budget, for as long as the cache lives."""
        with self._lock:
            key = (name, offset, length)
            if key not in self._ahead:
                key = next(
                    (
                        (hinted, start, size)
                        for hinted, start, size in self._ahead
                        if hinted == name and start <= offset and offset + length <= start + size
                    ),
                    key,
                )
            ahead = self._ahead.pop(key, None)
        if ahead is None:
            return memoryview(self.fetch(name, offset, length))
        try:
            data = memoryview(ahead[0].result())
        finally:
            with self._lock:
                self.held -= key[2]
        return data if key[1:] == (offset, length) else data[offset - key[1] : offset - key[1] + length]

    def hint(self, name: str, offset: int, length: int) -> None:
        """Start the GET of this range now, for the ``read`` of this range, or of a part of it,
        that follows.

        Hinted bytes not yet read are capped at the budget; past it, hints abandoned for the
        ``ttl`` are let go, and if the room is still short, this hint is dropped and its read
        fetches in its turn.
        """
        key = (name, offset, length)
        with self._lock:
            if key in self._ahead:
                return
            if self.held + length > self._budget:
                self._let_go_abandoned()
                if self.held + length > self._budget:
                    return
            self.held += length
            self._ahead[key] = (self._pool.submit(self.fetch, name, offset, length), time.monotonic())

    def _let_go_abandoned(self) -> None:
        """Forget the hints whose GETs are done and unread for the ``ttl``; under ``_lock``."""
        before = time.monotonic() - self._ttl
        for key, (ahead, hinted) in list(self._ahead.items()):
            if hinted <= before and ahead.done():
                del self._ahead[key]
                self.held -= key[2]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
