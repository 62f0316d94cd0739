"""Does the kernel already cache a file of the mount? So the read-ahead skips what it holds.

From the second epoch on (or after any job that read the data), the mount's page cache often holds
the files already, and pushing them again copies them for nothing while the readers wait for CPU.
The daemon asks the kernel with ``cachestat`` (Linux >= 6.5) on a descriptor opened through its own
mountpoint: the path walk and the open are answered from the kernel's caches (entries never expire,
opens are never sent), so the question costs a few system calls and no round trip.
"""

from __future__ import annotations

import contextlib
import os

from dlfs.core.libc import in_memory


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
