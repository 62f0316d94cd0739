"""Batch planning: which files of a followed sequence to fetch next, within the budget.

Storage is read in runs: a batch starts from the next files the reader needs and, where the order
keeps runs of neighbours together (``--order block``), adds each one's storage neighbours that the
reader will need soon, so a run is read once, whichever order the reader wants its files in.
Nothing here does I/O.
"""

from __future__ import annotations

import functools

import numpy as np

from dlfs.core.index import Index
from dlfs.readahead.cursor import Follow

#: One fetch task covers up to this many bytes of upcoming files.
BATCH_BYTES = 8 << 20
BATCH_FILES = 256
#: How far (in files, each way in storage order) a batch looks for neighbours it can take along.
NEIGHBOURS = 64
#: One file in this many is a sentinel (kept back from the page cache, so its READ shows where the
#: reader is); ``sentinel_spacing`` picks one. Primes, so that readers taking every N-th file, or
#: every N-th batch of B, all meet sentinels: at 64, with 8 readers each taking every 8th file, every
#: sentinel fell to reader 0, the cursor followed that one reader, and the read-ahead stopped at its
#: budget while the other seven drained it, then refilled all of it at once.
SENTINEL_SPACINGS = (13, 31, 61, 127, 251, 509, 1021)


def sentinel_spacing(budget: int, mean_size: float) -> int:
    """The widest spacing of sentinels that still puts eight of them within the budget.

    Each sentinel's READ is a round trip through a daemon busy pushing, and a warm reader waits
    for every one of them: sentinels close together cost a warm epoch a large share of its time
    (docs/design.md, the read-ahead). The cursor lags the reader by up to one spacing, which a budget holding
    eight absorbs. The default budget and ImageNet-sized files give 509.
    """
    files = budget / max(mean_size, 1.0)
    fitting = [every for every in SENTINEL_SPACINGS if 8 * every <= files]
    return fitting[-1] if fitting else SENTINEL_SPACINGS[0]


def sentinels(positions: np.ndarray, every: int) -> np.ndarray:
    """Which of these positions are sentinels: kept back from the page cache."""
    return positions % every == 0


class StorageNeighbours:
    """Each file's neighbours in storage order, the files a storage read of it can take along."""

    def __init__(self, index: Index) -> None:
        self.index = index
        self._near = np.concatenate([np.arange(-NEIGHBOURS, 0), np.arange(1, NEIGHBOURS + 1)])

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

    def of(self, rows: np.ndarray) -> np.ndarray:
        """Rows ``NEIGHBOURS`` each way of each of ``rows`` in storage order (clipped at the ends),
        one line per row."""
        by_storage, rank = self._storage
        near = rank[rows][:, None] + self._near
        np.clip(near, 0, by_storage.size - 1, out=near)
        return by_storage[near]


def next_batch(
    follow: Follow, budget: int, sentinel_every: int, neighbours: StorageNeighbours
) -> np.ndarray | None:
    """Positions to fetch next, sorted; None while the budget is spent. Marks nothing: the caller
    marks the positions it fetches (``Follow.mark``).

    The first files not yet fetched are the seeds, and each seed brings along its storage
    neighbours that the reader needs before the budget's horizon: fetched now, they cost part
    of one storage read; fetched in their turn, a read each. Seeds are taken in the reader's
    order until the batch holds ``BATCH_BYTES``, so a batch is a run or two of neighbours when
    the order keeps runs close (``--order block``), and the next files in order when it does not.
    """
    room = budget - follow.ahead
    start, total = follow.fetched, follow.total
    if room <= 0 or start >= total:
        return None
    base = follow.sizes[min(follow.cursor, start)]
    horizon = int(np.searchsorted(follow.sizes, base + budget, side="right")) - 1
    horizon = min(max(horizon, start + 1), total)  # at least one file, even one over the budget
    span = np.arange(start, min(start + BATCH_FILES, horizon))
    seeds = span[~follow.done[span]]
    # Neighbours only where the order keeps runs together: elsewhere they are scattered over the
    # horizon, and reading the gaps between them costs more than the IOs it saves.
    if follow.reading.window:
        mates = follow.position[neighbours.of(follow.reading.rows[seeds])]
    else:
        mates = np.empty((seeds.size, 0), dtype=follow.position.dtype)
    # Within the budget's horizon or the order's window: a block's files are spread over a whole
    # window, and a horizon sliding into the next window holds only a few of each.
    wanted = (mates >= start) & (mates < max(horizon, start + follow.reading.window))
    mates[~wanted] = start
    wanted &= ~follow.done[mates]
    cost = np.cumsum(follow.size_at(seeds) + np.where(wanted, follow.size_at(mates), 0).sum(axis=1))
    take = max(int(np.searchsorted(cost, min(BATCH_BYTES, room), side="right")), int(cost[0] <= room))
    if take == 0 and start - follow.cursor > 2 * sentinel_every:
        return None  # wait until the reader frees room for the whole run
    if take == 0:  # the reader is close: the seed, and those of its neighbours needed first that fit
        first = np.sort(mates[0][wanted[0]])
        fit = np.cumsum(follow.size_at(first)) <= room - int(follow.size_at(seeds[:1])[0])
        return np.unique(np.concatenate([seeds[:1], first[fit]]))
    return np.unique(np.concatenate([seeds[:take], mates[:take][wanted[:take]]]))
