"""Directory listings in the kernel's FUSE wire format, encoded many entries per numpy step.

A READDIR reply is a buffer of records: ``struct fuse_dirent`` (inode, offset of the next entry,
name length, type) and the name, padded to 8 bytes; READDIRPLUS puts a ``struct fuse_entry_out``
(inode, generation, timeouts, ``struct fuse_attr``) before each. libfuse fills one record per
call, and at one Python call and one ``EntryAttributes`` per entry, listings took the daemon
5-15 µs per entry: most of a cold ``find`` or ImageFolder scan over a million files. Here a run of
consecutive index rows (a directory's children) becomes records in a few array operations, handed
to the patched pyfuse3's ``readdir_reply_raw``.
"""

from __future__ import annotations

import numpy as np

from dlfs import format as fmt
from dlfs.index import Index

#: struct fuse_dirent, without the name that follows it.
DIRENT = np.dtype([("ino", "=u8"), ("off", "=u8"), ("namelen", "=u4"), ("type", "=u4")])
#: struct fuse_entry_out, struct fuse_attr included (include/uapi/linux/fuse.h).
ENTRY_OUT = np.dtype(
    [
        ("nodeid", "=u8"),
        ("generation", "=u8"),
        ("entry_valid", "=u8"),
        ("attr_valid", "=u8"),
        ("entry_valid_nsec", "=u4"),
        ("attr_valid_nsec", "=u4"),
        ("ino", "=u8"),
        ("size", "=u8"),
        ("blocks", "=u8"),
        ("atime", "=u8"),
        ("mtime", "=u8"),
        ("ctime", "=u8"),
        ("atimensec", "=u4"),
        ("mtimensec", "=u4"),
        ("ctimensec", "=u4"),
        ("mode", "=u4"),
        ("nlink", "=u4"),
        ("uid", "=u4"),
        ("gid", "=u4"),
        ("rdev", "=u4"),
        ("blksize", "=u4"),
        ("flags", "=u4"),
    ]
)
assert DIRENT.itemsize == 24 and ENTRY_OUT.itemsize == 128
#: Records start and end on 8-byte boundaries (FUSE_DIRENT_ALIGN).
WORD = 8
#: The smallest record (a one-byte name): bounds how many rows can fit in a reply.
MIN_RECORD = DIRENT.itemsize + 8


def encode(
    index: Index,
    rows: range,
    first_next: int,
    space: int,
    plus: bool,
    inode_base: int,
    timeout: float,
    blksize: int,
) -> tuple[np.ndarray, int]:
    """Records for the leading ``rows`` that fit in ``space`` bytes, and how many rows that is.

    Row ``rows.start + k`` gets inode ``row + inode_base`` and says the listing continues at
    offset ``first_next + k``. ``plus`` adds attributes valid for ``timeout`` seconds.
    """
    rows = range(rows.start, min(rows.stop, rows.start + space // MIN_RECORD))
    bounds = index.name_off[rows.start : rows.stop + 1].astype(np.int64)
    name_len = np.diff(bounds)
    head = DIRENT.itemsize + (ENTRY_OUT.itemsize if plus else 0)
    ends = np.cumsum((head + name_len + 7) & ~7)
    count = int(np.searchsorted(ends, space, side="right"))
    if count == 0:
        return np.zeros(0, dtype=np.uint8), 0
    rows = range(rows.start, rows.start + count)
    ends, name_len = ends[:count], name_len[:count]
    starts = np.concatenate(([0], ends[:-1]))
    out = np.zeros(int(ends[-1]), dtype=np.uint8)
    inodes = np.arange(rows.start, rows.stop, dtype=np.uint64) + np.uint64(inode_base)
    mode = index.mode[rows.start : rows.stop]

    dirent = np.zeros(count, DIRENT)
    dirent["ino"] = inodes
    dirent["off"] = np.arange(first_next, first_next + count)
    dirent["namelen"] = name_len
    dirent["type"] = (mode & fmt.TYPE_MASK) >> 12
    if plus:
        _scatter(out, starts, _entries(index, rows, inodes, timeout, blksize))
    _scatter(out, starts + head - DIRENT.itemsize, dirent)

    # Consecutive rows' names are consecutive in the names blob: byte i of that run belongs to
    # name k and goes to i + (starts[k] + head) - (bounds[k] - bounds[0]).
    shift = np.repeat(starts + head - (bounds[:count] - bounds[0]), name_len)
    out[np.arange(shift.size) + shift] = index.names[bounds[0] : bounds[count]]
    return out, count


def _entries(index: Index, rows: range, inodes: np.ndarray, timeout: float, blksize: int) -> np.ndarray:
    mode, nlink, uid, gid, size, blocks, mtime = index.attrs_columns(rows)
    entry = np.zeros(len(rows), ENTRY_OUT)
    entry["nodeid"] = entry["ino"] = inodes
    entry["entry_valid"] = entry["attr_valid"] = int(timeout)
    entry["entry_valid_nsec"] = entry["attr_valid_nsec"] = int((timeout % 1) * 1e9)
    seconds, nanoseconds = np.divmod(mtime, 1_000_000_000)
    for field in ("atime", "mtime", "ctime"):
        entry[field] = seconds
        entry[field + "nsec"] = nanoseconds
    entry["mode"], entry["nlink"], entry["uid"], entry["gid"] = mode, nlink, uid, gid
    entry["size"], entry["blocks"], entry["blksize"] = size, blocks, blksize
    return entry


def _scatter(out: np.ndarray, starts: np.ndarray, records: np.ndarray) -> None:
    """Write fixed-size ``records`` into ``out`` at byte offsets ``starts``.

    Records and offsets are multiples of 8 bytes, so the copy moves 8-byte words: 8 times fewer
    elements to index than bytes.
    """
    width = records.dtype.itemsize // WORD
    words = out.view(np.uint64)
    words[(starts // WORD)[:, None] + np.arange(width)] = records.view(np.uint64).reshape(-1, width)
