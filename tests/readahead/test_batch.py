"""Batch planning without a mount: which files to fetch next, within the budget and the order's
window; and the spacing of the sentinels."""

from __future__ import annotations

import numpy as np
import pytest

from dlfs.core.protocol import Reading
from dlfs.readahead.batch import (
    BATCH_BYTES,
    BATCH_FILES,
    SENTINEL_SPACINGS,
    StorageNeighbours,
    next_batch,
    sentinel_spacing,
)
from dlfs.readahead.cursor import Follow

EVERY = 13


class _StorageOrder:
    """The part of an ``Index`` ``StorageNeighbours`` reads: rows 0..count-1 stored in row order."""

    def __init__(self, count: int) -> None:
        self.count = count

    def file_rows(self) -> np.ndarray:
        return np.arange(self.count)


def _follow(rows: np.ndarray, size: int, window: int = 0) -> Follow:
    sizes = np.full(rows.size, size, dtype=np.int64)
    return Follow.start(Reading(epoch=0, world_size=1, rank=0, rows=rows, window=window), sizes)


def _plan_all(follow: Follow, budget: int, neighbours: StorageNeighbours) -> list[np.ndarray]:
    """Plan and mark batches until the planner waits for the reader."""
    batches = []
    while (positions := next_batch(follow, budget, EVERY, neighbours)) is not None:
        follow.mark(positions)
        batches.append(positions)
    return batches


def test_batches_fill_the_budget_in_the_readers_order_and_stop_there() -> None:
    size, budget = 10_000, 1 << 20
    follow = _follow(np.arange(2000), size)
    neighbours = StorageNeighbours(_StorageOrder(2000))  # type: ignore[arg-type]
    batches = _plan_all(follow, budget, neighbours)
    taken = np.concatenate(batches)
    assert taken.tolist() == list(range(taken.size)), "the next files in order, each once"
    assert follow.ahead == taken.size * size <= budget < follow.ahead + size
    for positions in batches:
        assert positions.size <= BATCH_FILES and positions.size * size <= BATCH_BYTES
    follow.advance(30)  # the reader frees 30 files' room
    more = _plan_all(follow, budget, neighbours)
    assert np.concatenate(more).tolist() == list(range(taken.size, taken.size + 30))
    assert follow.ahead <= budget


def test_one_file_is_fetched_even_when_it_is_larger_than_the_budget() -> None:
    follow = _follow(np.arange(10), 5 << 20)
    neighbours = StorageNeighbours(_StorageOrder(10))  # type: ignore[arg-type]
    assert [b.tolist() for b in _plan_all(follow, 1 << 20, neighbours)] == [[0]]
    follow.advance(1)
    assert next_batch(follow, 1 << 20, EVERY, neighbours) is not None


def test_nothing_is_planned_past_the_end_or_while_the_budget_is_spent() -> None:
    follow = _follow(np.arange(5), 1000)
    neighbours = StorageNeighbours(_StorageOrder(5))  # type: ignore[arg-type]
    assert np.concatenate(_plan_all(follow, 1 << 20, neighbours)).tolist() == [0, 1, 2, 3, 4]
    assert next_batch(follow, 1 << 20, EVERY, neighbours) is None
    spent = _follow(np.arange(100), 1000)
    spent.mark(np.arange(10))
    assert next_batch(spent, 10_000, EVERY, neighbours) is None


def test_a_block_order_batch_takes_the_seeds_storage_neighbours_along() -> None:
    """Runs of 20 neighbours shuffled within a window of 200: a batch holds the runs of its seeds
    whole, read once, whatever order the reader wants their files in; without a window it holds
    the next files in order only."""
    rng = np.random.default_rng(0)
    runs = np.arange(400).reshape(20, 20)
    rows = np.concatenate([rng.permutation(runs[w : w + 10].ravel()) for w in (0, 10)])
    size = BATCH_BYTES // 40  # a batch holds 40 files, or one seed and all its neighbours
    neighbours = StorageNeighbours(_StorageOrder(400))  # type: ignore[arg-type]
    first = next_batch(_follow(rows, size, window=200), 64 << 20, EVERY, neighbours)
    assert first is not None and (first < 200).all(), "neighbours from the order's window only"
    assert set(range(20 * (rows[0] // 20), 20 * (rows[0] // 20) + 20)) <= set(rows[first].tolist())
    assert first[-1] > first.size, "neighbours needed later come along"
    plain = next_batch(_follow(rows, size), 64 << 20, EVERY, neighbours)
    assert plain is not None and plain.tolist() == list(range(40))


@pytest.mark.parametrize("every", SENTINEL_SPACINGS)
@pytest.mark.parametrize("batch", [1, 32, 64])
@pytest.mark.parametrize("readers", [2, 4, 8, 12, 16, 32])
def test_every_reader_of_a_sequence_meets_sentinels(readers: int, batch: int, every: int) -> None:
    """DataLoader workers take every N-th item (or batch of B): each must meet sentinels, or the
    cursor follows one worker only (at one file in 64, 8 workers taking single files left all
    sentinels to worker 0)."""
    sentinels = np.arange(0, 64 * every * readers * batch, every)
    assert set((sentinels // batch % readers).tolist()) == set(range(readers))


def test_sentinels_are_as_sparse_as_the_budget_allows() -> None:
    """Eight spacings fit in the budget; the default budget and ImageNet-sized files give 509."""
    assert sentinel_spacing(512 << 20, 110_000) == 509
    assert sentinel_spacing(64 << 20, 20_000) == 251
    assert sentinel_spacing(1 << 20, 110_000) == SENTINEL_SPACINGS[0]  # a budget of a few files
    assert sentinel_spacing(512 << 20, 0.0) == SENTINEL_SPACINGS[-1]  # empty files
    for budget in (1 << 20, 64 << 20, 512 << 20, 4 << 30):
        every = sentinel_spacing(budget, 110_000)
        assert every == SENTINEL_SPACINGS[0] or 8 * every * 110_000 <= budget
