"""Index columns: where the write loop put each file, merged with the walk's rows into the
sections of the index, a chunk of rows at a time (``format.write_index`` writes them as they come).

Files that failed to read (with ``--skip-errors``) are dropped here, and the rows after them
renumbered; only directories can be parents, so only their new numbers are held.
"""

from __future__ import annotations

import stat
from array import array
from collections.abc import Iterator

import numpy as np

from dlfs.core import format as fmt
from dlfs.pack.pipeline import Payload
from dlfs.pack.spill import Spill
from dlfs.pack.walk import Tree

#: Placements held before they are scattered into the column files.
PLACED_BUFFER = 1 << 12
#: Rows read at a time while the index is written.
ROWS_CHUNK = 1 << 16
#: Where each file went, per row, and its type code.
PLACED_COLUMNS = {"shard": "I", "offset": "Q", "stored": "Q", "checksum": "Q", "flags": "B", "placed": "B"}


class Placed:
    """Where the write loop put each file, scattered by row into column files of the ``Spill``
    (plus the stored size, into the walk's ``size`` column), PLACED_BUFFER files at a time."""

    def __init__(self, tree: Tree, spill: Spill) -> None:
        self.tree = tree
        self.columns = {
            name: spill.column(name, np.dtype(code), len(tree)) for name, code in PLACED_COLUMNS.items()
        }
        self.count = 0
        self._rows, self._size = array("q"), array("Q")
        self._values = {name: array(code) for name, code in PLACED_COLUMNS.items() if name != "placed"}

    def __len__(self) -> int:
        return self.count

    def add(self, row: int, payload: Payload, shard: int, offset: int, stored: int) -> None:
        self._rows.append(row)
        self._size.append(payload.size)
        values = self._values
        values["shard"].append(shard)
        values["offset"].append(offset)
        values["stored"].append(stored)
        values["checksum"].append(payload.checksum)
        values["flags"].append(payload.flags)
        self.count += 1
        if len(self._rows) >= PLACED_BUFFER:
            self.flush()

    def flush(self) -> None:
        values = {name: np.array(v, dtype=self.columns[name].dtype) for name, v in self._values.items()}
        self._scatter(np.array(self._rows, dtype=np.int64), np.array(self._size, dtype=np.uint64), values)
        for buffer in self._values.values():
            del buffer[:]
        del self._rows[:], self._size[:]

    def add_many(self, rows: np.ndarray, sizes: np.ndarray, values: dict[str, np.ndarray]) -> None:
        """Place many rows at once: ``values`` holds each of PLACED_COLUMNS but ``placed``."""
        self.flush()
        self._scatter(rows, sizes, values)
        self.count += len(rows)

    def _scatter(self, rows: np.ndarray, sizes: np.ndarray, values: dict[str, np.ndarray]) -> None:
        self.tree.columns["size"].scatter(rows, sizes)
        for name, column in values.items():
            self.columns[name].scatter(rows, column)
        self.columns["placed"].scatter(rows, np.ones(len(rows), dtype=np.uint8))

    def place_links(self) -> None:
        """Point each symlink's ``offset`` and ``stored`` at its target in the ``links`` blob."""
        tree = self.tree
        for start, stop in tree.link_rows.chunks(ROWS_CHUNK):
            rows = tree.link_rows.read(start, stop).astype(np.int64)
            bounds = tree.link_end.fenced(start, stop)
            self.columns["offset"].scatter(rows, bounds[:-1])
            self.columns["stored"].scatter(rows, np.diff(bounds))


