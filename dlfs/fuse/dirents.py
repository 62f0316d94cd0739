"""Directory listings in the kernel's FUSE wire format, a run of entries per call.

A READDIR reply is a buffer of records: ``struct fuse_dirent`` (inode, offset of the next entry,
name length, type) and the name, padded to 8 bytes; READDIRPLUS puts a ``struct fuse_entry_out``
(inode, generation, timeouts, ``struct fuse_attr``) before each. libfuse fills one record per
call, and at one Python call and one ``EntryAttributes`` per entry, listings were most of what a
cold ``find`` or ImageFolder scan over a million files waited for in the daemon. Here a run of
consecutive index rows (a directory's children) becomes records in one call, handed to the patched
pyfuse3's ``readdir_reply_raw``: a loop in C (``_dirents.c``) when it is built, else a few numpy
array operations (most of their time per-call overhead).
"""

from __future__ import annotations

import ctypes
import enum
import logging
import stat
from collections.abc import Callable
from pathlib import Path

import numpy as np

from dlfs.core import format as fmt
from dlfs.core.index import Index

log = logging.getLogger(__name__)

LIBRARY = Path(__file__).with_name("_dirents.so")


class Attributes(enum.IntEnum):
    """What a record carries besides name, inode and type (``attrs`` in ``_dirents.c``)."""

    #: A READDIR record.
    NONE = 0
    #: A READDIRPLUS record: the kernel builds an inode and a dentry from it.
    ALL = 1
    #: READDIRPLUS records whose entry is zero for everything but directories: a zero node id
    #: tells the kernel to build nothing for that name (it still lists it). A scan learns the
    #: folders it is about to open, without an inode for every file.
    DIRS = 2


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
    attrs: Attributes,
    inode_base: int,
    timeout: float,
    blksize: tuple[int, int],
) -> tuple[np.ndarray, int]:
    """Records for the leading ``rows`` that fit in ``space`` bytes, and how many rows that is.

    Row ``rows.start + k`` gets inode ``row + inode_base`` and says the listing continues at
    offset ``first_next + k``. Attributes are valid for ``timeout`` seconds, with ``blksize``
    (files, directories) as the block size.
    """
    plus = attrs != Attributes.NONE
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
    inodes = index.hard_links.inode_rows(np.arange(rows.start, rows.stop)).astype(np.uint64) + np.uint64(
        inode_base
    )
    mode = index.mode[rows.start : rows.stop]

    dirent = np.zeros(count, DIRENT)
    dirent["ino"] = inodes
    dirent["off"] = np.arange(first_next, first_next + count)
    dirent["namelen"] = name_len
    dirent["type"] = (mode & fmt.TYPE_MASK) >> 12
    if plus:
        entries = _entries(index, rows, inodes, timeout, blksize)
        if attrs == Attributes.DIRS:
            entries[mode & fmt.TYPE_MASK != stat.S_IFDIR] = 0
        _scatter(out, starts, entries)
    _scatter(out, starts + head - DIRENT.itemsize, dirent)

    # Consecutive rows' names are consecutive in the names blob: byte i of that run belongs to
    # name k and goes to i + (starts[k] + head) - (bounds[k] - bounds[0]).
    shift = np.repeat(starts + head - (bounds[:count] - bounds[0]), name_len)
    out[np.arange(shift.size) + shift] = index.names[bounds[0] : bounds[count]]
    return out, count


def _entries(
    index: Index, rows: range, inodes: np.ndarray, timeout: float, blksize: tuple[int, int]
) -> np.ndarray:
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
    entry["size"], entry["blocks"] = size, blocks
    entry["blksize"] = np.where(mode & fmt.TYPE_MASK == stat.S_IFDIR, blksize[1], blksize[0])
    return entry


