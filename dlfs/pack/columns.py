"""Index columns: where the write loop put each file, turned into the arrays the index stores."""

from __future__ import annotations

import stat
from array import array
from dataclasses import dataclass, field

import numpy as np

from dlfs.core import format as fmt
from dlfs.pack.pipeline import Payload
from dlfs.pack.walk import Tree


@dataclass
class Placed:
    """Where the write loop put each file, in typed arrays (45 bytes a file)."""

    rows: array[int] = field(default_factory=lambda: array("q"))
    size: array[int] = field(default_factory=lambda: array("Q"))
    shard: array[int] = field(default_factory=lambda: array("I"))
    offset: array[int] = field(default_factory=lambda: array("Q"))
    stored: array[int] = field(default_factory=lambda: array("Q"))
    checksum: array[int] = field(default_factory=lambda: array("Q"))
    flags: array[int] = field(default_factory=lambda: array("B"))

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, row: int, payload: Payload, shard: int, offset: int, stored: int) -> None:
        self.rows.append(row)
        self.size.append(payload.size)
        self.shard.append(shard)
        self.offset.append(offset)
        self.stored.append(stored)
        self.checksum.append(payload.checksum)
        self.flags.append(payload.flags)

    def column(self, name: str) -> np.ndarray:
        column = getattr(self, name)
        return np.frombuffer(column, dtype=np.dtype(column.typecode))


def _columns(tree: Tree, placed: Placed) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Index columns for every walked row, and which rows to keep (files that failed are dropped)."""
    count = len(tree)
    mode = tree.column("mode")
    columns = {name: tree.column(name) for name in ("mode", "uid", "gid", "mtime")}
    columns["size"] = tree.column("size").copy()  # the stored size replaces the walk's below
    for name in ("shard", "offset", "stored", "checksum", "flags"):
        columns[name] = np.zeros(count, dtype=placed.column(name).dtype)
    rows = placed.column("rows")
    for name in ("size", "shard", "offset", "stored", "checksum", "flags"):
        columns[name][rows] = placed.column(name)
    keep = (mode & fmt.TYPE_MASK) != stat.S_IFREG
    keep[rows] = True
    return columns, keep


def _names(tree: Tree, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The names blob and its offsets (with an end fence) for the rows kept."""
    ends = tree.column("name_end")
    if keep.all():
        name_off = np.zeros(len(ends) + 1, dtype=np.uint64)
        name_off[1:] = ends
        return name_off, np.frombuffer(tree.names, dtype=np.uint8)
    kept = [tree.name(row) for row in np.flatnonzero(keep).tolist()]  # only after --skip-errors
    name_off = np.zeros(len(kept) + 1, dtype=np.uint64)
    np.cumsum([len(n) for n in kept], out=name_off[1:])
    return name_off, np.frombuffer(b"".join(kept), dtype=np.uint8)


def index_arrays(tree: Tree, placed: Placed) -> dict[str, np.ndarray]:
    """The index's arrays for the rows kept; renumbers parents where unreadable files were dropped."""
    columns, keep = _columns(tree, placed)
    renumber = np.cumsum(keep) - 1
    parent = renumber[tree.column("parent")[keep]]
    arrays = columns if keep.all() else {name: column[keep] for name, column in columns.items()}
    links = bytearray()
    for old_row, target in sorted(tree.links.items()):
        new_row = int(renumber[old_row])
        arrays["offset"][new_row] = len(links)
        arrays["stored"][new_row] = len(target)
        links.extend(target)
    name_off, names = _names(tree, keep)
    arrays.update(
        parent=parent, name_off=name_off, names=names, links=np.frombuffer(bytes(links), dtype=np.uint8)
    )
    return arrays
