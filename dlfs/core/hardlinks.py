"""Files that share one inode: the index's ``hardlinks`` table, as the mount reads it.

A hard-linked file is several rows, one per name, whose bytes are the same; the kernel must see
them as one inode, as ``tar x`` and ``cp -a`` make them: the same ``st_ino`` and a link count of
the group's size. Every row of a group answers as its first row (the inode row): its inode
number, attributes and bytes. Datasets hold few or none, so the table is searched (binary search,
a few probes) rather than widened into a column: an inode column would cost 4 bytes an entry of
daemon memory, 57 MB at ImageNet-21k's 14.2 M entries.
"""

from __future__ import annotations

import numpy as np


class HardLinks:
    """The (row, inode row) pairs of ``format.SECTIONS["hardlinks"]``, checked by
    ``validate._check_hard_links``: rows increasing, each group's inode row its first."""

    def __init__(self, table: np.ndarray) -> None:
        pairs = table.reshape(-1, 2)
        #: Contiguous columns, which the native request server's C threads search too.
        self.rows = np.ascontiguousarray(pairs[:, 0], dtype=np.uint32)
        self.inodes = np.ascontiguousarray(pairs[:, 1], dtype=np.uint32)
        _, group, sizes = np.unique(self.inodes, return_inverse=True, return_counts=True)
        #: Each row's link count: its group's size.
        self.nlink = np.ascontiguousarray(sizes[group], dtype=np.uint32)

    def __len__(self) -> int:
        return int(self.rows.size)

    def _find(self, row: int) -> int:
        """Where ``row`` is in the table, or -1."""
        k = int(self.rows.searchsorted(row))
        return k if k < self.rows.size and int(self.rows[k]) == row else -1

    def inode_row(self, row: int) -> int:
        """The row whose inode ``row`` answers as: its own, or its group's first."""
        if not self.rows.size:
            return row
        k = self._find(row)
        return row if k < 0 else int(self.inodes[k])

    def nlink_of(self, row: int) -> int:
        if not self.rows.size:
            return 1
        k = self._find(row)
        return 1 if k < 0 else int(self.nlink[k])

    def inode_rows(self, rows: np.ndarray) -> np.ndarray:
        """``inode_row`` of many rows at once (int64)."""
        out = rows.astype(np.int64)
        if self.rows.size and rows.size:
            k = np.minimum(self.rows.searchsorted(rows), self.rows.size - 1)
            linked = self.rows[k] == rows
            out[linked] = self.inodes[k[linked]]
        return out

    def count_links(self, first: int, nlink: np.ndarray) -> None:
        """Set the link counts of the hard-linked ones among rows ``first`` up to
        ``first + len(nlink)`` (``nlink``: theirs, one per row)."""
        if not self.rows.size:
            return
        lo, hi = self.rows.searchsorted([first, first + len(nlink)])
        nlink[self.rows[lo:hi].astype(np.int64) - first] = self.nlink[lo:hi]
