"""Invariants of the published order over a grid of sizes, worlds, seeds and modes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlfs.core.order import OrderSpec, epoch_order, epoch_permutation

specs = st.builds(
    OrderSpec,
    seed=st.integers(0, 2**32),
    mode=st.sampled_from(["full", "block"]),
    block=st.integers(1, 50),
    window=st.integers(1, 200),
)


@settings(max_examples=200, deadline=None)
@given(count=st.integers(0, 3000), spec=specs, epoch=st.integers(0, 1000))
def test_an_epoch_is_a_permutation_and_deterministic(count: int, spec: OrderSpec, epoch: int) -> None:
    sequence = epoch_permutation(count, spec, epoch)
    assert np.array_equal(np.sort(sequence), np.arange(count))
    assert np.array_equal(sequence, epoch_permutation(count, spec, epoch))


@settings(max_examples=200, deadline=None)
@given(count=st.integers(0, 2000), spec=specs, epoch=st.integers(0, 100), world=st.integers(1, 9))
def test_ranks_are_equal_sized_disjoint_up_to_padding_and_cover_the_epoch(
    count: int, spec: OrderSpec, epoch: int, world: int
) -> None:
    shares = [epoch_order(count, spec, epoch, world, rank) for rank in range(world)]
    per_rank = -(-count // world)
    assert all(share.size == per_rank for share in shares)
    combined = np.concatenate(shares) if shares else np.array([])
    assert set(combined.tolist()) == set(range(count))
    padding = per_rank * world - count
    assert combined.size - np.unique(combined).size == padding


@pytest.mark.parametrize("mode", ["full", "block"])
def test_epochs_and_seeds_change_the_order(mode: str) -> None:
    spec = OrderSpec(seed=1, mode=mode, block=8, window=64)
    first = epoch_order(5000, spec, 0)
    assert not np.array_equal(first, epoch_order(5000, spec, 1))
    assert not np.array_equal(first, epoch_order(5000, OrderSpec(seed=2, mode=mode, block=8, window=64), 0))


def test_full_mode_splits_ranks_like_distributed_sampler() -> None:
    spec = OrderSpec(seed=3)
    whole = epoch_permutation(10, spec, 4)
    padded = np.concatenate([whole, whole[:2]])
    for rank in range(4):
        assert np.array_equal(epoch_order(10, spec, 4, 4, rank), padded[rank::4])


@pytest.mark.parametrize("mode", ["full", "block"])
@pytest.mark.parametrize(("count", "world"), [(10, 3), (10, 10), (5, 7), (3, 64), (1, 2)])
def test_a_world_larger_than_the_epoch_pads_by_wrapping(mode: str, count: int, world: int) -> None:
    spec = OrderSpec(seed=1, mode=mode, block=2, window=4)
    whole = epoch_permutation(count, spec, 0)
    per_rank = -(-count // world)
    padded = np.resize(whole, per_rank * world)
    for rank in range(world):
        expected = padded[rank::world] if mode == "full" else padded[rank * per_rank : (rank + 1) * per_rank]
        assert np.array_equal(epoch_order(count, spec, 0, world, rank), expected)


def test_a_huge_world_costs_only_the_ranks_share() -> None:
    """A billion ranks over ten files: one file each, computed without a billion-long sequence."""
    spec = OrderSpec(seed=1)
    whole = epoch_permutation(10, spec, 0)
    assert epoch_order(10, spec, 0, 10**9, 10**9 - 1).tolist() == [whole[(10**9 - 1) % 10]]


def test_block_mode_keeps_neighbours_together() -> None:
    spec = OrderSpec(seed=5, mode="block", block=16, window=1)
    sequence = epoch_permutation(1600, spec, 0)
    runs = sequence.reshape(100, 16)
    assert np.all(np.diff(runs, axis=1) == 1), "within each run of 16 the positions are consecutive"
    assert np.all(runs[:, 0] % 16 == 0)
    assert not np.array_equal(sequence, np.arange(1600)), "the runs themselves are shuffled"


def test_block_mode_window_shuffle_stays_local() -> None:
    spec = OrderSpec(seed=5, mode="block", block=1000, window=100)
    sequence = epoch_permutation(1000, spec, 0)
    assert all(set(sequence[k : k + 100]) == set(range(k, k + 100)) for k in range(0, 1000, 100))


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown order mode"):
        OrderSpec(mode="sorted")
    with pytest.raises(ValueError, match="rank"):
        epoch_order(10, OrderSpec(), 0, world_size=2, rank=2)


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_a_uniform_epoch_never_replays_the_random_placement(seed: int) -> None:
    """Pack's random placement and the epoch orders draw from separate streams of one seed: were
    they equal, an epoch would read the shards front to back while claiming to shuffle."""
    from dlfs.pack.placement import random_picks

    count = 2000
    storage_rank = np.empty(count, dtype=np.int64)  # files numbered in row order, as the epoch's
    storage_rank[random_picks(0, count, count, seed)] = np.arange(count)
    for epoch in range(3):
        ranks = storage_rank[epoch_order(count, OrderSpec(seed=seed), epoch)]
        assert np.mean(np.diff(ranks) == 1) < 0.01, f"epoch {epoch} reads the shards in order"


@settings(max_examples=200, deadline=None)
@given(count=st.integers(0, 2000), spec=specs, epoch=st.integers(0, 100), world=st.integers(1, 9))
def test_drop_last_gives_every_rank_floor_of_the_epoch_disjoint(
    count: int, spec: OrderSpec, epoch: int, world: int
) -> None:
    shares = [epoch_order(count, spec, epoch, world, rank, drop_last=True) for rank in range(world)]
    assert all(share.size == count // world for share in shares)
    combined = np.concatenate(shares)
    assert np.unique(combined).size == combined.size == count // world * world


def test_the_cli_offers_every_registered_mode_in_its_order() -> None:
    from dlfs.core.choices import ORDER_MODES
    from dlfs.core.order import MODES

    assert tuple(MODES) == ORDER_MODES
