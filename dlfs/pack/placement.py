"""Placement: the order in which file bytes are laid into shards.

``source`` keeps a folder's files together, as a tree-order reader wants them; ``random`` scatters
them with a seeded permutation.
"""

from __future__ import annotations

import stat

import numpy as np

from dlfs.core import format as fmt

#: Keeps the placement's random stream apart from every epoch order's: ``default_rng(seed)`` equals
#: ``default_rng([seed, 0])``, so with a plain seed, epoch 0 of the uniform order would read the
#: shards front to back -- a sequential read passed off as a shuffle.
PLACEMENT_STREAM = 0x7061636B


def _depth_first(parent: np.ndarray, is_dir: np.ndarray) -> np.ndarray:
    """Rows in sorted tree (pre-)order, the natural 'source' placement: a folder's files stay together."""
    first = np.searchsorted(parent[1:], np.arange(parent.size), side="left") + 1
    last = np.searchsorted(parent[1:], np.arange(parent.size), side="right") + 1
    out: list[int] = []
    stack = [fmt.ROOT_ROW]
    while stack:
        row = stack.pop()
        out.append(row)
        if is_dir[row]:
            stack.extend(range(int(last[row]) - 1, int(first[row]) - 1, -1))
    return np.asarray(out, dtype=np.int64)


def placement_order(tree_parent: np.ndarray, mode: np.ndarray, order: str, seed: int) -> np.ndarray:
    """File rows in the order their bytes are laid into shards."""
    kinds = mode & fmt.TYPE_MASK
    rows = _depth_first(tree_parent, kinds == stat.S_IFDIR)
    files = rows[kinds[rows] == stat.S_IFREG]
    if order == "random":
        files = np.random.default_rng([seed, PLACEMENT_STREAM]).permutation(files)
    return files
