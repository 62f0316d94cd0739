"""What the kernel knows of the mount's entries, as far as the daemon can tell.

The kernel keeps entries and inodes it learnt (LOOKUP, READDIRPLUS) until it forgets them (FORGET),
and only a known inode can take pushed pages. The FUSE adapter feeds this record from those
requests; the read-ahead's kernel (``dlfs.fuse.fuse_kernel``) reads it to list only the folders the
kernel may not know, and steers their listings to carry every file's attributes.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from dlfs.core.index import Index


class KernelKnowledge:
    """``listed``: rows a listing with attributes taught the kernel (a training job's ImageFolder
    scan, or the read-ahead's own), so they need not be listed again before a push.
    ``attribute_listings``: listings that began with attributes for every entry, per folder.
    Folders marked with ``want_attributes`` get such listings in any ``--readdirplus`` mode.

    ``listed`` is written from the event loop and read from fetching threads; a stale answer costs
    one listing too many or one refused push, never wrong data.
    """

    def __init__(self, index: Index) -> None:
        self.index = index
        self._listed = np.zeros(index.count, dtype=bool)
        #: 1 for the folders ``want_attributes`` marked; a byte per row, so that the native request
        #: server's C threads read it too (they hand such listings to Python).
        self.wanted = np.zeros(index.count, dtype=np.uint8)
        self.attribute_listings: Counter[int] = Counter()

    def listed(self, rows: range) -> None:
        """A READDIRPLUS reply gave these entries their attributes: the kernel knows their inodes."""
        self._listed[rows.start : rows.stop] = True

    def listing_began(self, folder: int) -> None:
        """A listing of ``folder`` began with attributes for every entry."""
        self.attribute_listings[folder] += 1

    def want_attributes(self, folder: int) -> None:
        """Listings of this folder give every entry its attributes, in any mode, until the kernel
        forgets some of its entries: the read-ahead lists it so that the kernel learns the files it
        is about to push."""
        self.wanted[folder] = 1

    def wants_attributes(self, folder: int) -> bool:
        return bool(self.wanted[folder])

    def folders_to_list(self, rows: np.ndarray) -> np.ndarray:
        """The folders of those ``rows`` the kernel may not know: never listed, or forgotten since."""
        return np.unique(self.index.parent[rows[~self._listed[rows]]])

    def folder_listed(self, folder: int) -> None:
        """A listing of ``folder`` for the read-ahead is done: the kernel knows all its entries."""
        children = self.index.children(folder)
        self._listed[children.start : children.stop] = True

    def forgotten(self, rows: np.ndarray) -> list[int]:
        """The kernel dropped these entries. Their folders' listings go back to the mode's own, and
        must be done again before one of them is pushed; returns those folders."""
        self._listed[rows] = False
        if not rows.size:
            return []
        folders: list[int] = np.unique(self.index.parent[rows]).tolist()
        self.wanted[folders] = 0
        return folders
