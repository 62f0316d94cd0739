"""The read-ahead engine: follow each published sequence a reader is in, fetch ahead of it.

For every sequence being read on this node (an ``.dlfs/order`` file was resolved), the engine keeps
the next ``budget`` bytes of files fetched from storage, verified, and pushed into the kernel's page
cache. The reader's ``open``/``read`` of a pushed file then never reaches the daemon at all. Where
the kernel does not know a file's inode yet (it was never looked up), the push is refused, so
before fetching, the engine has the kernel learn the files (``Kernel.reveal``). A file still
refused waits in the daemon's cache for the read instead.

The reader's position is learned from the reads that do reach the daemon (``cursor``): every
``sentinel_every``-th file of a lead is deliberately *not* pushed but kept in the daemon's cache,
so that reaching it tells the engine how far the reader got. What to fetch next is ``batch``'s
plan; how storage is read is ``reads``'; the C loop (``native_loader``) pushes the common files and
the Python loader the rest; a READ of a file a batch is loading waits for it (``handoff``). At most
``max_inflight`` batches run at once; the bytes fetched ahead of the reader, a sequence's *lead*,
never exceed the budget.

The read-ahead works only while its reader does. A sequence whose lead is full and whose reader
has not been seen for ``pause_after`` seconds (``MountOptions.readahead_pause``) pauses: it keeps
what it fetched, and fetches nothing more, not even the files the kernel forgets (a job that
stopped mid-epoch would otherwise have its lead fetched again after every eviction, for as long
as the mount lives). The reader's next read that reaches the daemon, or its resolving the order
file again, resumes it at once, from where the reader is. A pause the reader comes back from costs
nothing while the kernel keeps the lead: its files are still in the page cache.
"""

from __future__ import annotations

import functools
import logging
import math

import numpy as np
import trio

from dlfs.core.file_bytes import FileBytes
from dlfs.core.index import Index
from dlfs.core.protocol import Reading
from dlfs.readahead.batch import StorageNeighbours, next_batch, sentinel_spacing, sentinels
from dlfs.readahead.buffers import BufferPool
from dlfs.readahead.cursor import READER_MOVES, Follow, Move
from dlfs.readahead.handoff import Handoff
from dlfs.readahead.kernel import Kernel
from dlfs.readahead.native_loader import NativeLoader
from dlfs.readahead.python_loader import PythonLoader
from dlfs.readahead.stats import ReadAheadStats

log = logging.getLogger(__name__)

#: Sequences followed at once (one per rank being read on this node); the oldest is dropped.
MAX_READINGS = 16


