"""GNU sparse files: the index's ``sparse`` and ``sparse_runs`` tables, as a reader reads them.

A sparse member of a tar (``tar -S``) is its runs of data, back to back, and a map of where each
run lies in the file; the holes between runs read as zeros. dlfs stores exactly that: the row's
stored bytes are the runs (in a shard, or where they lie in the tar itself), the map is here, and
``format.expand_sparse`` fills in the holes as bytes are read. Nothing is ever expanded in a shard
or hashed as zeros, so a file of a terabyte of holes costs what its runs do.
"""

from __future__ import annotations

import numpy as np

_EMPTY = np.zeros((0, 2), dtype=np.int64)


class SparseFiles:
    """The (row, end of its runs) pairs of ``format.SECTIONS["sparse"]`` and the (offset, length)
    runs they end in, checked by ``validate._check_sparse``."""

    def __init__(self, table: np.ndarray, runs: np.ndarray) -> None:
        pairs = table.astype(np.int64).reshape(-1, 2)
        self.rows, self.ends = pairs[:, 0], pairs[:, 1]
        self.all_runs = runs.astype(np.int64).reshape(-1, 2)

    def __len__(self) -> int:
        return int(self.rows.size)

    def runs(self, row: int) -> np.ndarray:
        """A sparse file's runs of data: (offset in the file, length) rows, ascending."""
        k = int(self.rows.searchsorted(row))
        if k == self.rows.size or int(self.rows[k]) != row:
            raise KeyError(row)
        start = int(self.ends[k - 1]) if k else 0
        return self.all_runs[start : int(self.ends[k])]

    def piece(self, row: int, start: int, length: int) -> tuple[int, int, np.ndarray]:
        """For the file's bytes ``start`` to ``start + length``: where the stored bytes they need lie
        (offset in the stored bytes, length), and the runs those hold, clipped to the range, which
        ``format.expand_sparse`` turns into the file's bytes."""
        runs = self.runs(row)
        end = start + length
        lo = np.clip(runs[:, 0], start, end)
        hi = np.clip(runs[:, 0] + runs[:, 1], start, end)
        keep = np.flatnonzero(hi > lo)
        if not keep.size:
            return 0, 0, _EMPTY
        at = np.concatenate(([0], np.cumsum(runs[:, 1])[:-1]))[keep] + lo[keep] - runs[keep, 0]
        clipped = np.stack((lo[keep], hi[keep] - lo[keep]), axis=1)
        return int(at[0]), int(at[-1] + clipped[-1, 1] - at[0]), clipped
