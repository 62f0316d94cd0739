"""The daemon's own view of its mount: which files the kernel caches, and listings that teach it files.

From the second epoch on (or after any job that read the data), the mount's page cache often holds
the files already, and pushing them again copies them for nothing while the readers wait for CPU.
The daemon asks the kernel with ``cachestat`` (Linux >= 6.5) on a descriptor opened through the
mount: the path walk and the open are answered from the kernel's caches (entries never expire,
opens are never sent), so the question costs a few system calls and no round trip. And it lists
folders through the mount so that the kernel learns their files (``reveal``).

Those descriptors go through a detached copy of the mount (``open_tree``), not the mountpoint: a
directory the daemon lists while a user runs ``fusermount3 -u`` makes the unmount fail as busy
(right after an epoch is announced on a 300-folder tree: 8 times in 8 through the mountpoint, 0
through the copy). Files opened through the copy hold the copy only. The
copy keeps the filesystem alive after the mountpoint is unmounted, so the daemon closes it then
(``close``, from ``daemon``'s watch of the mount table) and the kernel ends the session. Where
``open_tree`` is refused (not root), the view goes through the mountpoint as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading

from dlfs.core.libc import in_memory, open_tree_clone

log = logging.getLogger(__name__)


class MountPageCache:
    """Questions to the kernel about the mount, asked the way any program would, from threads.

    ``holds(path, size)``: is every page of a file in the kernel page cache? ``reveal(path)``: list a
    directory so that the kernel learns all its entries (one READDIRPLUS per MiB of them), which a
    ``notify_store`` needs before it can push a file's pages. The view is taken at first use, once
    the mount answers requests (taking it walks to the mount's root).
    """

    def __init__(self, mountpoint: str) -> None:
        self.mountpoint = os.fsencode(mountpoint)
        self.available = True
        self._closed = False
        self._view: int | None = None  # the detached copy's O_PATH descriptor; None: the mountpoint
        self._opened = False
        self._lock = threading.Lock()

    def _root(self) -> tuple[int | None, bytes]:
        """(directory descriptor, prefix) that paths of the mount are opened relative to."""
        if not self._opened:
            with self._lock:
                if not self._opened and not self._closed:
                    try:
                        self._view = open_tree_clone(self.mountpoint)
                    except OSError as exc:
                        log.info("listing through the mountpoint (an unmount may find it busy): %s", exc)
                    self._opened = True
        if self._view is None:
            return None, self.mountpoint + b"/"
        return self._view, b""

    def _open(self, path: bytes, flags: int) -> int:
        if self._closed:
            raise OSError("the mount's view is closed")
        root, prefix = self._root()
        return os.open(prefix + path if path else prefix or b".", flags | os.O_CLOEXEC, dir_fd=root)

    def holds(self, path: bytes, size: int) -> bool:
        if not self.available or size == 0:
            return False
        try:
            fd = self._open(path, os.O_RDONLY)
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
            fd = self._open(path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.listdir(fd)
            finally:
                os.close(fd)

    def close(self) -> None:
        """Let go of the mount: the mountpoint was unmounted, and the copy must not keep it alive."""
        with self._lock:
            self._closed = True
            view, self._view = self._view, None
        if view is not None:
            os.close(view)