def _scatter(out: np.ndarray, starts: np.ndarray, records: np.ndarray) -> None:
    """Write fixed-size ``records`` into ``out`` at byte offsets ``starts``.

    Records and offsets are multiples of 8 bytes, so the copy moves 8-byte words: 8 times fewer
    elements to index than bytes.
    """
    width = records.dtype.itemsize // WORD
    words = out.view(np.uint64)
    words[(starts // WORD)[:, None] + np.arange(width)] = records.view(np.uint64).reshape(-1, width)


def mismatch(library: ctypes.CDLL, mirrors: dict[str, type[ctypes.Structure]]) -> str | None:
    """Why ``library`` (``_dirents.so`` or ``_server.so``) does not fit this dlfs, or None when it does.

    One left from before a change to the index format would read the columns at the wrong widths,
    and one whose structs differ from their ctypes ``mirrors`` (C struct name -> mirror) would
    read and write their fields at the wrong places. So each library says the format it was built
    for, and exports the layout of each such struct as ``dlfs_<name>_layout``: the number of
    fields, the size, then each field's offset.
    """
    try:
        if ctypes.c_uint32.in_dll(library, "dlfs_index_format").value != fmt.FORMAT_VERSION:
            return "was built for another index format"
    except ValueError:  # built before the library said
        return "was built for another index format"
    for name, mirror in mirrors.items():
        symbol = f"dlfs_{name}_layout"
        try:
            fields = ctypes.c_uint64.in_dll(library, symbol).value
        except ValueError:  # built before the library said
            return f"does not describe its struct {name}"
        theirs = list((ctypes.c_uint64 * (fields + 2)).in_dll(library, symbol))
        offsets = [getattr(mirror, field[0]).offset for field in mirror._fields_]
        if theirs != [len(mirror._fields_), ctypes.sizeof(mirror), *offsets]:
            return f"lays out struct {name} otherwise than {mirror.__module__}.{mirror.__qualname__}"
    return None


#: The index's columns ``struct columns`` points at, in its order.
INDEX_COLUMNS = ("name_off", "names", "mode", "owner", "owners", "size", "stored", "mtime")


class Columns(ctypes.Structure):
    """``struct columns`` of ``_entry.h``: where the index's columns lie in memory."""

    _fields_ = [
        *((name, ctypes.c_void_p) for name in INDEX_COLUMNS),
        *((name, ctypes.c_void_p) for name in ("hard_rows", "hard_inodes", "hard_nlink")),
        ("hard_count", ctypes.c_uint64),
    ]

    @classmethod
    def of(cls, index: Index) -> Columns | None:
        """The columns of ``index``, or None when they are not in this host's byte order."""
        links = index.hard_links
        columns = {
            **{name: getattr(index, name) for name in INDEX_COLUMNS},
            "hard_rows": links.rows,
            "hard_inodes": links.inodes,
            "hard_nlink": links.nlink,
        }
        if not all(c.flags.c_contiguous and c.dtype.isnative for c in columns.values()):
            return None
        return cls(**{name: column.ctypes.data for name, column in columns.items()}, hard_count=len(links))


class Reply(ctypes.Structure):
    """``struct reply`` of ``_entry.h``: what every entry of a mount's listings shares."""

    _fields_ = [
        ("inode_base", ctypes.c_uint64),
        ("valid", ctypes.c_uint64),
        ("valid_nsec", ctypes.c_uint32),
        ("file_blksize", ctypes.c_uint32),
        ("dir_blksize", ctypes.c_uint32),
    ]

    @classmethod
    def of(cls, inode_base: int, timeout: float, blksize: tuple[int, int]) -> Reply:
        """Inode = row + ``inode_base``, entries valid ``timeout`` seconds, block sizes (files, folders)."""
        return cls(inode_base, int(timeout), int((timeout % 1) * 1e9), *blksize)


class Encoder:
    """``encode`` for one index and one mount's settings: in C when ``_dirents.so`` is built (and
    the index's little-endian columns are the host's order), with numpy otherwise."""

    def __init__(
        self,
        index: Index,
        inode_base: int,
        timeout: float,
        blksize: tuple[int, int],
        library: Path | None = LIBRARY,
    ) -> None:
        self.index = index
        self.inode_base = inode_base
        self.timeout = timeout
        self.blksize = blksize
        self._call = self._bind(library) if library is not None else None

    @property
    def native(self) -> bool:
        return self._call is not None

    def _bind(self, library: Path) -> Callable[..., int] | None:
        if not library.exists():
            log.info("%s is not built (make install builds it): listing directories with numpy", library.name)
            return None
        columns = Columns.of(self.index)
        if columns is None:
            log.info("index columns not in this host's byte order: listing directories with numpy")
            return None
        loaded = ctypes.CDLL(str(library))
        reason = mismatch(loaded, {"columns": Columns, "reply": Reply})
        if reason is not None:
            log.info("%s %s (make install rebuilds it): listing with numpy", library.name, reason)
            return None
        self._columns = columns
        self._reply = Reply.of(self.inode_base, self.timeout, self.blksize)
        call = loaded.dlfs_encode_dirents
        call.restype = ctypes.c_int64
        call.argtypes = [
            ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint64, ctypes.c_int,
            ctypes.POINTER(Columns), ctypes.POINTER(Reply), ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64),
        ]  # fmt: skip
        return call

    def encode(self, rows: range, first_next: int, space: int, attrs: Attributes) -> tuple[np.ndarray, int]:
        """As the module's ``encode``, with this mount's inode base, timeout and block sizes."""
        if self._call is None:
            return encode(
                self.index, rows, first_next, space, attrs, self.inode_base, self.timeout, self.blksize
            )
        plus = attrs != Attributes.NONE
        head = DIRENT.itemsize + (ENTRY_OUT.itemsize if plus else 0)
        rows = range(rows.start, min(rows.stop, rows.start + space // (head + WORD)))
        # Room for every candidate, each padded by at most a word, but never more than ``space``.
        names = int(self.index.name_off[rows.stop]) - int(self.index.name_off[rows.start])
        out = np.empty(min(space, names + len(rows) * (head + WORD)), dtype=np.uint8)
        nlink = self.index.link_counts(rows) if plus else None
        used = ctypes.c_int64()
        count = self._call(
            out.ctypes.data, out.size, rows.start, rows.stop, first_next, attrs, self._columns, self._reply,
            None if nlink is None else nlink.ctypes.data, used,
        )  # fmt: skip
        return out[: used.value], int(count)
