"""A tar's bytes where they lie, for the in-place pass (``in_place``): a local file read by
``pread``, or an object in S3 read by large ranged GETs, a few in flight.

The pass reads a tar forwards twice over at once: the header stream (``streams.Buffered``) and each
member's bytes, hashed where they lie while the stream seeks past them. A local file is asked for
``HINT_AHEAD`` ahead of the member being hashed. An object in S3 is fetched in blocks of ``BLOCK``,
``AHEAD`` of them in flight, and both readers take their bytes from the blocks: members are small,
and a GET each would cost a round trip each. Every GET asks for the version a HEAD found
(``If-Match``), so an object written again during the pass fails it rather than mixing versions.
"""

from __future__ import annotations

import functools
import mmap
import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol

from dlfs.core import libc
from dlfs.core.errors import PackError
from dlfs.core.store.s3.store import S3Store, StoredObject

if TYPE_CHECKING:
    from obstore import Bytes

#: Bytes of a local tar read and hashed at a time.
READ_CHUNK = 1 << 20
#: How far ahead of the member being hashed a local tar is asked for (``POSIX_FADV_WILLNEED``), and
#: in steps of how much. The kernel's own read-ahead sees the pass's reads (a header, then the data
#: from just inside it) step back and stops reading ahead: a cold tar was then read much slower
#: than ``cat`` reads it (docs/design.md).
HINT_AHEAD = 32 << 20
HINT_STEP = 8 << 20
#: An object's bytes per GET, and the GETs in flight ahead of the pass: large enough that a GET's
#: round trip is small against its transfer, few enough that the pass holds little.
BLOCK = 8 << 20
AHEAD = 4


class Positional(Protocol):
    """A tar read where its bytes lie."""

    #: The tar, for messages: a path or an ``s3://`` URL.
    name: str

    def pieces(self, offset: int, length: int) -> Iterator[memoryview]:
        """The ``length`` bytes at ``offset``, in pieces, each valid until the next is asked for;
        fewer bytes where the tar ends."""

    def identity(self) -> dict[str, Any]:
        """What an in-place index records of the tar as it is now (``archive_meta.ARCHIVE_KEYS`` or
        ``archive_meta.S3_ARCHIVE_KEYS``)."""

    def owner(self) -> tuple[int, int, int, int]:
        """(mode, uid, gid, mtime in ns) of the tar, for the folder it becomes."""

    def close(self) -> None:
        """Release what reading it holds (the header stream's file is the archive's to close)."""


class LocalTar:
    """A local tar's bytes by ``pread`` of the descriptor the header stream reads too; an ordinary
    pack of a plain tar file reads through it too (``archive_source.ArchiveSource.pack``).

    The C loop's buffers (``read_into``) are read directly (``O_DIRECT``) where the page cache does
    not hold their bytes: read through the page cache, a cold tar cost the kernel about a second of
    CPU for every 2 GB to insert its pages and copy them out (``dd bs=4M`` of a 2.2 GB tar: 1.2-2.2
    s of system time, against 0.17 s direct), and on two cores that CPU, not the disk, bounded the
    pass. A direct read lands in an aligned buffer and is copied from there, in user space."""

    def __init__(self, name: str, fd: int) -> None:
        self.name, self.fd = name, fd
        self.buffer = memoryview(bytearray(READ_CHUNK))
        self.hinted = 0
        #: Where a direct read lands (page-aligned, as ``O_DIRECT`` wants its memory).
        self._landing: mmap.mmap | None = None

    @functools.cached_property
    def direct(self) -> int | None:
        """The same file opened ``O_DIRECT`` at the first read that wants it, or None where its
        filesystem reads none that way: a tar only ever read through ``pieces`` opens nothing."""
        return _direct_descriptor(self.fd)

    def pieces(self, offset: int, length: int) -> Iterator[memoryview]:
        self._hint(offset, offset + length)
        while length:
            view = self.buffer[: min(length, len(self.buffer))]
            got = os.preadv(self.fd, [view], offset)
            if got == 0:
                return
            yield view[:got]
            offset += got
            length -= got

    def read_into(self, view: memoryview, offset: int) -> int:
        """Bytes at ``offset`` into ``view``; how many (fewer only where the tar ends). What the
        C loop over plain members reads through (``tarscan``), from a thread of its own: one read
        at a time, never two at once. Directly where the page cache misses any of them (the class
        docstring says why); through it where it holds them all, or cannot tell (no cachestat)."""
        if libc.in_memory(self.fd, offset, len(view)) is False and self.direct is not None:
            return self._read_direct(view, offset)
        self._hint(offset, offset + len(view))
        return os.preadv(self.fd, [view], offset)

    def _read_direct(self, view: memoryview, offset: int) -> int:
        """``read_into`` by one ``O_DIRECT`` read of the aligned range around the bytes."""
        assert self.direct is not None
        align = libc.DIRECT_ALIGN
        start = offset - offset % align
        pad = offset - start
        length = -(-(pad + len(view)) // align) * align
        if self._landing is None or len(self._landing) < length:
            if self._landing is not None:
                self._landing.close()
            self._landing = mmap.mmap(-1, length)
        landing = memoryview(self._landing)
        try:
            got = os.preadv(self.direct, [landing[:length]], start)  # short only at the end of the tar
            taken = max(0, min(len(view), got - pad))
            view[:taken] = landing[pad : pad + taken]
        finally:
            landing.release()
        return taken

    def close(self) -> None:
        """Close the direct descriptor, if one was opened (the other one is the header stream's)."""
        direct = self.__dict__.pop("direct", None)
        if direct is not None:
            os.close(direct)
        if self._landing is not None:
            self._landing.close()
            self._landing = None

    def _hint(self, offset: int, end: int) -> None:
        """Ask for the tar from ``offset`` up to ``HINT_AHEAD`` past ``end``, in steps of
        ``HINT_STEP``."""
        if end + HINT_AHEAD - HINT_STEP > self.hinted:
            start = max(self.hinted, offset)
            self.hinted = end + HINT_AHEAD
            os.posix_fadvise(self.fd, start, self.hinted - start, os.POSIX_FADV_WILLNEED)

    def identity(self) -> dict[str, Any]:
        st = os.fstat(self.fd)
        return {"path": os.path.abspath(self.name), "size": st.st_size, "mtime_ns": st.st_mtime_ns}

    def owner(self) -> tuple[int, int, int, int]:
        st = os.fstat(self.fd)
        return st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns


def _direct_descriptor(fd: int) -> int | None:
    """The file of ``fd`` opened again with ``O_DIRECT``; None where its filesystem has no direct
    reads (EINVAL) or the reopening is not allowed."""
    try:
        return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC)
    except OSError:
        return None


