"""Placement: the order in which file bytes are laid into shards.

``tree`` keeps a folder's files together, as a tree-order reader wants them (the tree in
pre-order: a folder's entries by name, each subfolder's whole subtree where its name falls);
``random`` scatters them with a seeded permutation. Both come out as chunks of rows, computed from
the walk's column files as they are consumed, so no per-file array is ever held whole.
"""

from __future__ import annotations

import stat
from collections.abc import Iterator

import numpy as np

from dlfs.core import format as fmt
from dlfs.pack.walk import Tree

#: Keeps the placement's random stream apart from every epoch order's: ``default_rng(seed)`` equals
#: ``default_rng([seed, 0])``, so with a plain seed, epoch 0 of the uniform order would read the
#: shards front to back -- a sequential read passed off as a shuffle.
PLACEMENT_STREAM = 0x7061636B
#: Rows read, and handed on, at a time.
CHUNK = 1 << 12
#: Feistel rounds; four make a pseudo-random permutation when the round function is (Luby and
#: Rackoff), two more are a margin that costs nothing measurable.
ROUNDS = 6

_EMPTY = np.zeros(0, dtype=np.uint32)


def placement_order(tree: Tree, placement: str, seed: int) -> Iterator[np.ndarray]:
    """File rows (int64) in the order their bytes are laid into shards, CHUNK at a time."""
    return _random(tree, seed) if placement == "random" else _rebatch(_pre_order(tree))


def _pre_order(tree: Tree) -> Iterator[np.ndarray]:
    """Regular files in tree pre-order, in runs. A stack entry is a folder's rows still to visit,
    ``[pos, end)``, with the types of the first of them already read (``kinds``), so a folder of
    many subfolders is read once, not once per subfolder."""
    mode = tree.columns["mode"]
    root = tree.dirs[fmt.ROOT_ROW]
    stack = [(root.first, root.first + root.count, _EMPTY)]
    while stack:
        pos, end, kinds = stack.pop()
        while True:
            if not kinds.size:
                if pos >= end:
                    break
                kinds = mode.read(pos, min(end, pos + CHUNK)) & fmt.TYPE_MASK
            folders = np.flatnonzero(kinds == stat.S_IFDIR)
            upto = int(folders[0]) if folders.size else kinds.size
            files = pos + np.flatnonzero(kinds[:upto] == stat.S_IFREG)
            if files.size:
                yield files
            if not folders.size:
                pos, kinds = pos + kinds.size, _EMPTY
                continue
            child = tree.dirs[pos + upto]
            stack.append((pos + upto + 1, end, kinds[upto + 1 :]))
            stack.append((child.first, child.first + child.count, _EMPTY))
            break


def _rebatch(runs: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
    """Runs of rows regrouped into chunks of about CHUNK."""
    pending: list[np.ndarray] = []
    held = 0
    for run in runs:
        pending.append(run)
        held += run.size
        if held >= CHUNK:
            yield np.concatenate(pending).astype(np.int64)
            pending, held = [], 0
    if pending:
        yield np.concatenate(pending).astype(np.int64)


def _random(tree: Tree, seed: int) -> Iterator[np.ndarray]:
    count = len(tree.files)
    for start in range(0, count, CHUNK):
        yield tree.files.gather(random_picks(start, min(count, start + CHUNK), count, seed)).astype(np.int64)


def random_picks(start: int, stop: int, count: int, seed: int) -> np.ndarray:
    """Which of ``count`` files (numbered in row order) the ``random`` placement lays at places
    ``start`` up to ``stop``: a pure function of the seed."""
    keys = np.random.default_rng([seed, PLACEMENT_STREAM]).integers(0, 1 << 63, size=ROUNDS, dtype=np.uint64)
    return permute(np.arange(start, stop, dtype=np.uint64), count, keys).astype(np.int64)


def permute(values: np.ndarray, count: int, keys: np.ndarray) -> np.ndarray:
    """A seeded bijection of ``[0, count)`` evaluated at ``values`` (uint64), without the
    permutation in memory: a balanced Feistel network over the fewest even number of bits that
    covers ``count``, cycle-walked back into range (the domain is under 4x ``count``, so a value
    takes fewer than four walks on average)."""
    half = max(1, ((count - 1).bit_length() + 1) // 2)
    out = _feistel(values, half, keys)
    outside = out >= count
    while outside.any():
        out[outside] = _feistel(out[outside], half, keys)
        outside = out >= count
    return out


def _feistel(values: np.ndarray, half: int, keys: np.ndarray) -> np.ndarray:
    shift, mask = np.uint64(half), np.uint64((1 << half) - 1)
    left, right = values >> shift, values & mask
    for key in keys:
        left, right = right, left ^ (_mix(right ^ key) & mask)
    return (left << shift) | right


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: every input bit moves every output bit (the round function)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))
