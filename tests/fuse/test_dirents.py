"""Directory records encoded with numpy, decoded field by field against the index."""

from __future__ import annotations

import ctypes
import stat
import struct
from pathlib import Path

import numpy as np
import pytest

from dlfs.core import format as fmt
from dlfs.core.index import Index
from dlfs.core.store import open_store
from dlfs.fuse import dirents, server
from dlfs.fuse.dirents import Attributes

DIRENT = struct.Struct("=QQII")
ENTRY_OUT = struct.Struct("=QQQQII" + "QQQQQQ" + "IIIIIIIIII")


def _decode(records: bytes, plus: bool) -> list[dict[str, object]]:
    out, at = [], 0
    while at < len(records):
        entry: dict[str, object] = {}
        if plus:
            fields = ENTRY_OUT.unpack_from(records, at)
            entry["nodeid"], _, entry["entry_valid"], entry["attr_valid"] = fields[:4]
            ino, size, blocks, _, mtime, _, _, mtimensec, _, mode, nlink, uid, gid, _, blksize, _ = fields[6:]
            entry["attrs"] = (
                ino,
                size,
                blocks,
                mtime * 1_000_000_000 + mtimensec,
                mode,
                nlink,
                uid,
                gid,
                blksize,
            )
            at += ENTRY_OUT.size
        ino, off, namelen, kind = DIRENT.unpack_from(records, at)
        name = records[at + DIRENT.size : at + DIRENT.size + namelen]
        entry |= {"ino": ino, "off": off, "name": name, "type": kind}
        at += (DIRENT.size + namelen + 7) & ~7
        out.append(entry)
    return out


BLKSIZE = (4096, 1 << 20)


def _encoder(index: Index, native: bool) -> dirents.Encoder:
    encoder = dirents.Encoder(index, 1, 3600.0, BLKSIZE, dirents.LIBRARY if native else None)
    assert encoder.native == native, "make install builds dlfs/fuse/_dirents.so"
    return encoder


@pytest.mark.parametrize("native", [True, False], ids=["c", "numpy"])
def test_records_carry_what_the_index_says(packed: Path, native: bool) -> None:
    index = Index.load(open_store(packed))
    encoder = _encoder(index, native)
    for attributes in Attributes:
        plus = attributes != Attributes.NONE
        for directory in range(index.count):
            rows = index.children(directory)
            if not rows:
                continue
            records, count = encoder.encode(rows, 10, 1 << 20, attributes)
            assert count == len(rows)
            decoded = _decode(records.tobytes(), plus)
            attrs = index.attrs_run(rows)
            for k, (row, entry) in enumerate(zip(rows, decoded, strict=True)):
                assert entry["name"] == index.name(row)
                assert entry["ino"] == row + 1 and entry["off"] == 10 + k
                assert entry["type"] == stat.S_IFMT(attrs[k].mode) >> 12
                if attributes == Attributes.DIRS and not stat.S_ISDIR(attrs[k].mode):
                    assert entry["nodeid"] == 0 and set(entry["attrs"]) == {0}  # the kernel builds nothing
                elif plus:
                    a = attrs[k]
                    assert entry["nodeid"] == row + 1 and entry["entry_valid"] == entry["attr_valid"] == 3600
                    blksize = BLKSIZE[1] if stat.S_ISDIR(a.mode) else BLKSIZE[0]
                    expected = (row + 1, a.size, a.blocks, a.mtime_ns, a.mode, a.nlink, a.uid, a.gid, blksize)
                    assert entry["attrs"] == expected


@pytest.mark.parametrize("native", [True, False], ids=["c", "numpy"])
def test_only_whole_records_that_fit_are_encoded(packed: Path, native: bool) -> None:
    index = Index.load(open_store(packed))
    encoder = _encoder(index, native)
    many = index.resolve(b"many")
    assert many is not None
    rows = index.children(many)
    whole, count = encoder.encode(rows, 0, 1 << 20, Attributes.ALL)
    assert count == len(rows) > 100
    ends = np.cumsum(
        [(dirents.ENTRY_OUT.itemsize + dirents.DIRENT.itemsize + len(index.name(r)) + 7) & ~7 for r in rows]
    )
    space = int(ends[40]) + 5  # room for 41 records and a few bytes
    part, count = encoder.encode(rows, 0, space, Attributes.ALL)
    assert count == 41 and part.tobytes() == whole.tobytes()[: int(ends[40])]
    assert encoder.encode(rows, 0, int(ends[0]) - 1, Attributes.ALL)[1] == 0


def test_the_c_loop_writes_the_bytes_numpy_writes(packed: Path) -> None:
    """Padding included, for every directory, reply size and resume point."""
    index = Index.load(open_store(packed))
    native, numpy = _encoder(index, True), _encoder(index, False)
    for directory in range(index.count):
        rows = index.children(directory)
        for start in {rows.start, (rows.start + rows.stop) // 2}:
            for attributes in Attributes:
                for space in (0, 100, 4096, 1 << 20):
                    args = (range(start, rows.stop), 7, space, attributes)
                    (a, count_a), (b, count_b) = native.encode(*args), numpy.encode(*args)
                    assert count_a == count_b and a.tobytes() == b.tobytes()


def test_a_library_built_for_another_index_format_is_not_used(
    packed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``_dirents.so`` or ``_server.so`` left from before a format change would read the columns at
    the wrong widths: both say which format they were built for, and are left unused for another."""
    index = Index.load(open_store(packed))
    assert _encoder(index, True).native and server.available(index) is None
    monkeypatch.setattr(fmt, "FORMAT_VERSION", fmt.FORMAT_VERSION + 1)
    assert not dirents.Encoder(index, 1, 3600.0, BLKSIZE).native
    assert "built for another index format" in (server.available(index) or "")


@pytest.mark.parametrize(
    "module, mirror, widened",
    [
        (dirents, "Columns", None),
        (dirents, "Reply", "valid_nsec"),
        (server, "_Dataset", "statfs_bsize"),
        (server, "_Counts", None),
    ],
    ids=["columns-a-field-fewer", "reply-a-field-wider", "dataset-a-field-wider", "counts-a-field-fewer"],
)
def test_a_library_whose_structs_differ_from_their_mirrors_is_not_used(
    packed: Path, monkeypatch: pytest.MonkeyPatch, module: object, mirror: str, widened: str | None
) -> None:
    """A mirror that differs from its C struct in its fields, its size or only an offset would read
    and write fields at the wrong places: the library is left unused, and the reason names the
    struct."""
    index = Index.load(open_store(packed))
    original = getattr(module, mirror)
    fields = (
        original._fields_[:-1]
        if widened is None
        else [(name, ctypes.c_uint64 if name == widened else kind) for name, kind in original._fields_]
    )
    methods = {name: original.__dict__[name] for name in ("of",) if name in original.__dict__}
    monkeypatch.setattr(module, mirror, type(mirror, (ctypes.Structure,), {"_fields_": fields, **methods}))
    struct_name = {"Columns": "columns", "Reply": "reply", "_Dataset": "dataset", "_Counts": "counts"}[mirror]
    assert f"lays out struct {struct_name} otherwise" in (server.available(index) or "")
    if module is dirents:
        assert not dirents.Encoder(index, 1, 3600.0, BLKSIZE).native
