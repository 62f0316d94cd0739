"""Crafting indexes the way a malicious or buggy writer would: a real packed index's columns and
metadata taken apart, one rule broken, and re-encoded with a valid trailer; and the changes the
crafting tests make, each a function of (arrays, metadata)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from index_bytes import with_meta

from dlfs.core import format as fmt

Arrays = dict[str, np.ndarray]
Meta = dict[str, Any]
#: A change to an index's columns and metadata.
Change = Callable[[Arrays, Meta], None]


def make_small_tree(root: Path) -> Path:
    """Rows in the index: 0 root, 1 a/, 2 b.txt, 3 c/, 4 link, 5 a/x, 6 a/y, 7 c/z."""
    (root / "a").mkdir(parents=True)
    (root / "c").mkdir()
    (root / "b.txt").write_bytes(b"bee\n" * 50)
    (root / "a" / "x").write_bytes(b"x" * 3000)
    (root / "a" / "y").write_bytes(bytes(range(256)))
    (root / "c" / "z").write_bytes(b"")
    (root / "link").symlink_to("a/x")
    return root


def decode(raw: bytes) -> tuple[Arrays, Meta]:
    """Writable copies of an index's columns, and its metadata without the section table."""
    decoded = fmt.decode_index(memoryview(raw), "valid")
    meta = {key: value for key, value in decoded.meta.items() if key != "sections"}
    return {name: column.copy() for name, column in decoded.arrays.items()}, meta


def renamed(arrays: Arrays, names: dict[int, bytes]) -> None:
    """Give rows new names, rebuilding the names blob and offsets."""
    off, blob = arrays["name_off"], arrays["names"].tobytes()
    parts = [names.get(row, blob[off[row] : off[row + 1]]) for row in range(off.size - 1)]
    arrays["name_off"] = np.concatenate(([0], np.cumsum([len(p) for p in parts]))).astype(np.uint64)
    arrays["names"] = np.frombuffer(b"".join(parts), dtype=np.uint8).copy()


def edit_sections(raw: bytes, change: Callable[[dict[str, list[int]]], None]) -> bytes:
    meta = json.loads(bytes(memoryview(raw)[fmt.INDEX_HEADER.unpack_from(raw)[3] : -fmt.TRAILER.size]))
    change(meta["sections"])
    return with_meta(raw, json.dumps(meta).encode())


ROW_B, ROW_LINK, ROW_X, ROW_Y, ROW_Z = 2, 4, 5, 6, 7
HUGE = 1 << 60


def set_value(name: str, row: int, value: int) -> Callable[[Arrays, Meta], None]:
    def change(arrays: Arrays, meta: Meta) -> None:
        arrays[name][row] = value

    return change


def rename(names: dict[int, bytes]) -> Callable[[Arrays, Meta], None]:
    return lambda arrays, meta: renamed(arrays, names)


def shard_size(arrays: Arrays, meta: Meta) -> int:
    return int(meta["shards"][int(arrays["shard"][ROW_B])][1])


def links_blob(arrays: Arrays, meta: Meta) -> None:
    arrays["links"] = np.frombuffer(b"a/\x00x", dtype=np.uint8).copy()


def set_meta(key: str, value: object) -> Callable[[Arrays, Meta], None]:
    def change(arrays: Arrays, meta: Meta) -> None:
        meta[key] = value

    return change


def lz4_huge(arrays: Arrays, meta: Meta) -> None:
    arrays["flags"][ROW_B] = fmt.FLAG_LZ4
    arrays["size"][ROW_B] = HUGE


def past_shard(name: str) -> Callable[[Arrays, Meta], None]:
    def change(arrays: Arrays, meta: Meta) -> None:
        arrays[name][ROW_B] = shard_size(arrays, meta) + 1
        arrays["size"][ROW_B] = arrays["stored"][ROW_B]

    return change


def wrapping(arrays: Arrays, meta: Meta) -> None:
    """Bytes 100 up to 100 + (2^64 - 50): their end wraps round to 50, inside the shard."""
    arrays["offset"][ROW_B] = 100
    arrays["stored"][ROW_B] = arrays["size"][ROW_B] = (1 << 64) - 50


def set_table(name: str, *values: int) -> Callable[[Arrays, Meta], None]:
    """Set a table section (``hardlinks``, ``sparse``, ``sparse_runs``) to ``values``."""

    def change(arrays: Arrays, meta: Meta) -> None:
        arrays[name] = np.array(values, dtype=fmt.SECTIONS[name])

    return change


def both(*changes: Callable[[Arrays, Meta], None]) -> Callable[[Arrays, Meta], None]:
    def change(arrays: Arrays, meta: Meta) -> None:
        for one in changes:
            one(arrays, meta)

    return change


def same_bytes(arrays: Arrays, meta: Meta) -> None:
    """Give a/y a/x's bytes, as the rows of a hard-linked file have."""
    for column in ("shard", "offset", "stored", "size", "checksum", "flags"):
        arrays[column][ROW_Y] = arrays[column][ROW_X]


def sparse_x(*runs: int, size: int = 10_000) -> Callable[[Arrays, Meta], None]:
    """a/x (3,000 bytes stored) as a sparse file of ``size`` bytes with ``runs`` (offset, length)."""
    return both(
        set_value("flags", ROW_X, fmt.FLAG_SPARSE),
        set_value("size", ROW_X, size),
        set_table("sparse", ROW_X, len(runs) // 2),
        set_table("sparse_runs", *runs),
    )