class S3Tar:
    """An object in S3 read in blocks of ``BLOCK``, ``AHEAD`` GETs in flight ahead of the furthest
    block asked for; it is also the header stream's file (``read``, ``skip``)."""

    def __init__(self, store: S3Store, key: str) -> None:
        """``store``: the bucket's; ``key``: the object's whole key. The GETs ask for the version
        a HEAD finds now."""
        self.store = store
        self.name = f"{store.url}/{key}"
        found = store.head(key)
        if found is None:
            raise PackError(f"{self.name} does not exist")
        self.found: StoredObject = found
        self.size = found.size
        #: The header stream's place (``read``, ``skip``).
        self.position = 0
        self._blocks: dict[int, Future[Bytes]] = {}
        self._furthest = 0
        self._pool = ThreadPoolExecutor(AHEAD, thread_name_prefix="dlfs-pack-get")

    def _block(self, number: int) -> memoryview:
        """Block ``number``, its GET and the next ``AHEAD`` ones started; blocks more than one
        behind the furthest asked for are let go (both readers move forwards)."""
        count = -(-self.size // BLOCK)
        for ahead in range(number, min(number + AHEAD, count)):
            if ahead not in self._blocks:
                self._blocks[ahead] = self._pool.submit(self._get, ahead)
        if number > self._furthest:
            self._furthest = number
            for old in [old for old in self._blocks if old < number - 1]:
                del self._blocks[old]
        return memoryview(self._blocks[number].result())

    def _get(self, number: int) -> Bytes:
        start = number * BLOCK
        return self.store.get_object(self.found.key, start, min(BLOCK, self.size - start), self.found.etag)

    def pieces(self, offset: int, length: int) -> Iterator[memoryview]:
        end = min(offset + length, self.size)
        while offset < end:
            number, within = divmod(offset, BLOCK)
            piece = self._block(number)[within : within + end - offset]
            yield piece
            offset += len(piece)

    def read(self, count: int = -1) -> bytes:
        """The header stream's next ``count`` bytes (all that are left: -1)."""
        if count < 0:
            count = self.size
        out = b"".join(self.pieces(self.position, count))
        self.position += len(out)
        return out

    def skip(self, count: int) -> None:
        """Pass over ``count`` bytes of the header stream, unread."""
        self.position += count

    def identity(self) -> dict[str, Any]:
        now = self.store.head(self.found.key)
        size, etag = (-1, "") if now is None else (now.size, now.etag)
        return {"url": self.name, "size": size, "etag": etag}

    def owner(self) -> tuple[int, int, int, int]:
        return 0o100644, os.geteuid(), os.getegid(), self.found.mtime_ns

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._blocks.clear()
