"""The read-ahead engine: follow each published sequence a reader is in, fetch ahead of it.

For every sequence being read on this node (an ``.dlfs/order`` file was resolved), the engine keeps
the next ``budget`` bytes of files fetched from storage, verified, and pushed into the kernel's page
cache with ``notify_store``. The reader's ``open``/``read`` of a pushed file then never reaches the
daemon at all. Where the kernel does not know a file's inode yet (it was never looked up), the push
is refused. So before fetching, the engine lists the files' directories through the mount, which
makes the kernel learn every entry at once (READDIRPLUS); a directory is listed again only after the
kernel forgot one of its entries (``drop_caches``, memory pressure) and told the daemon so. A file
still refused waits in the daemon's cache for the read instead.

The reader's position is learned from the reads that do reach the daemon. Because pushed files are
invisible, every ``sentinel_every``-th file of a window is deliberately *not* pushed but kept in the
daemon's cache: reaching it costs the reader one quick round trip and tells the engine how far the
reader got, so the window moves on. Positions far behind the cursor mean the epoch restarted.

Neighbouring files of one shard are fetched with one storage read (coalescing); at most
``max_inflight`` storage batches run at once; bytes ahead of the reader never exceed the budget.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import trio

from dlfs.control import Reading
from dlfs.errors import DlfsError
from dlfs.index import Index
from dlfs.reader import Reader

log = logging.getLogger(__name__)

#: Storage reads of one shard are merged when the gap between two files is at most this.
COALESCE_GAP = 256 << 10
#: One fetch task covers up to this many bytes of upcoming files.
BATCH_BYTES = 8 << 20
BATCH_FILES = 256
#: Sequences followed at once (one per rank being read on this node); the oldest is dropped.
MAX_READINGS = 16

Push = Callable[[int, bytes | memoryview], None]
#: Does the kernel already cache every page of this row's file?
InKernel = Callable[[int], bool]
#: Make the kernel learn every entry of this directory row (list it through the mount).
Reveal = Callable[[int], None]


@dataclass
class _Follow:
    """Where one published sequence stands: consumed up to ``cursor``, fetched up to ``fetched``."""

    reading: Reading
    position: np.ndarray  # row -> first position in the sequence, or -1 (int32: 5 MB per 1.28 M rows)
    sizes: np.ndarray  # cumulative bytes of the sequence, for O(1) window sizes
    cursor: int = 0
    fetched: int = 0

    def ahead_bytes(self) -> int:
        return int(self.sizes[self.fetched] - self.sizes[min(self.cursor, self.fetched)])


@dataclass
class PrefetchStats:
    issued_files: int = 0
    issued_bytes: int = 0
    storage_reads: int = 0
    pushed_files: int = 0
    push_refused: int = 0
    held_files: int = 0
    used_files: int = 0
    wasted_files: int = 0
    restarts: int = 0
    misses_ahead: int = 0
    already_cached: int = 0
    load_cpu_seconds: float = 0.0
    push_cpu_seconds: float = 0.0
    revealed_dirs: int = 0
    forgotten_ahead: int = 0

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in self.__dict__.items()}


class Prefetcher:
    def __init__(
        self,
        index: Index,
        reader: Reader,
        push: Push | None,
        budget: int = 512 << 20,
        max_inflight: int = 8,
        sentinel_every: int = 64,
        in_kernel: InKernel | None = None,
        reveal: Reveal | None = None,
    ) -> None:
        self.index = index
        self.reader = reader
        self.push = push
        self.in_kernel = in_kernel
        self.reveal = reveal
        self._listed = np.zeros(index.count, dtype=bool)
        self.budget = budget
        self.max_inflight = max_inflight
        self.sentinel_every = sentinel_every
        self.stats = PrefetchStats()
        self._follows: dict[tuple[int, int, int], _Follow] = {}
        self._inflight = 0
        self._wake = trio.Event()

    def activate(self, reading: Reading) -> None:
        """A published sequence is being read here: follow it.

        Resolving it again keeps the cursor; an epoch that restarts shows itself in the reads.
        """
        key = (reading.epoch, reading.world_size, reading.rank)
        if key in self._follows:
            return
        if len(self._follows) >= MAX_READINGS:
            oldest = next(iter(self._follows))
            self._drop(self._follows.pop(oldest))
        position = np.full(self.index.count, -1, dtype=np.int32)
        position[reading.rows[::-1]] = np.arange(reading.rows.size - 1, -1, -1)
        sizes = np.zeros(reading.rows.size + 1, dtype=np.int64)
        np.cumsum(self.index.size[reading.rows], out=sizes[1:])
        self._follows[key] = _Follow(reading, position, sizes)
        log.info(
            "following epoch %d rank %d of %d (%d files)",
            reading.epoch,
            reading.rank,
            reading.world_size,
            reading.rows.size,
        )
        self._wake.set()

    def observe(self, row: int) -> None:
        """A read of ``row`` reached the daemon: move the cursor of every sequence holding it.

        Several readers (DataLoader workers) share one sequence and never quite keep step, so the
        cursor is the furthest position seen. A read behind it is a slower worker, unless it lies
        near the start of the sequence while the cursor is a window past that: then the epoch
        restarted. A read beyond what was fetched moves the fetching there only when it is more than
        a window ahead (a reader skipped); a nearer one is a fast worker, and the files behind it are
        exactly what the others need next, so they are still fetched.
        """
        for follow in self._follows.values():
            pos = int(follow.position[row])
            if pos < 0:
                continue
            # The window (a binary search) only matters for reads past what was fetched or behind
            # the cursor; most reads that reach the daemon are sentinels between the two.
            if pos >= follow.cursor:
                if pos >= follow.fetched and pos >= follow.fetched + self._window_files(follow):
                    log.debug("read of position %d, fetched to %d: the reader skipped", pos, follow.fetched)
                    self.stats.misses_ahead += 1
                    follow.fetched = pos
                self.stats.used_files += pos - follow.cursor
                follow.cursor = pos
            elif pos < self._window_files(follow) <= follow.cursor - pos:
                log.debug("read of position %d, cursor at %d: the epoch restarted", pos, follow.cursor)
                self.stats.restarts += 1
                follow.cursor = follow.fetched = pos
        self._wake.set()

    def forgotten(self, rows: np.ndarray) -> None:
        """The kernel dropped these entries, and with them any pages pushed for them.

        Their directories must be listed again before a push, and pushed files still ahead of a
        reader are fetched again (the batches the kernel does keep are skipped cheaply then).
        """
        self._listed[self.index.parent[rows]] = False
        for follow in self._follows.values():
            positions = follow.position[rows]
            lost = positions[(positions >= follow.cursor) & (positions < follow.fetched)]
            if lost.size:
                self.stats.forgotten_ahead += int(lost.size)
                follow.fetched = int(lost.min())
                self._wake.set()

    def _window_files(self, follow: _Follow) -> int:
        ahead = np.searchsorted(follow.sizes, follow.sizes[follow.cursor] + self.budget)
        return max(int(ahead) - follow.cursor, self.sentinel_every)

    def _drop(self, follow: _Follow) -> None:
        self.stats.wasted_files += max(follow.fetched - follow.cursor, 0)

    async def run(self) -> None:
        """Background task: keep every followed window full. Runs until cancelled."""
        async with trio.open_nursery() as nursery:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                for follow in list(self._follows.values()):
                    while self._inflight < self.max_inflight and follow.fetched < follow.reading.rows.size:
                        if follow.ahead_bytes() >= self.budget:
                            break
                        start = follow.fetched
                        stop = self._batch_end(follow, start)
                        follow.fetched = stop
                        self._inflight += 1
                        nursery.start_soon(self._fetch, follow, start, stop)

    def _batch_end(self, follow: _Follow, start: int) -> int:
        """End of the next fetch: one batch, never past the budget ahead of the cursor (>= 1 file)."""
        limit = min(follow.sizes[start] + BATCH_BYTES, follow.sizes[min(follow.cursor, start)] + self.budget)
        stop = int(np.searchsorted(follow.sizes, limit, side="right")) - 1
        return min(max(stop, start + 1), start + BATCH_FILES, follow.reading.rows.size)

    async def _fetch(self, follow: _Follow, start: int, stop: int) -> None:
        try:
            rows = follow.reading.rows[start:stop]
            sentinel = [self.push is None or p % self.sentinel_every == 0 for p in range(start, stop)]
            todo, loaded = await trio.to_thread.run_sync(self._prepare, rows, sentinel)
            held, to_push = [], []
            for k, data in zip(todo, loaded, strict=True):
                if data is not None:
                    (held if sentinel[k] else to_push).append((int(rows[k]), data))
            if to_push:
                held += await trio.to_thread.run_sync(self._push_all, to_push)
            for row, data in held:
                # A copy: a view would keep its whole storage read (megabytes) alive in the cache.
                self.reader.cache.put(row, bytes(data))
            self.stats.held_files += len(held)
        finally:
            self._inflight -= 1
            self._wake.set()

    def _prepare(
        self, rows: np.ndarray, sentinel: list[bool]
    ) -> tuple[list[int], list[bytes | memoryview | None]]:
        """Which files of a batch to fetch (positions in it), and their payloads.

        When the kernel already caches the batch's first pushable file, the batch was read before
        (an earlier epoch, an earlier job): only its sentinels are fetched. One question per batch
        keeps the check cheap; a file of the batch the kernel does not hold after all is read
        through the daemon, which moves the cursor on, as any file the read-ahead missed.
        """
        self._reveal_dirs(rows)
        todo = list(range(rows.size))
        first = next((k for k in todo if not sentinel[k]), None)
        if self.in_kernel is not None and first is not None and self.in_kernel(int(rows[first])):
            todo = [k for k in todo if sentinel[k]]
            self.stats.already_cached += rows.size - len(todo)
        return todo, self._load(rows[todo])

    def _reveal_dirs(self, rows: np.ndarray) -> None:
        """List the directories of ``rows`` not listed since the kernel last forgot an entry of them.

        Once per directory: a listing the kernel still caches is answered without the daemon, and
        one it does not teaches it every entry in a few requests instead of a LOOKUP per file.
        """
        if self.reveal is None:
            return
        dirs = np.unique(self.index.parent[rows])
        dirs = dirs[~self._listed[dirs]]
        for row in dirs.tolist():
            self.reveal(row)
        self._listed[dirs] = True
        self.stats.revealed_dirs += int(dirs.size)

    def _load(self, rows: np.ndarray) -> list[bytes | memoryview | None]:
        """Fetch, verify and decode a run of files; neighbours in one shard share a storage read.

        Files come back as views into the storage read where they are stored plain: a push copies
        them into the page cache anyway, so slicing them out first would be one copy too many.
        """
        started = time.thread_time()
        out: list[bytes | memoryview | None] = [None] * rows.size
        shards = self.index.shard[rows]
        offsets = self.index.offset[rows].astype(np.int64)
        ends = offsets + self.index.stored[rows].astype(np.int64)
        order = np.lexsort((offsets, shards))
        k = 0
        while k < order.size:
            group = [int(order[k])]
            while (
                k + 1 < order.size
                and shards[order[k + 1]] == shards[group[0]]
                and offsets[order[k + 1]] - ends[group[-1]] <= COALESCE_GAP
                and ends[order[k + 1]] - offsets[group[0]] <= 2 * BATCH_BYTES
            ):
                k += 1
                group.append(int(order[k]))
            k += 1
            begin = int(offsets[group[0]])
            span = int(max(ends[i] for i in group)) - begin
            self.stats.storage_reads += 1
            try:
                blob = memoryview(self.reader.fetch_range(int(rows[group[0]]), begin, span))
            except DlfsError as exc:
                log.warning("read-ahead of shard %d failed: %s", int(shards[group[0]]), exc)
                continue
            for i in group:
                row = int(rows[i])
                if not self.reader.is_whole(row):
                    continue
                try:
                    out[i] = self.reader.decode(row, blob[int(offsets[i]) - begin : int(ends[i]) - begin])
                except DlfsError:
                    continue  # the reader's own read will fail with EIO and log it
        self.stats.issued_files += sum(data is not None for data in out)
        self.stats.issued_bytes += sum(len(data) for data in out if data is not None)
        self.stats.load_cpu_seconds += time.thread_time() - started
        return out

    def _push_all(self, items: list[tuple[int, bytes | memoryview]]) -> list[tuple[int, bytes | memoryview]]:
        """Push into the kernel page cache (worker thread: never on the loop that answers reads)."""
        assert self.push is not None
        started = time.thread_time()
        refused = []
        for row, data in items:
            try:
                self.push(row, data)
                self.stats.pushed_files += 1
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    log.warning("notify_store of %s failed: %s", self.index.location(row), exc)
                self.stats.push_refused += 1
                refused.append((row, data))
        self.stats.push_cpu_seconds += time.thread_time() - started
        return refused

    def snapshot(self) -> dict[str, object]:
        follows = {
            f"epoch-{key[0]}.rank-{key[2]}-of-{key[1]}": {
                "files": int(f.reading.rows.size),
                "cursor": f.cursor,
                "fetched": f.fetched,
                "lead_files": f.fetched - f.cursor,
                "lead_bytes": f.ahead_bytes(),
            }
            for key, f in self._follows.items()
        }
        return {
            **self.stats.as_dict(),
            "budget": self.budget,
            "inflight": self._inflight,
            "readings": follows,
        }
