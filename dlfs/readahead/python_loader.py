"""The Python loader: fetch, verify and push the files of a batch the C loop does not take
(sentinels, compressed or big files, a store without descriptors, files a READ waits for)."""

from __future__ import annotations

import contextlib
import errno
import logging
import time
from collections.abc import Iterator

import numpy as np

from dlfs.core.errors import DlfsError
from dlfs.core.file_bytes import FileBytes
from dlfs.core.index import Index
from dlfs.readahead.buffers import BufferPool
from dlfs.readahead.handoff import Handoff, Loaded
from dlfs.readahead.kernel import Kernel
from dlfs.readahead.reads import Span, storage_reads
from dlfs.readahead.stats import ReadAheadStats

log = logging.getLogger(__name__)

Payload = bytes | memoryview


class PythonLoader:
    """Blocking, for fetching threads that hold a buffer of ``buffers``."""

    def __init__(
        self,
        index: Index,
        file_bytes: FileBytes,
        kernel: Kernel,
        handoff: Handoff,
        buffers: BufferPool,
        stats: ReadAheadStats,
    ) -> None:
        self.index = index
        self.file_bytes = file_bytes
        self.kernel = kernel
        self.handoff = handoff
        self.buffers = buffers
        self.stats = stats

    def fetch(self, positions: np.ndarray, rows: np.ndarray, sentinel: np.ndarray) -> list[tuple[int, bytes]]:
        """Fetch these files and push all but the ``sentinel`` ones; returns what the daemon's cache
        must hold (sentinels, files the kernel refused) as copies: the storage read's buffer is
        reused."""
        started, pushing = time.thread_time(), 0.0
        held: list[tuple[int, bytes]] = []
        sentinels = sentinel.tolist()
        for read_rows, loaded in self._load(rows, positions):
            handed = self.handoff.hand_over(read_rows, loaded)
            keep: list[tuple[int, Payload]] = []
            to_push: list[tuple[int, Payload]] = []
            for k, row, data in loaded:
                if row not in handed:
                    (keep if sentinels[k] else to_push).append((row, data))
            if to_push:
                push_started = time.thread_time()
                keep += self._push_all(to_push)
                pushing += time.thread_time() - push_started
            held += [(row, bytes(data)) for row, data in keep]  # copies: the next read reuses the buffer
        self.stats.push_cpu_seconds += pushing
        self.stats.load_cpu_seconds += time.thread_time() - started - pushing
        return held

    def _load(self, rows: np.ndarray, need: np.ndarray) -> Iterator[tuple[list[int], list[Loaded]]]:
        """Fetch, verify and decode files, one storage read at a time: per read, the rows it
        covered and (index into ``rows``, row, payload) for each file ``_decode`` gave.

        Files come back as views into the storage read where they are stored plain, valid until
        the next read is asked for (the buffer is reused): a push copies them into the page cache
        anyway, so copying them out first would be one copy too many.

        The first read of a batch only takes what is in memory already; when that fails, storage
        is slow (a cold cache, a disk), and the rest of the batch is announced to it at once, so
        its reads overlap instead of queueing behind one another. Announcing them always would
        cost a warm read-ahead, whose reads never wait.
        """
        groups, spans, offsets, ends = storage_reads(self.index, rows, need)
        row_list = rows.tolist()
        hinted = False
        for k, (group, (first, begin, length)) in enumerate(zip(groups, spans, strict=True)):
            self.stats.storage_reads += 1
            buffer = memoryview(self.buffers.get(length))[:length]
            try:
                got = self.file_bytes.fetch_into(first, begin, buffer, wait=False)
                if got is None:
                    if not hinted:  # storage is slow: from here on, it works on all of the batch at once
                        hinted = True
                        self.stats.cold_batches += 1
                        self._hint(spans[k:])
                    got = self.file_bytes.fetch_into(first, begin, buffer)
            except DlfsError as exc:
                log.warning("read-ahead of shard %s failed: %s", self.index.shard_of(first), exc)
                continue
            assert got is not None
            blob = buffer[:got]
            read_rows, loaded = [], []
            for i in group:
                row = row_list[i]
                read_rows.append(row)
                data = self._decode(row, blob[offsets[i] - begin : ends[i] - begin])
                if data is not None:
                    loaded.append((i, row, data))
            self.stats.issued_files += len(loaded)
            self.stats.issued_bytes += sum(len(data) for _, _, data in loaded)
            yield read_rows, loaded

    def _hint(self, spans: list[Span]) -> None:
        for span in spans:
            with contextlib.suppress(DlfsError):  # the read of the same range reports it
                self.file_bytes.will_fetch(*span)

    def _decode(self, row: int, stored: memoryview) -> Payload | None:
        """A verified file, or None: too big to hold whole, or damaged (its own read fails with EIO)."""
        if not self.file_bytes.is_whole(row):
            return None
        try:
            return self.file_bytes.decode(row, stored)
        except DlfsError:
            self.file_bytes.forget(row)  # a damaged block of a disk tier: the file's own read refetches it
            return None

    def _push_all(self, items: list[tuple[int, Payload]]) -> list[tuple[int, Payload]]:
        """Push into the kernel page cache (worker thread: never on the loop that answers reads);
        returns the files the kernel refused."""
        refused = []
        for row, data in items:
            try:
                self.kernel.push(row, data)
                self.stats.pushed_files += 1
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    log.warning("notify_store of %s failed: %s", self.index.location(row), exc)
                self.stats.push_refused += 1
                refused.append((row, data))
        return refused
