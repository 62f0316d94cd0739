"""What the read-ahead needs of the kernel it pushes into, and nothing more.

The engine never talks to FUSE itself: the mount passes it an object with these methods
(``dlfs.fuse.fuse_kernel.FuseKernel``), and tests pass a fake. All but ``pusher`` are called from
fetching threads.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from dlfs.readahead.native import NativePusher


class Kernel(Protocol):
    def push(self, row: int, data: bytes | memoryview) -> None:
        """Store a whole file in the kernel page cache. Raises OSError; ENOENT: the kernel does not
        know the file's inode (never looked up, or forgotten), so the file waits for its READ."""

    def holds(self, row: int) -> bool:
        """Does the kernel cache every page of this row's file already?"""

    def reveal(self, rows: np.ndarray) -> int:
        """Make the kernel learn these files' inodes, which a push needs, by listing the directories
        of those it may not know; returns how many directories this call listed."""

    def pusher(self) -> NativePusher | None:
        """The C loop, bound to the live session (event loop, once the mount serves); None where
        it cannot be (a stock FUSE binding, the library not built)."""
