"""The C library calls dlfs makes that Python's ``os`` module lacks, bound once, and the kernel's
numbers they and the C loops share.

- ``cachestat`` (Linux >= 6.5): how many pages of a range are in the page cache, asked without
  starting any I/O, which a read with ``RWF_NOWAIT`` does not promise (it starts reading the pages
  it misses before it gives up).
- ``sync_file_range``: start writing a range back without waiting for it (pack).
- ``fallocate`` with ``PUNCH_HOLE``: free a range of a file (the disk tier's evictions).
- ``open_tree`` with ``OPEN_TREE_CLONE``: a detached copy of a mount (the daemon's own view of it).
- ``malloc_trim``: hand the allocator's free pages back to the system (the RAM cache).

The C loops (``dlfs/readahead/_push.c``, ``dlfs/fuse/_dirents.c``) define the same numbers for
themselves (C cannot import them); tests/core/test_layers.py checks that both agree.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
from collections.abc import Callable
from typing import NamedTuple

#: cachestat's number in the generic syscall table, the same on every architecture.
SYS_CACHESTAT = 451
#: The unit of ``st_blocks``, whatever the filesystem's block size.
STAT_BLOCK = 512
#: Direct (O_DIRECT) reads start and end on this boundary.
DIRECT_ALIGN = 4096
PAGE = os.sysconf("SC_PAGE_SIZE")
_SYNC_FILE_RANGE_WRITE = 2
#: open_tree's number in the generic syscall table (Linux >= 5.2), and its flags.
SYS_OPEN_TREE = 428
_OPEN_TREE_CLONE = 1
_OPEN_TREE_CLOEXEC = os.O_CLOEXEC
_AT_FDCWD = -100
_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


class _Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Stat(ctypes.Structure):
    _fields_ = [
        ("nr_cache", ctypes.c_uint64),
        ("nr_dirty", ctypes.c_uint64),
        ("nr_writeback", ctypes.c_uint64),
        ("nr_evicted", ctypes.c_uint64),
        ("nr_recently_evicted", ctypes.c_uint64),
    ]


class CacheStat(NamedTuple):
    """Pages of a range in the page cache (``cached``), and pages of it that memory reclaim took
    (``evicted``: the kernel keeps a shadow entry for each; pages dropped on request, by
    ``drop_caches`` or ``POSIX_FADV_DONTNEED``, leave none)."""

    cached: int
    evicted: int


def stat_blocks(size: int) -> int:
    """``st_blocks`` of a file that takes ``size`` bytes."""
    return (size + STAT_BLOCK - 1) // STAT_BLOCK


def cachestat(fd: int, length: int, offset: int = 0) -> CacheStat | None:
    """The page cache's state of ``length`` bytes of ``fd`` from ``offset``; None without cachestat."""
    span, out = _Range(offset, length), _Stat()
    if _libc.syscall(SYS_CACHESTAT, fd, ctypes.byref(span), ctypes.byref(out), 0) != 0:
        code = ctypes.get_errno()
        if code in (errno.ENOSYS, errno.EPERM):  # an older kernel, or a seccomp filter
            return None
        raise OSError(code, os.strerror(code))
    return CacheStat(int(out.nr_cache), int(out.nr_evicted))


def cached_pages(fd: int, length: int, offset: int = 0) -> int | None:
    """Pages of ``length`` bytes of ``fd`` from ``offset`` in the page cache; None without cachestat."""
    state = cachestat(fd, length, offset)
    return None if state is None else state.cached


def in_memory(fd: int, offset: int, length: int) -> bool | None:
    """Is every page of the range in the page cache? None where the kernel cannot tell (no
    cachestat). Unlike a read that must not wait, which starts reading what is missing before it
    gives up, asking starts no I/O."""
    if length == 0:
        return True
    pages = cached_pages(fd, length, offset)
    return None if pages is None else pages >= (offset + length - 1) // PAGE - offset // PAGE + 1


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Start writing ``length`` bytes of ``fd`` from ``offset`` to the disk; returns at once."""
    _libc.sync_file_range(fd, offset, length, _SYNC_FILE_RANGE_WRITE)


def punch_hole(fd: int, offset: int, length: int) -> None:
    """Free the disk blocks of a range of ``fd``, which then reads as zeros; the size stays."""
    if _libc.fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, length) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def open_tree_clone(path: str | bytes) -> int:
    """An ``O_PATH`` descriptor of a detached copy of the mount at ``path``: files opened through it
    hold the copy, not the mount, so they never make an unmount of ``path`` busy. Needs
    CAP_SYS_ADMIN; OSError where it is refused or the kernel lacks the call."""
    fd = _libc.syscall(SYS_OPEN_TREE, _AT_FDCWD, os.fsencode(path), _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC)
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return fd


def _allocator_trim() -> Callable[[], object] | None:
    """glibc's ``malloc_trim(0)``, or None where the C library has none (musl)."""
    try:
        trim = _libc.malloc_trim
    except AttributeError:
        return None
    trim.argtypes = [ctypes.c_size_t]
    return functools.partial(trim, 0)


#: Hand the allocator's free memory back to the system; None where the C library cannot.
trim_allocator = _allocator_trim()
