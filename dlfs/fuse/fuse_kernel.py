"""The kernel as the read-ahead sees it (``dlfs.readahead.kernel.Kernel``), over a live FUSE mount.

Pushes go out with ``notify_store``; whether the kernel caches a file is asked through the
mountpoint (``MountPageCache``); the kernel learns inodes from folder listings made through the
mount too, one at a time per folder however many want it (``FolderLister.reveal_once``).
"""

from __future__ import annotations

import contextlib
import logging
import threading

import numpy as np
import pyfuse3

from dlfs.core.index import Index
from dlfs.fuse.features import readahead_loop_missing
from dlfs.fuse.known import KernelKnowledge
from dlfs.fuse.lister import FolderLister
from dlfs.fuse.pagecache import MountPageCache
from dlfs.readahead.native import NativePusher

log = logging.getLogger(__name__)

#: Listings of a folder before the read-ahead gives up teaching the kernel its files (see
#: ``MountListing.list_folder``).
REVEAL_TRIES = 3


class MountListing:
    """Lists folders through the mount so that the kernel learns every file in them."""

    def __init__(self, index: Index, known: KernelKnowledge, pages: MountPageCache) -> None:
        self.index = index
        self.known = known
        self.pages = pages

    def list_folder(self, row: int) -> None:
        """List a folder through the mount so that the kernel learns every file in it (a push needs
        the inode). With ``--readdirplus auto`` the kernel may hold the folder's listing from a scan
        that gave files no attributes, and would answer from it: that listing is dropped first. A
        scan's listing still on its way back can fill the kernel's cache again after the drop (the
        background listing after a scan starts as the scan's last listing begins), so the listing
        is repeated until one with attributes reached the daemon. Each try marks the folder again:
        a FORGET for its entries (``drop_caches`` sends them in batches) returns it to plain
        listings."""
        for _ in range(REVEAL_TRIES):
            self.known.want_attributes(row)
            attribute_listings = self.known.attribute_listings[row]
            with contextlib.suppress(OSError):  # ENOENT: the kernel holds nothing of the folder
                pyfuse3.invalidate_inode(pyfuse3.InodeT(row + pyfuse3.ROOT_INODE))
            self.pages.reveal(self.index.path(row))
            if self.known.attribute_listings[row] > attribute_listings:
                return
        log.warning("the kernel kept answering listings of %s from its cache", self.index.path(row))


class FuseKernel:
    """The read-ahead's ``Kernel`` for this mount."""

    def __init__(
        self, index: Index, known: KernelKnowledge, pages: MountPageCache, lister: FolderLister
    ) -> None:
        self.index = index
        self.known = known
        self.pages = pages
        self.lister = lister
        self._revealing = threading.Lock()  # batches fetched side by side share folders: list each once

    def push(self, row: int, data: bytes | memoryview) -> None:
        """Store a whole file in the kernel page cache (inode = its inode row + 1)."""
        if data:
            inode = self.index.hard_links.inode_row(row) + pyfuse3.ROOT_INODE
            pyfuse3.notify_store(pyfuse3.InodeT(inode), 0, data)

    def holds(self, row: int) -> bool:
        return self.pages.holds(self.index.path(row), int(self.index.size[row]))

    def reveal(self, rows: np.ndarray) -> int:
        """List the folders of those ``rows`` the kernel may not know. A listing teaches the kernel
        every entry in a few requests instead of a LOOKUP per file."""
        revealed = 0
        with self._revealing:
            for folder in self.known.folders_to_list(rows).tolist():
                revealed += self.lister.reveal_once(folder)
                self.known.folder_listed(folder)
        return revealed

    def pusher(self) -> NativePusher | None:
        """The C loop on this mount's connection, or None where it cannot run: the one question
        (``readahead_loop_missing``) whose answer the mount also prints on the terminal."""
        if readahead_loop_missing() is not None:
            return None
        return NativePusher(pyfuse3.dev_fuse_fd(), pyfuse3.ROOT_INODE, self.index.hard_links.inode_rows)
