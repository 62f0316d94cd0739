"""Read, verify and push many files into the kernel page cache in one call, in C (``_push.c``).

The read-ahead's inner loop (for each file: ``pread`` from its shard, check its xxh3-64, write a
FUSE_NOTIFY_STORE message for its inode) cost the daemon more in Python than the copies themselves:
interpreter time per file and GIL hand-offs between the fetching threads. The C loop releases the
GIL for a whole run of files. It handles the common file: stored plain, small enough to hold whole,
in a shard the store can hand a descriptor for. Everything else stays on the Python path, which is
also the fallback when the library was not built (``make install`` builds it).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path

import numpy as np

from dlfs.core.libc import DIRECT_ALIGN

LIBRARY = Path(__file__).with_name("_push.so")

_i32 = np.ctypeslib.ndpointer(np.int32, flags="C_CONTIGUOUS")
_i64 = np.ctypeslib.ndpointer(np.int64, flags="C_CONTIGUOUS")
_u64 = np.ctypeslib.ndpointer(np.uint64, flags="C_CONTIGUOUS")
_u8 = np.ctypeslib.ndpointer(np.uint8, flags="C_CONTIGUOUS")


#: Direct reads start and end on this boundary (as ``ALIGN`` in ``_push.c``).
ALIGN = DIRECT_ALIGN


class NativePusher:
    """The C loop, bound to one mount's ``/dev/fuse`` descriptor; blocking, for fetching threads."""

    def __init__(
        self,
        fuse_fd: int,
        first_inode: int,
        inode_rows: Callable[[np.ndarray], np.ndarray] | None = None,
        library: Path = LIBRARY,
    ) -> None:
        """``inode_rows``: the rows whose inodes files' rows answer as (``Index.hard_links``);
        None: each row its own."""
        self.fuse_fd = fuse_fd
        self.first_inode = np.uint64(first_inode)
        self.inode_rows = inode_rows
        lib = ctypes.CDLL(str(library))  # ctypes releases the GIL for the duration of each call
        self._call = lib.dlfs_push_files
        self._call.restype = ctypes.c_int
        self._call.argtypes = [
            ctypes.c_int, _u8, ctypes.c_int64, ctypes.c_int,
            _i32, _i32, _i64, _i64, _i32, _i64, _i64, _u64, _u64, _i32,
        ]  # fmt: skip

    @staticmethod
    def buffer_shares(offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Each read's room in the buffer ``push`` needs, in case it is read directly: widened to
        ``ALIGN`` boundaries."""
        return ((offsets + lengths + ALIGN - 1) & -ALIGN) - (offsets & -ALIGN)

    @classmethod
    def buffer_size(cls, offsets: np.ndarray, lengths: np.ndarray) -> int:
        """The buffer ``push`` needs for these reads: all of them side by side, and room to align
        the first."""
        return int(cls.buffer_shares(offsets, lengths).sum()) + ALIGN

    def push(
        self,
        buffer: np.ndarray,
        reads: tuple[np.ndarray, ...],
        files: tuple[np.ndarray, ...],
    ) -> tuple[np.ndarray, bool]:
        """Make the storage ``reads`` in turn and push the ``files`` they hold into the kernel page
        cache.

        ``reads``: columns descriptor, O_DIRECT descriptor (or -1), offset, length, and one past the
        index of the last file each holds. ``files``: columns shard offset, length, checksum, row
        (-1: check only). A read goes through the page cache when it holds all its bytes; the
        others are read directly, all at once. Returns each file's status (0: done; else an errno:
        EIO damaged, ENOENT the kernel does not know the inode yet, or the read's or the push's
        error) and whether it read directly.
        """
        fds, direct_fds, offsets, lengths, ends = (
            np.ascontiguousarray(a, t) for a, t in zip(reads, _READ, strict=True)
        )
        at, size, checksum, rows = files
        inodes = rows if self.inode_rows is None else np.where(rows >= 0, self.inode_rows(rows), rows)
        nodeids = np.where(rows >= 0, inodes.astype(np.uint64) + self.first_inode, np.uint64(0))
        status = np.empty(rows.size, dtype=np.int32)
        cold = self._call(
            self.fuse_fd, buffer, buffer.size, fds.size, fds, direct_fds, offsets, lengths, ends,
            np.ascontiguousarray(at, dtype=np.int64), np.ascontiguousarray(size, dtype=np.int64),
            np.ascontiguousarray(checksum, dtype=np.uint64), nodeids, status,
        )  # fmt: skip
        return status, bool(cold)


_READ = (np.int32, np.int32, np.int64, np.int64, np.int32)
