"""The native loader: read, check and push the common files of a batch in C (``native``), a few
storage reads per call, in the order the reader needs them.

It takes the files that are pushed (no sentinels), stored plain, small enough to hold whole, in a
shard with a descriptor; the Python loader takes the rest, and the files the C loop leaves (a READ
waits for one, the kernel refused one).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import time
from collections.abc import Iterator

import numpy as np

from dlfs.core import format as fmt
from dlfs.core.errors import DlfsError
from dlfs.core.file_bytes import FileBytes
from dlfs.core.index import Index
from dlfs.readahead.buffers import REUSED_BUFFER, BufferPool
from dlfs.readahead.handoff import Handoff
from dlfs.readahead.native import ALIGN, NativePusher
from dlfs.readahead.python_loader import PythonLoader
from dlfs.readahead.reads import storage_reads
from dlfs.readahead.stats import ReadAheadStats

log = logging.getLogger(__name__)

#: Files the C loop reads, checks and pushes per call; between calls, waiting READs are looked after.
#: Each call costs Python around it, so calls of many files spend less of the daemon's CPU there.
NATIVE_FILES = 256


def chunks(read_ends: np.ndarray, sizes: np.ndarray) -> Iterator[tuple[int, int]]:
    """Runs of whole storage reads, as (first, last), each holding about ``NATIVE_FILES`` files and
    fitting the reused buffer with room to align (``sizes``: each read's share of it), or a single
    read. ``read_ends``: one past the last file of each read."""
    first, used = 0, np.concatenate([[0], np.cumsum(sizes)])
    while first < read_ends.size:
        done = int(read_ends[first - 1]) if first else 0
        by_files = int(np.searchsorted(read_ends, done + NATIVE_FILES, side="left")) + 1
        by_bytes = int(np.searchsorted(used, used[first] + REUSED_BUFFER - ALIGN, side="right")) - 1
        last = min(max(min(by_files, by_bytes), first + 1), read_ends.size)
        yield first, last
        first = last


class NativeLoader:
    """Blocking, for fetching threads that hold a buffer of ``buffers``."""

    def __init__(
        self,
        index: Index,
        file_bytes: FileBytes,
        pusher: NativePusher,
        handoff: Handoff,
        buffers: BufferPool,
        stats: ReadAheadStats,
        python: PythonLoader,
    ) -> None:
        self.index = index
        self.file_bytes = file_bytes
        self.pusher = pusher
        self.handoff = handoff
        self.buffers = buffers
        self.stats = stats
        self.python = python

    def _pushable(self, rows: np.ndarray, sentinel: np.ndarray) -> np.ndarray:
        """Files of a batch the C loop can push once their bytes are local: pushed, stored plain,
        small enough to hold whole, in a shard with a descriptor."""
        index = self.index
        return (
            ~sentinel
            & (index.flags[rows] & fmt.ENCODED == 0)
            & (index.size[rows] <= fmt.WHOLE_PAYLOAD_LIMIT)
            & (self._descriptors[0, index.shard[rows]] >= 0)
        )

    def takes(self, positions: np.ndarray, rows: np.ndarray, sentinel: np.ndarray) -> np.ndarray:
        """Which files of a batch the C loop takes: pushable, with their bytes where the shard's
        descriptor reads them. The files a disk tier lacks are fetched into it first, every read in
        flight at once, so that the C loop takes them too: through the tier their bytes are copied
        twice more (into the tier's file and out of it), and still cost less than the Python
        loader's work per file: a first epoch from S3 through a disk tier is faster so."""
        if not rows.size:
            return np.zeros(rows.size, dtype=bool)
        taken = self._pushable(rows, sentinel)
        if self.file_bytes.partly_local:
            local = self.file_bytes.local(rows[taken])
            if not local.all():
                missing = np.flatnonzero(taken)[~local]
                _, spans, _, _ = storage_reads(self.index, rows[missing], positions[missing])
                self.file_bytes.stage(spans)
                self.stats.storage_reads += len(spans)
                local[~local] = self.file_bytes.local(rows[missing])  # kept, unless the tier is full
            taken[taken] = local
        return taken

    @functools.cached_property
    def _bases(self) -> np.ndarray:
        """Where each shard starts in the file its descriptor reads: an in-place dataset's local
        tar at the shard's base; a disk tier's file holds each shard, an in-place one of an object in
        S3 too, at the shard's own offsets."""
        if self.file_bytes.partly_local:
            return np.zeros_like(self.index.shard_base)
        return self.index.shard_base

    @functools.cached_property
    def _descriptors(self) -> np.ndarray:
        """Each shard's descriptors for the C loop, through the page cache and direct (rows), or
        -1 (a store without, a shard that fails, a filesystem without direct I/O)."""
        fds = np.full((2, len(self.index.shard_names)), -1, dtype=np.int32)
        for shard, name in enumerate(self.index.shard_names):
            try:
                for direct in (0, 1):
                    fd = self.file_bytes.descriptor(shard, direct=bool(direct), partial=True)
                    fds[direct, shard] = -1 if fd is None else fd
            except DlfsError as exc:
                log.warning("reading ahead of %s in Python: %s", name, exc)
        return fds

    def fetch(self, positions: np.ndarray, rows: np.ndarray) -> list[tuple[int, bytes]]:
        """Read, check and push these files (all taken by ``takes``); returns what the daemon's
        cache must hold.

        Before each call its files leave the hand-off's pending set: a READ of one of them from then
        on reads the file itself instead of waiting, because the push would wait for that READ (the
        kernel locks the pages it reads into). A READ already waiting keeps its file: the C loop
        skips it and the Python loader hands it over. Files the kernel refused (it forgot their
        inode) are held in the daemon's cache instead, through the Python loader too.
        """
        started = time.thread_time()
        index = self.index
        groups, spans, _, _ = storage_reads(index, rows, positions)
        order = np.fromiter((i for group in groups for i in group), dtype=np.int64, count=rows.size)
        read_ends = np.cumsum([len(group) for group in groups], dtype=np.int32)
        read_rows, read_starts, read_lengths = np.array(spans, dtype=np.int64).T
        read_starts = read_starts + self._bases[index.shard[read_rows]]
        reads = np.stack([*self._descriptors[:, index.shard[read_rows]], read_starts, read_lengths])
        rows, positions = rows[order], positions[order]
        starts = index.offset[rows] + self._bases[index.shard[rows]]
        lengths, checksums = index.stored[rows], index.checksum[rows]
        deferred: list[np.ndarray] = []
        cold = False
        for first, last in chunks(read_ends, NativePusher.buffer_shares(read_starts, read_lengths)):
            done = int(read_ends[first - 1]) if first else 0
            span = slice(done, int(read_ends[last - 1]))
            waited = self.handoff.release(rows[span])
            status, went_direct = self.pusher.push(
                self.buffers.get(self.pusher.buffer_size(reads[2, first:last], reads[3, first:last])),
                (*reads[:, first:last], read_ends[first:last] - done),
                (starts[span], lengths[span], checksums[span], np.where(waited, -1, rows[span])),
            )
            if went_direct and not cold:
                cold = True
                self.stats.cold_batches += 1
            self._count(rows[span][~waited], status[~waited])
            deferred.append(np.flatnonzero(waited | (status == errno.ENOENT)) + done)
            self.stats.storage_reads += last - first
        self.stats.native_cpu_seconds += time.thread_time() - started
        again = np.concatenate(deferred)
        return self.python.fetch(positions[again], rows[again], np.ones(again.size, dtype=bool))

    def _count(self, rows: np.ndarray, status: np.ndarray) -> None:
        pushed = status == 0
        self.stats.pushed_files += int(pushed.sum())
        self.stats.issued_files += int(pushed.sum())
        self.stats.issued_bytes += int(self.index.size[rows[pushed]].sum())
        self.stats.push_refused += int((status == errno.ENOENT).sum())
        # A damaged file (EIO) is reported by its own read.
        failed = ~pushed & (status != errno.ENOENT) & (status != errno.EIO)
        for row, code in zip(rows[failed].tolist(), status[failed].tolist(), strict=True):
            log.warning("read-ahead of %s failed: %s", self.index.location(row), os.strerror(code))