class ReadAhead:
    """Called on the event loop (``activate``, ``observe``, ``arrival``, ``forgotten``); fetches in
    trio's worker threads."""

    def __init__(
        self,
        index: Index,
        file_bytes: FileBytes,
        kernel: Kernel,
        budget: int = 512 << 20,
        max_inflight: int = 16,
        *,
        pause_after: float,
    ) -> None:
        self.index = index
        self.file_bytes = file_bytes
        self.kernel = kernel
        self.budget = budget
        self.max_inflight = max_inflight
        self.pause_after = pause_after
        self.stats = ReadAheadStats()
        self.handoff = Handoff()
        self.buffers = BufferPool()
        self.python = PythonLoader(index, file_bytes, kernel, self.handoff, self.buffers, self.stats)
        #: The C loop's loader, once ``run`` found the kernel's session live and the library built.
        self.native: NativeLoader | None = None
        self._neighbours = StorageNeighbours(index)
        #: By the reading's label: one epoch and rank of two datasets are two sequences.
        self._follows: dict[str, Follow] = {}
        self._inflight = 0
        self._wake = trio.Event()

    @functools.cached_property
    def sentinel_every(self) -> int:
        """One file in this many is a sentinel (``sentinel_spacing``). Worked out when first needed,
        not at mount start-up: the mean size of millions of files is a pass over a whole column."""
        sizes = self.index.size[self.index.regular_rows()]
        return sentinel_spacing(self.budget, float(sizes.mean()) if sizes.size else 0.0)

    def activate(self, reading: Reading) -> None:
        """A published sequence is being read here: follow it.

        Resolving it again keeps the cursor (an epoch that restarts shows itself in the reads) and
        resumes a paused sequence: its reader announced itself.
        """
        key = reading.label
        follow = self._follows.get(key)
        if follow is not None:
            self._heard(follow)
            return
        if len(self._follows) >= MAX_READINGS:
            paused = (k for k, f in self._follows.items() if f.paused)
            dropped = self._follows.pop(next(paused, next(iter(self._follows))))
            self.stats.wasted_files += int(dropped.done[dropped.cursor :].sum())
        self._follows[key] = follow = Follow.start(reading, self.index.size)
        follow.heard = trio.current_time()
        log.info("following %s (%d files)", key, reading.rows.size)
        self._wake.set()

    def observe(self, row: int) -> None:
        """A read of ``row`` reached the daemon: move the cursor of every sequence holding it
        (``Follow.read``)."""
        for follow in self._follows.values():
            seen = follow.read(row, self.budget, self.sentinel_every)
            if seen.move is Move.SKIPPED:
                log.debug("read of position %d past what was fetched: the reader skipped", follow.cursor)
                self.stats.misses_ahead += 1
            elif seen.move is Move.RESTARTED:
                log.debug("read of position %d far behind the cursor: the epoch restarted", follow.cursor)
                self.stats.restarts += 1
            if seen.move in READER_MOVES:
                self._heard(follow)
            self.stats.used_files += seen.passed
        self._wake.set()

    def _heard(self, follow: Follow) -> None:
        """The reader of ``follow`` is at work: a paused sequence resumes from its cursor."""
        follow.heard = trio.current_time()
        if follow.paused:
            follow.resume()
            self.stats.resumes += 1
            log.info(
                "%s: its reader is back at position %d, reading ahead", follow.reading.label, follow.cursor
            )
            self._wake.set()

    async def arrival(self, row: int) -> None:
        """Before a READ of ``row`` is served: if a batch in flight is loading the file, wait for it
        and take it from there (it lands in the RAM cache); see ``handoff``."""
        data = await self.handoff.arrival(row)
        if data is not None:
            self.file_bytes.hold(row, data)
            self.stats.handed_over += 1

    def forgotten(self, rows: np.ndarray) -> None:
        """The kernel dropped these entries, and with them any pages pushed for them: pushed files
        still ahead of a reader, within its lead, are fetched again (the batches the kernel does
        keep are skipped cheaply then); those of a paused sequence once it resumes."""
        for follow in self._follows.values():
            lost = follow.forgotten(rows)
            if lost:
                self.stats.forgotten_ahead += lost
                self._wake.set()

    async def run(self) -> None:
        """Background task: keep every followed sequence's lead full. Runs until cancelled."""
        pusher = self.kernel.pusher()
        if pusher is not None:
            self.native = NativeLoader(
                self.index, self.file_bytes, pusher, self.handoff, self.buffers, self.stats, self.python
            )
        async with trio.open_nursery() as nursery:
            while True:
                with trio.move_on_at(self._next_pause()):
                    await self._wake.wait()
                self._wake = trio.Event()
                now = trio.current_time()
                for follow in list(self._follows.values()):
                    if follow.paused or not self._fill(follow, nursery):
                        continue
                    if now - follow.heard >= self.pause_after:
                        self._pause(follow, now)

    def _pause(self, follow: Follow, now: float) -> None:
        follow.paused = True
        self.stats.pauses += 1
        log.info("%s: no read for %.0f s, read-ahead paused", follow.reading.label, now - follow.heard)

    def _fill(self, follow: Follow, nursery: trio.Nursery) -> bool:
        """Start batches of ``follow`` until its lead is full (True) or ``max_inflight`` batches
        are in flight (False)."""
        while follow.fetched < follow.total:
            if self._inflight >= self.max_inflight:
                return False
            positions = next_batch(follow, self.budget, self.sentinel_every, self._neighbours)
            if positions is None:
                break
            follow.mark(positions)
            self._inflight += 1
            nursery.start_soon(self._fetch, follow, positions)
        return True

    def _next_pause(self) -> float:
        """When the next sequence still going would pause, if its reader stays away: the loop looks
        then. One already due but not full yet is looked at when a batch ends."""
        now = trio.current_time()
        due = (f.heard + self.pause_after for f in self._follows.values() if not f.paused)
        return min((when for when in due if when > now), default=math.inf)

    async def _fetch(self, follow: Follow, positions: np.ndarray) -> None:
        rows = follow.reading.rows[positions]
        row_list = rows.tolist()
        self.handoff.expect(row_list)
        try:
            sentinel = sentinels(positions, self.sentinel_every)
            held = await trio.to_thread.run_sync(self._fetch_blocking, positions, rows, sentinel)
            for row, data in held:
                self.file_bytes.hold(row, data)
            self.stats.held_files += len(held)
        finally:
            self.handoff.finish(row_list)
            self._inflight -= 1
            self._wake.set()

    def _fetch_blocking(
        self, positions: np.ndarray, rows: np.ndarray, sentinel: np.ndarray
    ) -> list[tuple[int, bytes]]:
        """Fetch a batch and push it; returns what the cache must hold (copies: the storage read's
        buffer is reused).

        When the kernel already caches the batch's first- and last-needed pushable files, the batch
        was read before (an earlier epoch, an earlier job): only its sentinels are fetched. Both,
        because either alone misleads: a reader that outran the read-ahead may have read the first
        ones itself, and the last may be one pushed again after the kernel forgot it. Two questions
        per batch keep the check cheap; a file of the batch the kernel does not hold after all is
        read through the daemon, which moves the cursor on, as any file the read-ahead missed.

        Files the C loop can push go there (``native_loader``), fetched into a disk tier first where
        the store has one; the rest (sentinels, compressed or big files, a store without
        descriptors) take the Python path.
        """
        with self.buffers.lent():
            self.stats.revealed_dirs += self.kernel.reveal(rows)
            pushable = np.flatnonzero(~sentinel)  # positions come sorted
            if pushable.size and all(map(self.kernel.holds, rows[pushable[[0, -1]]].tolist())):
                log.debug("positions %d-%d: the kernel holds them already", positions[0], positions[-1])
                self.stats.already_cached += int(pushable.size)
                positions, rows, sentinel = positions[sentinel], rows[sentinel], sentinel[sentinel]
            if self.native is not None:
                native = self.native.takes(positions, rows, sentinel)
            else:
                native = np.zeros(rows.size, dtype=bool)
            held = self.python.fetch(positions[~native], rows[~native], sentinel[~native])
            if self.native is not None and native.any():
                held += self.native.fetch(positions[native], rows[native])
            return held

    def snapshot(self) -> dict[str, object]:
        return {
            **self.stats.as_dict(),
            "budget": self.budget,
            "sentinel_every": self.sentinel_every,
            "inflight": self._inflight,
            "paused_readings": sum(follow.paused for follow in self._follows.values()),
            "readings": {key: follow.summary() for key, follow in self._follows.items()},
        }