class IndexRows:
    """The index's sections from the walk's rows and the placements, each a count and the chunks
    of its values, for ``format.write_index``; and the totals the summary reports."""

    def __init__(self, tree: Tree, placed: Placed) -> None:
        placed.flush()
        placed.place_links()
        self.tree = tree
        self.placed = placed
        self.dropped = len(tree.files) - len(placed)
        self.entries = len(tree) - self.dropped
        self.name_bytes = len(tree.names)
        self._dirs = np.zeros(0, dtype=np.int64)
        self._new_dirs = np.zeros(0, dtype=np.int64)
        #: The rows dropped, increasing.
        self._dropped_rows = np.zeros(0, dtype=np.int64)
        if self.dropped:
            self._renumber()

    def _kept(self, start: int, stop: int) -> np.ndarray | None:
        """Which of rows ``start`` up to ``stop`` the index keeps (None: all of them)."""
        if not self.dropped:
            return None
        kinds = self.tree.columns["mode"].read(start, stop) & fmt.TYPE_MASK
        return (kinds != stat.S_IFREG) | (self.placed.columns["placed"].read(start, stop) == 1)

    def _chunks(self) -> list[tuple[int, int]]:
        return self.tree.columns["mode"].chunks(ROWS_CHUNK)

    def _renumber(self) -> None:
        """New row numbers of the directories, and the name bytes of the rows dropped."""
        dirs, new_dirs, dropped_rows = [], [], []
        dropped_before = 0
        for start, stop in self._chunks():
            keep = self._kept(start, stop)
            assert keep is not None
            rows = np.arange(start, stop)
            is_dir = (self.tree.columns["mode"].read(start, stop) & fmt.TYPE_MASK) == stat.S_IFDIR
            dropped = dropped_before + np.cumsum(~keep)
            dirs.append(rows[is_dir])
            new_dirs.append(rows[is_dir] - dropped[is_dir])
            dropped_rows.append(rows[~keep])
            dropped_before = int(dropped[-1])
            self.name_bytes -= int(self._name_lengths(start, stop)[~keep].sum())
        self._dirs, self._new_dirs = np.concatenate(dirs), np.concatenate(new_dirs)
        self._dropped_rows = np.concatenate(dropped_rows)

    def _renumbered(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Which of ``rows`` (increasing) the index keeps, and the new numbers of those."""
        at = np.searchsorted(self._dropped_rows, rows)
        kept = at == np.searchsorted(self._dropped_rows, rows, side="right")
        return kept, (rows - at)[kept]

    def _hard_links(self) -> np.ndarray:
        """The ``hardlinks`` table: (row, inode row) of every kept row of a group of two or more,
        the inode row being the group's first."""
        pairs = []
        for group in self.tree.hard_links.values():
            _, rows = self._renumbered(np.array(sorted(group), dtype=np.int64))
            if rows.size > 1:
                pairs.append(np.stack((rows, np.full(rows.size, rows[0])), axis=1))
        if not pairs:
            return np.zeros(0, dtype=np.uint32)
        table = np.concatenate(pairs)
        return table[np.argsort(table[:, 0], kind="stable")].ravel()

    def _sparse(self) -> tuple[np.ndarray, np.ndarray]:
        """The ``sparse`` table, (row, end of its runs), and the runs it ends in."""
        if not self.tree.sparse:
            return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.uint64)
        rows = np.array(sorted(self.tree.sparse), dtype=np.int64)
        kept, new_rows = self._renumbered(rows)
        maps = [self.tree.sparse[row] for row in rows[kept].tolist()]
        ends = np.cumsum([len(runs) for runs in maps])
        runs = np.array([run for runs in maps for run in runs], dtype=np.uint64).reshape(-1, 2)
        return np.stack((new_rows, ends), axis=1).ravel().astype(np.uint64), runs.ravel()

    def _name_lengths(self, start: int, stop: int) -> np.ndarray:
        return np.diff(self.tree.columns["name_end"].fenced(start, stop))

    def _column(self, column: str) -> Iterator[np.ndarray]:
        source = self.placed.columns[column] if column in PLACED_COLUMNS else self.tree.columns[column]
        for start, stop in self._chunks():
            values, keep = source.read(start, stop), self._kept(start, stop)
            yield values if keep is None else values[keep]

    def _parents(self) -> Iterator[np.ndarray]:
        for parents in self._column("parent"):
            yield self._new_dirs[np.searchsorted(self._dirs, parents)] if self.dropped else parents

    def _name_offsets(self) -> Iterator[np.ndarray]:
        yield np.zeros(1, dtype=np.uint64)
        total = 0
        for start, stop in self._chunks():
            lengths, keep = self._name_lengths(start, stop), self._kept(start, stop)
            ends = np.cumsum(lengths if keep is None else lengths[keep]) + total
            if ends.size:
                total = int(ends[-1])
            yield ends

    def _names(self) -> Iterator[np.ndarray]:
        names = self.tree.names
        for start, stop in self._chunks():
            keep, bounds = self._kept(start, stop), self.tree.columns["name_end"].fenced(start, stop)
            blob = names.read(int(bounds[0]), int(bounds[-1]))
            yield blob if keep is None else blob[np.repeat(keep, np.diff(bounds))]

    def _blob(self, column: str) -> Iterator[np.ndarray]:
        source = getattr(self.tree, column)
        for start, stop in source.chunks(ROWS_CHUNK * 16):
            yield source.read(start, stop)

    def sections(self) -> dict[str, tuple[int, Iterator[np.ndarray]]]:
        """Each section's element count and the chunks of its values, in ``fmt.SECTIONS`` terms."""
        owners = self.tree.owners  # (uid, gid) -> owner, numbered in order
        out: dict[str, tuple[int, Iterator[np.ndarray]]] = {
            "parent": (self.entries, self._parents()),
            "name_off": (self.entries + 1, self._name_offsets()),
            "names": (self.name_bytes, self._names()),
            "links": (len(self.tree.links), self._blob("links")),
            "owners": (2 * len(owners), [np.array(list(owners), dtype=np.uint32).ravel()]),
        }
        hard_links = self._hard_links()
        sparse, runs = self._sparse()
        for name, table in (("hardlinks", hard_links), ("sparse", sparse), ("sparse_runs", runs)):
            out[name] = (table.size, [table])
        for column in fmt.SECTIONS:
            out.setdefault(column, (self.entries, self._column(column)))
        return out

    def totals(self) -> dict[str, int]:
        """Files, directories, symlinks and file bytes the index holds."""
        totals = dict.fromkeys(("files", "directories", "symlinks", "bytes"), 0)
        kinds = {"files": stat.S_IFREG, "directories": stat.S_IFDIR, "symlinks": stat.S_IFLNK}
        for modes, sizes in zip(self._column("mode"), self._column("size"), strict=True):
            modes = modes & fmt.TYPE_MASK
            for name, kind in kinds.items():
                totals[name] += int(np.count_nonzero(modes == kind))
            totals["bytes"] += int(sizes[modes == stat.S_IFREG].sum())
        return totals
