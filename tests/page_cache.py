"""Where a test's bytes live: out of the page cache (``drop_from_memory``), or on a tmpfs, whose
pages never leave memory and which refuses reads that must not wait."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from waits import Asked, wait_for

from dlfs.core.libc import cached_pages


def drop_from_memory(path: Path) -> None:
    """Evict a file's pages from the page cache, as if it had never been read (no root needed).

    Asked again until ``cachestat`` sees none left: a single pass right after a heavy benchmark
    left pages behind (two cold-storage tests then found their shards in memory); a page under
    writeback goes only once written, which the ``fsync`` waits for.
    """
    fd = os.open(path, os.O_RDONLY)

    def evicted() -> bool:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return cached_pages(fd, os.fstat(fd).st_size) in (0, None)

    try:
        wait_for(evicted, f"the pages of {path} to leave the page cache", Asked(), seconds=5)
    finally:
        os.close(fd)


@contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A fresh tmpfs of ``size`` at ``path`` (made here; needs root), unmounted on the way out."""
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "dlfs-test", path], check=True, timeout=30)
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", path], check=True, timeout=30)
