"""Damage done to a packed dataset on purpose, for the checksum tests: where a file's stored bytes
lie, and one of them flipped."""

from __future__ import annotations

from pathlib import Path

from dlfs.core.index import Index
from dlfs.core.store.local import LocalStore


def payload_place(dataset: Path, relpath: str) -> tuple[Path, int, int]:
    """Where a file's stored bytes lie: (shard path, offset, length)."""
    store = LocalStore(dataset)
    index = Index.load(store)
    row = index.resolve(relpath.encode())
    assert row is not None
    place = dataset / index.shard_names[int(index.shard[row])], int(index.offset[row]), int(index.stored[row])
    store.close()
    return place


def flip_byte(path: Path, offset: int) -> None:
    """Corrupt one byte in place (for the checksum tests)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))
