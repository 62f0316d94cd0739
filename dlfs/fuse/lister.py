"""List folders through the mount, with every file's attributes, so that the kernel knows the files.

Two cases call for it. A program that opens files by name (a file list, COCO-style annotations)
while the kernel caches none of the folder's entries (a fresh mount with no scan, or after memory
pressure) costs the daemon a LOOKUP per file, ~100 µs of Python each. One READDIRPLUS listing
teaches the kernel a whole folder, a dentry and an inode per entry, for what a few dozen LOOKUPs
cost, and the opens that follow never reach the daemon. So after a few misses in one folder, the
folder is listed in the background, through the mountpoint like any program would: once, and again
only after the kernel forgot some of its entries. The native request server (``dlfs.fuse.server``)
answers LOOKUPs in C for a few µs each and tells nobody: this applies to the LOOKUPs Python answers.

And a scan of the whole tree (ImageFolder's, ``find``) under ``--readdirplus auto``: its listings
give files no attributes, so it runs at plain listing speed, but the kernel then holds no inode for
the files and the read-ahead cannot push them. Once every folder holding files has been listed so,
all of them are listed again with attributes in the background: the first epoch finds the inodes
ready, as after an ``always`` scan, which builds them in the scanning process's own time.
"""

from __future__ import annotations

import queue
import threading
from collections import Counter
from collections.abc import Callable

import numpy as np

from dlfs.core.index import Index

#: LOOKUPs of one folder's entries that make it worth listing: a program walking it by name, not a
#: stat or two.
MISSES = 4
#: Listings at once. Each waits on round trips through a daemon that is busy answering the walk
#: (~50 ms for a folder of 200 while 8 processes stat it), so one at a time fell behind the walkers.
THREADS = 4


class FolderLister:
    """Counts LOOKUPs and listings without attributes per folder (on the loop thread) and lists
    folders from threads of its own: a listing goes through the mount, so the loop must stay free
    to answer it.

    The read-ahead lists the folders it is about to push into through ``reveal_once`` too, so that
    a folder is listed once however many want it: a second listing would drop the first one's
    cached entries and make the kernel build them again.
    """

    def __init__(
        self, index: Index, reveal: Callable[[int], None], misses: int = MISSES, after_scans: bool = True
    ) -> None:
        self.index = index
        self.reveal = reveal
        self.misses = misses
        #: List the whole tree again after a scan of it: only the read-ahead needs the inodes.
        self.after_scans = after_scans
        self.listed = 0
        self._revealed: dict[int, threading.Event] = {}  # set: listed; unset: being listed
        self._revealing = threading.Lock()
        self._count = threading.Lock()
        self._misses: Counter[int] = Counter()
        self._done: set[int] = set()
        self._queue: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._pending = 0  # queued or being listed; guarded by _count
        self._threads: list[threading.Thread] = []
        self._folders: np.ndarray | None = None  # rows of folders holding files, found at the first scan
        self._is_folder: np.ndarray | None = None  # the same as a mask over rows
        self._scanned: set[int] = set()  # listed without attributes since the last relisting

    def looked_up(self, parent: int) -> None:
        """A LOOKUP found an entry of ``parent``, which the kernel did not have."""
        if parent in self._done:
            return
        self._misses[parent] += 1
        if self._misses[parent] < self.misses:
            return
        del self._misses[parent]
        self._list([parent])

    def scanned(self, folder: int) -> None:
        """A listing of ``folder`` began without giving its files attributes."""
        if not self.after_scans:
            return
        if self._folders is None or self._is_folder is None:
            self._is_folder = np.zeros(self.index.count, dtype=bool)
            self._is_folder[self.index.parent[self.index.regular_rows()]] = True  # no sort, unlike unique
            self._folders = np.flatnonzero(self._is_folder)
        if not self._is_folder[folder]:
            return
        self._scanned.add(folder)
        if len(self._scanned) == len(self._folders):  # the whole tree: list it all again, with attributes
            self._scanned.clear()
            self._list(self._folders.tolist())

    @property
    def pending(self) -> int:
        """Folders queued or being listed: 0 once the background work is done."""
        with self._count:
            return self._pending

    def _list(self, folders: list[int]) -> None:
        folders = [folder for folder in folders if folder not in self._done]
        self._done.update(folders)
        with self._count:
            self._pending += len(folders)
        for folder in folders:
            self._queue.put(folder)
        if folders and not self._threads:
            names = (f"dlfs-lister-{k}" for k in range(THREADS))
            self._threads = [threading.Thread(target=self._run, name=name, daemon=True) for name in names]
            for thread in self._threads:
                thread.start()

    def reveal_once(self, folder: int) -> bool:
        """List ``folder`` unless it was listed and none of its entries forgotten since; when
        another thread is listing it, wait for that listing instead. True if this call listed it."""
        with self._revealing:
            done = self._revealed.get(folder)
            if done is None:
                self._revealed[folder] = mine = threading.Event()
        if done is not None:
            done.wait()
            return False
        try:
            self.reveal(folder)
        finally:
            mine.set()
        return True

    def forgotten(self, folders: list[int]) -> None:
        """The kernel dropped entries of these folders: they may be listed again."""
        if not (self._done or self._revealed):
            return
        self._done.difference_update(folders)
        with self._revealing:
            for folder in folders:
                self._revealed.pop(folder, None)

    def _run(self) -> None:
        while True:
            listed = self.reveal_once(self._queue.get())
            with self._count:
                self.listed += listed
                self._pending -= 1
