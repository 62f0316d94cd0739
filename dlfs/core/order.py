"""The epoch order: which files a rank reads, in which order. Pure functions, no state.

The mount publishes this order and the PyTorch sampler follows it, so the read-ahead engine knows
the future. Everything is a function of (file count or storage layout, seed, epoch, world size,
rank, mode): the same inputs give the same sequence in any process.

Distributed semantics follow ``torch.utils.data.DistributedSampler``: the epoch's sequence is padded
by wrapping around to a multiple of the world size, every rank gets ``ceil(n / world_size)`` items,
ranks are disjoint apart from the padding, and their union is the whole epoch. With ``drop_last``
the sequence is cut to a multiple of the world size instead: ``floor(n / world_size)`` items each,
disjoint.

Modes:

``full``
    A uniform random permutation (what ``RandomSampler`` gives), split across ranks by striding
    like DistributedSampler.
``block``
    For slow media: the files in storage order are cut into runs of ``block`` neighbours, the runs
    are shuffled, then the sequence is shuffled within consecutive windows of ``window`` files.
    Reads stay near-sequential while the order still mixes (the WebDataset/FFCV idea); pack with
    ``--placement random`` so that neighbours come from different classes. Ranks get contiguous slices,
    so each rank's reads stay near-sequential too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class OrderSpec:
    """The mount's order settings, fixed for its lifetime and published in ``.dlfs/config``."""

    seed: int = 0
    mode: str = "full"
    block: int = 64
    window: int = 4096

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown order mode {self.mode!r}; choose one of {', '.join(MODES)}")
        if self.block < 1 or self.window < 1:
            raise ValueError("block and window sizes must be at least 1")

    @property
    def in_storage_order(self) -> bool:
        """Whether the sequence's positions index the files in storage order (so that positions
        near each other are storage neighbours) rather than any fixed list of them."""
        return MODES[self.mode].in_storage_order

    @property
    def neighbour_window(self) -> int:
        """Files this many positions apart may be storage neighbours the read-ahead should fetch
        together; 0 where the mode promises no such thing."""
        return self.window if MODES[self.mode].in_storage_order else 0


def _rng(seed: int, epoch: int, salt: int = 0) -> np.random.Generator:
    return np.random.default_rng([seed, epoch, salt])


def _full_permutation(count: int, spec: OrderSpec, epoch: int) -> np.ndarray:
    return _rng(spec.seed, epoch).permutation(count)


def _block_permutation(count: int, spec: OrderSpec, epoch: int) -> np.ndarray:
    starts = np.arange(0, count, spec.block)
    runs = _rng(spec.seed, epoch, 1).permutation(starts.size)
    lengths = np.minimum(spec.block, count - starts[runs])
    # Expand the shuffled run starts into positions: start + 0..length-1, vectorised.
    sequence = np.repeat(starts[runs] - np.cumsum(lengths) + lengths, lengths) + np.arange(count)
    keys = _rng(spec.seed, epoch, 2).random(count) + np.arange(count) // spec.window
    return sequence[np.argsort(keys, kind="stable")]


def _strided(world_size: int, rank: int, per_rank: int) -> np.ndarray:
    return np.arange(per_rank, dtype=np.int64) * world_size + rank


def _contiguous(world_size: int, rank: int, per_rank: int) -> np.ndarray:
    return np.arange(per_rank, dtype=np.int64) + rank * per_rank


@dataclass(frozen=True)
class Mode:
    """One order mode: how an epoch is shuffled and how it is split across ranks."""

    permutation: Callable[[int, OrderSpec, int], np.ndarray]
    #: The places in the padded sequence that one rank reads: (world size, rank, per rank).
    split: Callable[[int, int, int], np.ndarray]
    in_storage_order: bool


#: The order modes by name (``--order``), in the order the CLI lists them.
MODES: dict[str, Mode] = {
    "full": Mode(_full_permutation, _strided, in_storage_order=False),
    "block": Mode(_block_permutation, _contiguous, in_storage_order=True),
}


def epoch_permutation(count: int, spec: OrderSpec, epoch: int) -> np.ndarray:
    """The whole epoch's sequence of positions 0..count-1 (before the split across ranks).

    Positions index the storage-ordered file list for ``block`` mode; for ``full`` any fixed list.
    """
    return MODES[spec.mode].permutation(count, spec, epoch)


def rank_slice(
    sequence: np.ndarray, world_size: int, rank: int, mode: str, drop_last: bool = False
) -> np.ndarray:
    """This rank's share of an epoch, padded by wrapping like DistributedSampler (or, with
    ``drop_last``, cut to a multiple of the world size). The padded sequence is never built: place
    p of it is ``sequence[p % count]``, so the work is the rank's share however large the world."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of {world_size}")
    count = sequence.size
    if not count:
        return sequence
    per_rank = count // world_size if drop_last else -(-count // world_size)
    return sequence[MODES[mode].split(world_size, rank, per_rank) % count]


def epoch_order(
    count: int, spec: OrderSpec, epoch: int, world_size: int = 1, rank: int = 0, drop_last: bool = False
) -> np.ndarray:
    """Positions (0..count-1) that ``rank`` of ``world_size`` reads in ``epoch``, in order."""
    return rank_slice(epoch_permutation(count, spec, epoch), world_size, rank, spec.mode, drop_last)
