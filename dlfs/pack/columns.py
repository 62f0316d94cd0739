"""Index columns: where the write loop put each file, turned into the arrays the index stores."""

from __future__ import annotations

import stat
from dataclasses import dataclass, field

import numpy as np

from dlfs.core import format as fmt
from dlfs.pack.pipeline import Payload
from dlfs.pack.walk import Tree


@dataclass
class Placed:
    """Where the write loop put each file; lists while packing, columns once at the end."""

    rows: list[int] = field(default_factory=list)
    size: list[int] = field(default_factory=list)
    shard: list[int] = field(default_factory=list)
    offset: list[int] = field(default_factory=list)
    stored: list[int] = field(default_factory=list)
    checksum: list[int] = field(default_factory=list)
    flags: list[int] = field(default_factory=list)

    def add(self, row: int, payload: Payload, shard: int, offset: int, stored: int) -> None:
        self.rows.append(row)
        self.size.append(payload.size)
        self.shard.append(shard)
        self.offset.append(offset)
        self.stored.append(stored)
        self.checksum.append(payload.checksum)
        self.flags.append(payload.flags)


def _columns(tree: Tree, placed: Placed) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Index columns for every walked row, and which rows to keep (files that failed are dropped)."""
    count = len(tree.parent)
    mode = np.asarray(tree.mode, dtype=np.uint32)
    columns = {
        "mode": mode,
        "uid": np.asarray(tree.uid, dtype=np.uint32),
        "gid": np.asarray(tree.gid, dtype=np.uint32),
        "size": np.asarray(tree.size, dtype=np.uint64),
        "mtime": np.asarray(tree.mtime, dtype=np.int64),
        "shard": np.zeros(count, dtype=np.uint32),
        "offset": np.zeros(count, dtype=np.uint64),
        "stored": np.zeros(count, dtype=np.uint64),
        "checksum": np.zeros(count, dtype=np.uint64),
        "flags": np.zeros(count, dtype=np.uint8),
    }
    rows = np.asarray(placed.rows, dtype=np.int64)
    for name in ("size", "shard", "offset", "stored", "checksum", "flags"):
        columns[name][rows] = np.asarray(getattr(placed, name), dtype=columns[name].dtype)
    keep = (mode & fmt.TYPE_MASK) != stat.S_IFREG
    keep[rows] = True
    return columns, keep


def index_arrays(tree: Tree, placed: Placed) -> dict[str, np.ndarray]:
    """The index's arrays for the rows kept; renumbers parents where unreadable files were dropped."""
    columns, keep = _columns(tree, placed)
    renumber = np.cumsum(keep) - 1
    parent = renumber[np.asarray(tree.parent, dtype=np.int64)[keep]]
    kept_rows = np.flatnonzero(keep).tolist()
    names = [tree.names[r] for r in kept_rows]
    name_off = np.zeros(len(names) + 1, dtype=np.uint64)
    np.cumsum([len(n) for n in names], out=name_off[1:])
    arrays = {name: column[keep] for name, column in columns.items()}
    links = bytearray()
    for new_row, old_row in enumerate(kept_rows):
        target = tree.links.get(old_row)
        if target is not None:
            arrays["offset"][new_row] = len(links)
            arrays["stored"][new_row] = len(target)
            links.extend(target)
    arrays.update(
        parent=parent,
        name_off=name_off,
        names=np.frombuffer(b"".join(names), dtype=np.uint8),
        links=np.frombuffer(bytes(links), dtype=np.uint8),
    )
    return arrays
