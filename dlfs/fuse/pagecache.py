"""Does the kernel already cache a file of the mount? So the read-ahead skips what it holds.

From the second epoch on (or after any job that read the data), the mount's page cache often holds
the files already, and pushing them again copies them for nothing while the readers wait for CPU.
The daemon asks the kernel with ``cachestat`` (Linux >= 6.5) on a descriptor opened through its own
mountpoint: the path walk and the open are answered from the kernel's caches (entries never expire,
opens are never sent), so the question costs a few system calls and no round trip.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os

#: cachestat's number in the generic syscall table, the same on every architecture.
SYS_CACHESTAT = 451
PAGE = os.sysconf("SC_PAGE_SIZE")


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


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def cached_pages(fd: int, length: int, offset: int = 0) -> int | None:
    """Pages of ``length`` bytes of ``fd`` from ``offset`` in the page cache; None without cachestat."""
    span, out = _Range(offset, length), _Stat()
    if _libc.syscall(SYS_CACHESTAT, fd, ctypes.byref(span), ctypes.byref(out), 0) != 0:
        code = ctypes.get_errno()
        if code in (errno.ENOSYS, errno.EPERM):  # an older kernel, or a seccomp filter
            return None
        raise OSError(code, os.strerror(code))
    return int(out.nr_cache)


def in_memory(fd: int, offset: int, length: int) -> bool | None:
    """Is every page of the range in the page cache? None where the kernel cannot tell (no
    cachestat). Unlike a read that must not wait, which starts reading what is missing before it
    gives up, asking starts no I/O."""
    if length == 0:
        return True
    pages = cached_pages(fd, length, offset)
    return None if pages is None else pages >= (offset + length - 1) // PAGE - offset // PAGE + 1


class MountPageCache:
    """Questions to the kernel about the mount, asked through the mountpoint like any program would.

    ``holds(path, size)``: is every page of a file in the kernel page cache? ``reveal(path)``: list a
    directory so that the kernel learns all its entries (one READDIRPLUS per MiB of them), which a
    ``notify_store`` needs before it can push a file's pages.
    """

    def __init__(self, mountpoint: str) -> None:
        self.mountpoint = os.fsencode(mountpoint)
        self.available = True

    def holds(self, path: bytes, size: int) -> bool:
        if not self.available or size == 0:
            return False
        try:
            fd = os.open(self.mountpoint + b"/" + path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            held = in_memory(fd, 0, size)
        finally:
            os.close(fd)
        if held is None:
            self.available = False
            return False
        return held

    def reveal(self, path: bytes) -> None:
        # On failure the pushes stay refused and the files are read through the daemon.
        with contextlib.suppress(OSError):
            os.listdir(self.mountpoint + b"/" + path if path else self.mountpoint)
