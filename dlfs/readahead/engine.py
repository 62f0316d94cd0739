"""The read-ahead engine: follow each published sequence a reader is in, fetch ahead of it.

For every sequence being read on this node (an ``.dlfs/order`` file was resolved), the engine keeps
the next ``budget`` bytes of files fetched from storage, verified, and pushed into the kernel's page
cache with ``notify_store``. The reader's ``open``/``read`` of a pushed file then never reaches the
daemon at all. Where the kernel does not know a file's inode yet (it was never looked up), the push
is refused. So before fetching, the engine lists the files' directories through the mount, which
makes the kernel learn every entry at once (READDIRPLUS), unless a listing with attributes taught it
them already (a training job's ImageFolder scan); a directory is listed again only after the kernel
forgot one of its entries (``drop_caches``, memory pressure) and told the daemon so. A file
still refused waits in the daemon's cache for the read instead.

The reader's position is learned from the reads that do reach the daemon. Because pushed files are
invisible, every ``sentinel_every``-th file of a window is deliberately *not* pushed but kept in the
daemon's cache: reaching it costs the reader one quick round trip and tells the engine how far the
reader got, so the window moves on. Positions far behind the cursor mean the epoch restarted.

Storage is read in runs: a batch starts from the next files the reader needs and, where the order
keeps runs of neighbours together (``--order block``), adds each one's storage neighbours that the
reader will need soon, so a run is read once, whichever order the reader wants its files in.
Files of one shard at most ``COALESCE_GAP`` apart share a storage read; at most ``max_inflight``
batches run at once; bytes ahead of the reader never exceed the budget.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import trio

from dlfs import format as fmt
from dlfs.control import Reading
from dlfs.errors import DlfsError
from dlfs.index import Index
from dlfs.push import ALIGN, NativePusher
from dlfs.reader import Reader

log = logging.getLogger(__name__)

#: Storage reads of one shard are merged when the gap between two files is at most this.
COALESCE_GAP = 256 << 10
#: One fetch task covers up to this many bytes of upcoming files.
BATCH_BYTES = 8 << 20
BATCH_FILES = 256
#: Storage reads up to this size go into a buffer a batch borrows from a pool (one per batch in flight).
REUSED_BUFFER = 8 << 20
#: Files the C loop reads, checks and pushes per call; between calls, waiting READs are looked after.
#: Each call costs about a millisecond of Python around it: 256 rather than 32 gave +15 % files/s.
NATIVE_FILES = 256
#: How far (in files, each way in storage order) a batch looks for neighbours it can take along.
NEIGHBOURS = 64
#: Sequences followed at once (one per rank being read on this node); the oldest is dropped.
MAX_READINGS = 16
#: One file in this many is a sentinel (kept back from the page cache, so its READ shows where the
#: reader is); ``sentinel_spacing`` picks one. Primes, so that readers taking every N-th file, or
#: every N-th batch of B, all meet sentinels: at 64, with 8 readers each taking every 8th file, every
#: sentinel fell to reader 0, the cursor followed that one reader, and the read-ahead stopped at its
#: budget while the other seven drained it, then refilled all of it at once.
SENTINEL_SPACINGS = (13, 31, 61, 127, 251, 509, 1021)

Push = Callable[[int, bytes | memoryview], None]
#: Does the kernel already cache every page of this row's file?
InKernel = Callable[[int], bool]
#: Make the kernel learn every entry of this directory row (list it through the mount); False when
#: another listing had done it.
Reveal = Callable[[int], bool]


def sentinel_spacing(budget: int, mean_size: float) -> int:
    """The widest spacing of sentinels that still puts eight of them within the budget.

    Each sentinel's READ is a round trip through a daemon busy pushing (1-3 ms): at one file in 61,
    a single reader spent half its warm epoch on them (20k JPEGs: 328 sentinels, 1.23 of 2.16 s).
    The cursor lags the reader by up to one spacing, which a budget holding eight absorbs. The
    default budget and ImageNet-sized files give 509.
    """
    files = budget / max(mean_size, 1.0)
    fitting = [every for every in SENTINEL_SPACINGS if 8 * every <= files]
    return fitting[-1] if fitting else SENTINEL_SPACINGS[0]


@dataclass
class _Follow:
    """Where one published sequence stands.

    The reader got to ``cursor``. Every position below ``fetched`` was fetched or passed over; above
    it, ``done`` marks the files fetched early as neighbours of others. ``ahead`` counts the bytes
    fetched at or past the cursor: what the budget bounds.
    """

    reading: Reading
    position: np.ndarray  # row -> first position in the sequence, or -1 (int32: 5 MB per 1.28 M rows)
    sizes: np.ndarray  # cumulative bytes of the sequence, for O(1) window sizes
    done: np.ndarray  # position -> fetched (meaningful from ``fetched`` on)
    cursor: int = 0
    fetched: int = 0
    ahead: int = 0

    def size_at(self, positions: np.ndarray) -> np.ndarray:
        return self.sizes[positions + 1] - self.sizes[positions]

    def mark(self, positions: np.ndarray) -> None:
        """These files are being fetched; move ``fetched`` past every fetched position."""
        self.done[positions] = True
        self.ahead += int(self.size_at(positions[positions >= self.cursor]).sum())
        tail = self.done[self.fetched :]
        self.fetched += int(np.argmin(tail)) if not tail.all() else tail.size

    def advance(self, pos: int) -> None:
        """The reader got to ``pos``: what it passed no longer counts against the budget."""
        span = np.arange(self.cursor, pos)
        self.ahead -= int(self.size_at(span[self.done[span]]).sum())
        self.cursor = pos

    def skip_to(self, pos: int) -> None:
        """Fetch from ``pos`` on: a reader jumped there, the files before it are not wanted."""
        span = np.arange(self.fetched, pos)
        self.ahead -= int(self.size_at(span[self.done[span]]).sum())
        self.fetched = pos

    def restart(self, pos: int) -> None:
        self.cursor = self.fetched = pos
        self.done[pos:] = False
        self.ahead = 0

    def lost(self, positions: np.ndarray) -> None:
        """Fetched files the kernel dropped before the reader came: fetch them again."""
        self.done[positions] = False
        self.ahead -= int(self.size_at(positions).sum())
        self.fetched = min(self.fetched, int(positions.min()))


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
    handed_over: int = 0
    cold_batches: int = 0
    native_cpu_seconds: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in self.__dict__.items()}


class Prefetcher:
    def __init__(
        self,
        index: Index,
        reader: Reader,
        push: Push | None,
        budget: int = 512 << 20,
        max_inflight: int = 16,
        in_kernel: InKernel | None = None,
        reveal: Reveal | None = None,
    ) -> None:
        self.index = index
        self.reader = reader
        self.push = push
        #: The C loop for pushing, once the mount is live (it needs the session's descriptor).
        self.native: NativePusher | None = None
        self.in_kernel = in_kernel
        self.reveal = reveal
        self._known = np.zeros(index.count, dtype=bool)  # the kernel learnt it from a listing
        self._listing = threading.Lock()
        self._buffers = threading.local()  # the buffer a fetching thread holds for its batch
        self._spare_buffers: collections.deque[np.ndarray] = collections.deque()  # held by no batch now
        self.budget = budget
        self.max_inflight = max_inflight
        self.stats = PrefetchStats()
        self._near = np.concatenate([np.arange(-NEIGHBOURS, 0), np.arange(1, NEIGHBOURS + 1)])
        self._follows: dict[tuple[int, int, int], _Follow] = {}
        self._inflight = 0
        # Shared by the event loop and the fetching threads (see ``arrival``): rows whose storage
        # group is not loaded yet, READs waiting for one of them, and files handed to those READs.
        self._handoff = threading.Lock()
        self._pending: set[int] = set()
        self._waiting: dict[int, trio.Event] = {}
        self._handed: dict[int, bytes] = {}
        self._wake = trio.Event()

    @functools.cached_property
    def sentinel_every(self) -> int:
        """One file in this many is a sentinel (``sentinel_spacing``). Worked out when first needed,
        not at mount start-up: the mean file size of 1.28 M files took 40 ms there."""
        sizes = self.index.size[self.index.regular_rows()]
        return sentinel_spacing(self.budget, float(sizes.mean()) if sizes.size else 0.0)

    @functools.cached_property
    def _storage(self) -> tuple[np.ndarray, np.ndarray]:
        """Regular files' rows in storage order, and each row's place in it (-1: not a file).

        Built when the first order with runs of neighbours is followed: only neighbours need it,
        and at 5 MB per million rows each, a uniform order should not pay for it.
        """
        by_storage = self.index.file_rows().astype(np.int32)
        rank = np.full(self.index.count, -1, dtype=np.int32)
        rank[by_storage] = np.arange(by_storage.size, dtype=np.int32)
        return by_storage, rank

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
        done = np.zeros(reading.rows.size, dtype=bool)
        self._follows[key] = _Follow(reading, position, sizes, done)
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
        cursor is the furthest position seen. A read behind it is a slower worker, unless it is one
        of the sequence's first two sentinels while the cursor is a window past it: then the epoch
        restarted. Sentinels are never pushed, so a reader starting over always reaches them; a
        slow worker a window behind is common, one still at the very start is not.

        A read beyond what was fetched moves the fetching there only when it is more than a window
        ahead (a reader skipped); a nearer one is a fast worker, and the files behind it are exactly
        what the others need next, so they are still fetched.
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
                    follow.skip_to(pos)
                self.stats.used_files += pos - follow.cursor
                follow.advance(pos)
            elif pos in (0, self.sentinel_every) and self._window_files(follow) <= follow.cursor - pos:
                log.debug("read of position %d, cursor at %d: the epoch restarted", pos, follow.cursor)
                self.stats.restarts += 1
                follow.restart(pos)
        self._wake.set()

    async def arrival(self, row: int) -> None:
        """Before a READ of ``row`` is served: if a batch in flight is loading the file, wait for it
        and take it from there (it lands in the payload cache).

        Readers that catch up with the read-ahead ask for files it is fetching at that moment, and
        loading them again for the READ doubles the work of a daemon short of CPU exactly then
        (8 readers, warm storage: 2,355 of 20,000 files loaded twice). The READ must not wait for
        the push, though: the kernel keeps the file's pages locked until the READ is answered, so
        a push of them would wait for the READ that waits for it. So the batch hands the file over
        as soon as its storage read is verified, and does not push it.
        """
        with self._handoff:
            if row not in self._pending:
                return
            arrived = self._waiting.setdefault(row, trio.Event())
        try:
            await arrived.wait()
        finally:
            with self._handoff:
                data = self._handed.pop(row, None)
                if self._waiting.get(row) is arrived:
                    del self._waiting[row]
        if data is not None:
            self.reader.cache.put(row, data)
            self.stats.handed_over += 1

    def _hand_over(self, rows: list[int], loaded: list[tuple[int, int, bytes | memoryview]]) -> set[int]:
        """In a fetching thread, once a storage group is loaded: the READs waiting for its ``rows``
        get their file (or, for a file that did not load, go and read it themselves); returns the
        rows handed over, which are not pushed."""
        with self._handoff:
            self._pending.difference_update(rows)
            if not self._waiting:
                return set()
            handed = {row: bytes(data) for _, row, data in loaded if row in self._waiting}
            self._handed.update(handed)
            woken = [self._waiting[row] for row in rows if row in self._waiting]
        if woken:
            trio.from_thread.run_sync(_set_all, woken)
        return set(handed)

    def listed(self, rows: range) -> None:
        """A READDIRPLUS reply taught the kernel these entries (a training job's ImageFolder scan,
        say): the read-ahead need not list their directory again before pushing them."""
        self._known[rows.start : rows.stop] = True

    def forgotten(self, rows: np.ndarray) -> None:
        """The kernel dropped these entries, and with them any pages pushed for them.

        Their directories must be listed again before one of them is pushed, and pushed files still
        ahead of a reader are fetched again (the batches the kernel does keep are skipped cheaply
        then).
        """
        self._known[rows] = False
        for follow in self._follows.values():
            positions = follow.position[rows]
            positions = positions[positions >= follow.cursor]
            lost = positions[follow.done[positions] | (positions < follow.fetched)]
            if lost.size:
                self.stats.forgotten_ahead += int(lost.size)
                follow.lost(lost)
                self._wake.set()

    def _window_files(self, follow: _Follow) -> int:
        ahead = np.searchsorted(follow.sizes, follow.sizes[follow.cursor] + self.budget)
        return max(int(ahead) - follow.cursor, self.sentinel_every)

    def _drop(self, follow: _Follow) -> None:
        self.stats.wasted_files += int(follow.done[follow.cursor :].sum())

    async def run(self) -> None:
        """Background task: keep every followed window full. Runs until cancelled."""
        async with trio.open_nursery() as nursery:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                for follow in list(self._follows.values()):
                    while self._inflight < self.max_inflight and follow.fetched < follow.reading.rows.size:
                        positions = self._next_batch(follow)
                        if positions is None:
                            break
                        self._inflight += 1
                        nursery.start_soon(self._fetch, follow, positions)

    def _next_batch(self, follow: _Follow) -> np.ndarray | None:
        """Positions to fetch next, sorted; None while the budget is spent.

        The first files not yet fetched are the seeds, and each seed brings along its storage
        neighbours that the reader needs before the budget's horizon: fetched now, they cost part
        of one storage read; fetched in their turn, a read each. Seeds are taken in the reader's
        order until the batch holds ``BATCH_BYTES``, so a batch is a run or two of neighbours when
        the order keeps runs close (``--order block``), and the next files in order when it does not.
        """
        room = self.budget - follow.ahead
        start, total = follow.fetched, follow.reading.rows.size
        if room <= 0 or start >= total:
            return None
        base = follow.sizes[min(follow.cursor, start)]
        horizon = int(np.searchsorted(follow.sizes, base + self.budget, side="right")) - 1
        horizon = min(max(horizon, start + 1), total)  # at least one file, even one over the budget
        span = np.arange(start, min(start + BATCH_FILES, horizon))
        seeds = span[~follow.done[span]]
        # Neighbours only where the order keeps runs together: elsewhere they are scattered over
        # the horizon, and reading the gaps between them costs more than the IOs it saves.
        if follow.reading.window:
            by_storage, rank = self._storage
            near = rank[follow.reading.rows[seeds]][:, None] + self._near
            np.clip(near, 0, by_storage.size - 1, out=near)
            mates = follow.position[by_storage[near]]
        else:
            mates = np.empty((seeds.size, 0), dtype=follow.position.dtype)
        # Within the budget's horizon or the order's window: a block's files are spread over a
        # whole window, and a horizon sliding into the next window holds only a few of each.
        wanted = (mates >= start) & (mates < max(horizon, start + follow.reading.window))
        mates[~wanted] = start
        wanted &= ~follow.done[mates]
        cost = np.cumsum(follow.size_at(seeds) + np.where(wanted, follow.size_at(mates), 0).sum(axis=1))
        take = max(int(np.searchsorted(cost, min(BATCH_BYTES, room), side="right")), int(cost[0] <= room))
        if take == 0 and start - follow.cursor > 2 * self.sentinel_every:
            return None  # wait until the reader frees room for the whole run
        if take == 0:  # the reader is close: the seed, and those of its neighbours needed first that fit
            first = np.sort(mates[0][wanted[0]])
            fit = np.cumsum(follow.size_at(first)) <= room - int(follow.size_at(seeds[:1])[0])
            positions = np.unique(np.concatenate([seeds[:1], first[fit]]))
        else:
            positions = np.unique(np.concatenate([seeds[:take], mates[:take][wanted[:take]]]))
        follow.mark(positions)
        return positions

    async def _fetch(self, follow: _Follow, positions: np.ndarray) -> None:
        rows = follow.reading.rows[positions]
        row_list = rows.tolist()
        with self._handoff:
            self._pending.update(row_list)
        try:
            sentinel = (positions % self.sentinel_every == 0) | (self.push is None)
            held = await trio.to_thread.run_sync(self._fetch_blocking, positions, rows, sentinel)
            for row, data in held:
                self.reader.cache.put(row, data)
            self.stats.held_files += len(held)
        finally:
            with self._handoff:  # files the batch skipped or failed to load: their READs go on
                self._pending.difference_update(row_list)
                woken = [self._waiting[row] for row in row_list if row in self._waiting]
            _set_all(woken)
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

        Files the C loop can push (see ``dlfs.push``) go there; the rest (sentinels, compressed or
        big files, a store without descriptors) take the Python path.
        """
        with self._buffer_lent():
            return self._fetch_batch(positions, rows, sentinel)

    def _fetch_batch(
        self, positions: np.ndarray, rows: np.ndarray, sentinel: np.ndarray
    ) -> list[tuple[int, bytes]]:
        self._reveal_dirs(rows)
        pushable = np.flatnonzero(~sentinel)  # positions come sorted
        if self._in_kernel(rows[pushable[[0, -1]]] if pushable.size else pushable):
            log.debug("positions %d-%d: the kernel holds them already", positions[0], positions[-1])
            self.stats.already_cached += int(pushable.size)
            positions, rows, sentinel = positions[sentinel], rows[sentinel], sentinel[sentinel]
        native = self._natively(rows, sentinel)
        held = self._fetch_in_python(positions[~native], rows[~native], sentinel[~native])
        if native.any():
            held += self._fetch_natively(positions[native], rows[native])
        return held

    def _fetch_in_python(
        self, positions: np.ndarray, rows: np.ndarray, sentinel: np.ndarray
    ) -> list[tuple[int, bytes]]:
        started, pushing = time.thread_time(), 0.0
        held: list[tuple[int, bytes]] = []
        sentinels = sentinel.tolist()
        for read_rows, loaded in self._load(rows, positions):
            handed = self._hand_over(read_rows, loaded)
            keep: list[tuple[int, bytes | memoryview]] = []
            to_push: list[tuple[int, bytes | memoryview]] = []
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

    def _natively(self, rows: np.ndarray, sentinel: np.ndarray) -> np.ndarray:
        """Which files of a batch the C loop takes: pushed, stored plain, small enough to hold
        whole, in a shard with a descriptor."""
        if self.native is None or not rows.size:
            return np.zeros(rows.size, dtype=bool)
        index = self.index
        return (
            ~sentinel
            & (index.flags[rows] & fmt.FLAG_LZ4 == 0)
            & (index.size[rows] <= fmt.WHOLE_PAYLOAD_LIMIT)
            & (self._descriptors[0, index.shard[rows]] >= 0)
        )

    @functools.cached_property
    def _descriptors(self) -> np.ndarray:
        """Each shard's descriptors for the C loop, through the page cache and direct (rows), or
        -1 (a store without, a shard that fails, a filesystem without direct I/O)."""
        fds = np.full((2, len(self.index.shard_names)), -1, dtype=np.int32)
        for shard, name in enumerate(self.index.shard_names):
            try:
                for direct in (0, 1):
                    fd = self.reader.store.descriptor(name, direct=bool(direct))
                    fds[direct, shard] = -1 if fd is None else fd
            except DlfsError as exc:
                log.warning("reading ahead of %s in Python: %s", name, exc)
        return fds

    def _fetch_natively(self, positions: np.ndarray, rows: np.ndarray) -> list[tuple[int, bytes]]:
        """Read, check and push files in C, a few storage reads per call, in the order the reader
        needs them.

        Before each call its files leave ``_pending``: a READ of one of them from then on reads the
        file itself instead of waiting, because the push would wait for that READ (the kernel locks
        the pages it reads into). A READ already waiting keeps its file: the C loop skips it and the
        Python path hands it over. Files the kernel refused (it forgot their inode) are held in the
        daemon's cache instead, through the Python path too.
        """
        assert self.native is not None
        started = time.thread_time()
        index = self.index
        groups, spans, _, _ = self._storage_reads(rows, positions)
        order = np.fromiter((i for group in groups for i in group), dtype=np.int64, count=rows.size)
        read_ends = np.cumsum([len(group) for group in groups], dtype=np.int32)
        read_rows, read_starts, read_lengths = np.array(spans, dtype=np.int64).T
        reads = np.stack([*self._descriptors[:, index.shard[read_rows]], read_starts, read_lengths])
        rows, positions = rows[order], positions[order]
        starts, lengths, checksums = index.offset[rows], index.stored[rows], index.checksum[rows]
        deferred: list[np.ndarray] = []
        cold = False
        for first, last in self._chunks(read_ends, NativePusher.buffer_shares(read_starts, read_lengths)):
            done = int(read_ends[first - 1]) if first else 0
            span = slice(done, int(read_ends[last - 1]))
            with self._handoff:
                waited = np.array([row in self._waiting for row in rows[span].tolist()], dtype=bool)
                self._pending.difference_update(rows[span][~waited].tolist())
            status, went_direct = self.native.push(
                self._buffer(self.native.buffer_size(reads[2, first:last], reads[3, first:last])),
                (*reads[:, first:last], read_ends[first:last] - done),
                (starts[span], lengths[span], checksums[span], np.where(waited, -1, rows[span])),
            )
            if went_direct and not cold:
                cold = True
                self.stats.cold_batches += 1
            self._count_native(rows[span][~waited], status[~waited])
            deferred.append(np.flatnonzero(waited | (status == errno.ENOENT)) + done)
            self.stats.storage_reads += last - first
        self.stats.native_cpu_seconds += time.thread_time() - started
        again = np.concatenate(deferred)
        return self._fetch_in_python(positions[again], rows[again], np.ones(again.size, dtype=bool))

    @staticmethod
    def _chunks(read_ends: np.ndarray, sizes: np.ndarray) -> Iterator[tuple[int, int]]:
        """Runs of whole storage reads, as (first, last), each holding about ``NATIVE_FILES``
        files and fitting the reused buffer with room to align (``sizes``: each read's share of
        it), or a single read."""
        first, used = 0, np.concatenate([[0], np.cumsum(sizes)])
        while first < read_ends.size:
            done = int(read_ends[first - 1]) if first else 0
            by_files = int(np.searchsorted(read_ends, done + NATIVE_FILES, side="left")) + 1
            by_bytes = int(np.searchsorted(used, used[first] + REUSED_BUFFER - ALIGN, side="right")) - 1
            last = min(max(min(by_files, by_bytes), first + 1), read_ends.size)
            yield first, last
            first = last

    def _count_native(self, rows: np.ndarray, status: np.ndarray) -> None:
        pushed = status == 0
        self.stats.pushed_files += int(pushed.sum())
        self.stats.issued_files += int(pushed.sum())
        self.stats.issued_bytes += int(self.index.size[rows[pushed]].sum())
        self.stats.push_refused += int((status == errno.ENOENT).sum())
        # A damaged file (EIO) is reported by its own read.
        failed = ~pushed & (status != errno.ENOENT) & (status != errno.EIO)
        for row, code in zip(rows[failed].tolist(), status[failed].tolist(), strict=True):
            log.warning("read-ahead of %s failed: %s", self.index.location(row), os.strerror(code))

    def _in_kernel(self, rows: np.ndarray) -> bool:
        return self.in_kernel is not None and rows.size > 0 and all(map(self.in_kernel, rows.tolist()))

    def _reveal_dirs(self, rows: np.ndarray) -> None:
        """List the directories of those ``rows`` the kernel may not know: never listed, or
        forgotten since.

        A listing teaches the kernel every entry in a few requests instead of a LOOKUP per file.
        """
        if self.reveal is None:
            return
        with self._listing:  # batches fetched side by side share directories: list each once
            dirs = np.unique(self.index.parent[rows[~self._known[rows]]])
            for row in dirs.tolist():
                self.stats.revealed_dirs += self.reveal(row)
                children = self.index.children(row)
                self._known[children.start : children.stop] = True

    @staticmethod
    def _groups(
        by_place: list[int], offsets: list[int], ends: list[int], shards: list[int], need: list[int]
    ) -> list[list[int]]:
        """Files by storage read: neighbours in one shard share one, and the read holding the
        earliest-needed file comes first. ``by_place`` lists the files in (shard, offset) order.

        Plain lists: a batch is a few hundred files, and per-file numpy calls cost more than the
        arithmetic they would vectorise."""
        groups: list[list[int]] = []
        for i in by_place:
            group = groups[-1] if groups else None
            if (
                group is not None
                and shards[i] == shards[group[0]]
                and offsets[i] - ends[group[-1]] <= COALESCE_GAP
                and ends[i] - offsets[group[0]] <= 2 * BATCH_BYTES
            ):
                group.append(i)
            else:
                groups.append([i])
        groups.sort(key=lambda group: min(need[i] for i in group))
        return groups

    def _storage_reads(
        self, rows: np.ndarray, need: np.ndarray
    ) -> tuple[list[list[int]], list[tuple[int, int, int]], list[int], list[int]]:
        """How to read these files from storage: groups of indices into ``rows`` (see ``_groups``),
        each group's read as (first row, shard offset, length), and each file's stored bytes as
        shard offsets (start, end)."""
        shard_column = self.index.shard[rows]
        offset_column = self.index.offset[rows].astype(np.int64)
        end_column = offset_column + self.index.stored[rows].astype(np.int64)
        by_place = np.lexsort((offset_column, shard_column)).tolist()
        row_list, offsets, ends = rows.tolist(), offset_column.tolist(), end_column.tolist()
        groups = self._groups(by_place, offsets, ends, shard_column.tolist(), need.tolist())
        spans = [(row_list[g[0]], offsets[g[0]], max(ends[i] for i in g) - offsets[g[0]]) for g in groups]
        return groups, spans, offsets, ends

    def _load(
        self, rows: np.ndarray, need: np.ndarray
    ) -> Iterator[tuple[list[int], list[tuple[int, int, bytes | memoryview]]]]:
        """Fetch, verify and decode files, one storage read at a time: per read, the rows it
        covered and (index into ``rows``, row, payload) for each file ``_decode`` gave.

        Files come back as views into the storage read where they are stored plain, valid until
        the next read is asked for (the buffer is reused): a push copies them into the page cache
        anyway, so copying them out first would be one copy too many.

        The first read of a batch only takes what is in memory already; when that fails, storage
        is slow (a cold cache, a disk), and the rest of the batch is announced to it at once, so
        its reads overlap instead of queueing behind one another (cold, 8 readers: +20 % files/s).
        Announcing them always cost a warm read-ahead 10 %.
        """
        groups, spans, offsets, ends = self._storage_reads(rows, need)
        row_list = rows.tolist()
        hinted = False
        for k, (group, (first, begin, length)) in enumerate(zip(groups, spans, strict=True)):
            self.stats.storage_reads += 1
            buffer = memoryview(self._buffer(length))[:length]
            try:
                got = self.reader.fetch_into(first, begin, buffer, wait=False)
                if got is None:
                    if not hinted:  # storage is slow: from here on, it works on all of the batch at once
                        hinted = True
                        self.stats.cold_batches += 1
                        self._hint(spans[k:])
                    got = self.reader.fetch_into(first, begin, buffer)
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

    def _hint(self, spans: list[tuple[int, int, int]]) -> None:
        for span in spans:
            with contextlib.suppress(DlfsError):  # the read of the same range reports it
                self.reader.will_fetch(*span)

    @contextlib.contextmanager
    def _buffer_lent(self) -> Iterator[None]:
        """Lend this thread a ``REUSED_BUFFER`` for its batch's storage reads.

        A fresh buffer per read cost page faults and allocator work on every file, in a daemon
        short of CPU (one per C call: 0.12 s of 3 in a cold epoch). Buffers go back to a pool
        when the batch is done, so there are never more buffers than batches in flight,
        whichever of trio's worker threads runs them.
        """
        try:
            self._buffers.buffer = self._spare_buffers.pop()  # deque: safe across threads
        except IndexError:
            self._buffers.buffer = np.empty(REUSED_BUFFER, dtype=np.uint8)
        try:
            yield
        finally:
            self._spare_buffers.append(self._buffers.buffer)
            del self._buffers.buffer

    def _buffer(self, length: int) -> np.ndarray:
        """Where storage reads go (a Python read of a file or a few, a C call's reads side by
        side): the buffer lent to this thread, or for a bigger read (block order coalesces
        megabytes) one of its own."""
        buffer: np.ndarray = self._buffers.buffer
        return buffer if length <= buffer.size else np.empty(length, dtype=np.uint8)

    def _decode(self, row: int, stored: memoryview) -> bytes | memoryview | None:
        """A verified file, or None: too big to hold whole, or damaged (its own read fails with EIO)."""
        if not self.reader.is_whole(row):
            return None
        try:
            return self.reader.decode(row, stored)
        except DlfsError:
            return None

    def _push_all(self, items: list[tuple[int, bytes | memoryview]]) -> list[tuple[int, bytes | memoryview]]:
        """Push into the kernel page cache (worker thread: never on the loop that answers reads)."""
        assert self.push is not None
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
        return refused

    def snapshot(self) -> dict[str, object]:
        follows = {
            f"epoch-{key[0]}.rank-{key[2]}-of-{key[1]}": {
                "files": int(f.reading.rows.size),
                "cursor": f.cursor,
                "fetched": f.fetched,
                "lead_files": int(f.done[f.cursor :].sum()),
                "lead_bytes": f.ahead,
            }
            for key, f in self._follows.items()
        }
        return {
            **self.stats.as_dict(),
            "budget": self.budget,
            "sentinel_every": self.sentinel_every,
            "inflight": self._inflight,
            "readings": follows,
        }


def _set_all(events: list[trio.Event]) -> None:
    for event in events:
        event.set()
