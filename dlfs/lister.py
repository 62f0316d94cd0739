"""List a folder through the mount when a program looks its files up one by one.

A program that opens files by name (a file list, COCO-style annotations) while the kernel caches
none of the folder's entries (a fresh mount with no scan, or after memory pressure) costs the
daemon a LOOKUP per file, ~100 µs of Python each. One READDIRPLUS listing teaches the kernel a whole
folder, a dentry and an inode per entry, for what a few dozen LOOKUPs cost, and the opens that
follow never reach the daemon. So after a few misses in one folder, the folder is listed in the
background, through the mountpoint like any program would: once, and again only after the kernel
forgot some of its entries.
"""

from __future__ import annotations

import queue
import threading
from collections import Counter
from collections.abc import Callable

import numpy as np

from dlfs.index import Index

#: LOOKUPs of one folder's entries that make it worth listing: a program walking it by name, not a
#: stat or two.
MISSES = 4
#: Listings at once. Each waits on round trips through a daemon that is busy answering the walk
#: (~50 ms for a folder of 200 while 8 processes stat it), so one at a time fell behind the walkers.
THREADS = 4


class FolderLister:
    """Counts LOOKUPs per folder (on the loop thread) and lists folders from threads of its own: a
    listing goes through the mount, so the loop must stay free to answer it."""

    def __init__(self, index: Index, reveal: Callable[[int], None], misses: int = MISSES) -> None:
        self.index = index
        self.reveal = reveal
        self.misses = misses
        self.listed = 0
        self._count = threading.Lock()
        self._misses: Counter[int] = Counter()
        self._done: set[int] = set()
        self._queue: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

    def looked_up(self, parent: int) -> None:
        """A LOOKUP found an entry of ``parent``, which the kernel did not have."""
        if parent in self._done:
            return
        self._misses[parent] += 1
        if self._misses[parent] < self.misses:
            return
        del self._misses[parent]
        self._done.add(parent)
        self._queue.put(parent)
        if not self._threads:
            names = (f"dlfs-lister-{k}" for k in range(THREADS))
            self._threads = [threading.Thread(target=self._run, name=name, daemon=True) for name in names]
            for thread in self._threads:
                thread.start()

    def forgotten(self, rows: np.ndarray) -> None:
        """The kernel dropped these entries: their folders may be listed again."""
        if self._done and rows.size:
            self._done.difference_update(np.unique(self.index.parent[rows]).tolist())

    def _run(self) -> None:
        while True:
            row = self._queue.get()
            self.reveal(row)
            with self._count:
                self.listed += 1
