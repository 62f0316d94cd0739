"""An archive's bytes as one sequential stream: the source file or standard input, its kind told
by its first bytes (never its name), compressed kinds decompressed on the fly.

Every failure to read or decompress the source becomes a ``PackError`` that names the source and
the kind (``reading``): a corrupt gzip stream or a cut download says so in one line.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import queue
import sys
import tarfile
import threading
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO

try:  # the zstd extra: only a .tar.zst needs it (the standard library reads zstd from Python 3.14)
    import zstandard
except ImportError:
    zstandard = None  # type: ignore[assignment]
try:  # the gzip extra: ISA-L's inflate, the standard library's gzip semantics at less CPU a byte
    from isal import igzip, isal_zlib
except ImportError:
    igzip = isal_zlib = None  # type: ignore[assignment]

from dlfs.core.errors import PackError
from dlfs.core.sniff import SNIFF, sniff
from dlfs.pack.interruption import block_in_thread

#: Bytes read from a stream at a time (more where a member's data asks for more).
CHUNK = 1 << 20
#: Most bytes ``Buffered`` asks its stream for at once: a count from a damaged header (a pax record's
#: claimed 2^62 bytes) is read piece by piece to the stream's end, never allocated up front.
READ_MAX = 64 << 20
#: What ``Buffered`` reads ahead of a header where it can skip what follows (``Buffered.skips``).
SKIPPING_AHEAD = 16 << 10
#: Chunks prefetched ahead of the pack (``Prefetch``).
AHEAD = 16
#: What a decompressor or an archive reader raises on bytes that are not what they claim. An
#: ``OSError`` without an errno is one too (``gzip.BadGzipFile``, bz2's "Invalid data stream");
#: with one, it is the disk's. Anything else is a bug, not damage (``reading``).
DAMAGE = (
    EOFError,
    zlib.error,
    lzma.LZMAError,
    tarfile.TarError,
    zipfile.BadZipFile,
    *((zstandard.ZstdError,) if zstandard is not None else ()),
    *((isal_zlib.error,) if isal_zlib is not None else ()),
)


class Buffered:
    """A forward-only stream read in chunks of CHUNK: what the tar reader parses. Headers and small
    members are slices of one buffer, a large read goes to the stream whole, so a member costs a few
    calls whatever its size (``tarfile``'s own stream reads 10 KiB at a time and copies its buffer
    on every read). ``position`` is the offset of the next byte in the stream."""

    def __init__(self, inner: BinaryIO, prefix: bytes = b"") -> None:
        self.inner = inner
        self.buffer = prefix
        self.at = 0
        self.position = 0
        seekable = getattr(inner, "seekable", None)
        #: The stream can pass over bytes without reading them (``skip``): a tar read from its file
        #: (not through ``Prefetch``), or a member of one (``Bounded``).
        self.skips = hasattr(inner, "skip") or (seekable is not None and seekable())
        #: Bytes read beyond what is asked for: CHUNK, or where the stream skips SKIPPING_AHEAD, so
        #: that reading a header does not copy the member data after it, which may be skipped.
        self.ahead = SKIPPING_AHEAD if self.skips else CHUNK

    def tell(self) -> int:
        return self.position

    def read(self, count: int = -1) -> bytes:
        """``count`` bytes (all that are left: -1), fewer only at the end of the stream."""
        if count < 0:
            count = 1 << 62
        held = len(self.buffer) - self.at
        if held >= count:
            out = self.buffer[self.at : self.at + count]
            self.at += count
            self.position += count
            return out
        parts = [self.buffer[self.at :]] if held else []
        need = count - held
        self.buffer, self.at = b"", 0
        while need > 0:
            chunk = self.inner.read(min(max(need, self.ahead), READ_MAX))
            if not chunk:
                break
            if len(chunk) > need:
                parts.append(chunk[:need])
                self.buffer, self.at = chunk, need
                need = 0
            else:
                parts.append(chunk)
                need -= len(chunk)
        out = parts[0] if len(parts) == 1 else b"".join(parts)
        self.position += len(out)
        return out

    def skip_to(self, offset: int) -> None:
        """Go on to ``offset`` (or the end of the stream)."""
        if offset > self.position:
            self.skip(offset - self.position)

    def skip(self, count: int) -> None:
        """Pass over ``count`` bytes: without reading them where the stream can seek (a tar read
        from its file, or a member of one: ``Bounded``), else by reading them. A seek past the end
        is noticed by the next read, which finds nothing."""
        held = len(self.buffer) - self.at
        if count <= held:
            self.at += count
            self.position += count
            return
        if not self.skips:
            while count > 0 and (got := len(self.read(min(count, CHUNK)))):
                count -= got
            return
        self.buffer, self.at = b"", 0
        if hasattr(self.inner, "skip"):
            self.inner.skip(count - held)
        else:
            self.inner.seek(count - held, os.SEEK_CUR)
        self.position += count


class Prefetch:
    """A stream read by a thread of its own, up to AHEAD chunks of CHUNK ahead of the reader: the
    disk (and a decompressor, which releases the GIL) work while the pack parses and writes. What
    the thread meets (the end, an error) reaches the reader in order."""

    def __init__(self, inner: BinaryIO) -> None:
        self.inner = inner
        self.chunks: queue.Queue[bytes | BaseException] = queue.Queue(AHEAD)
        self.current = b""
        self.at = 0
        self.done = False
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="dlfs-pack-read", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        block_in_thread()  # Ctrl-C goes to the main thread, which then stops this one
        try:
            while not self.stopping.is_set():
                chunk = self.inner.read(CHUNK)
                self._put(chunk)
                if not chunk:
                    return
        except BaseException as exc:  # handed to the reader, which raises it
            self._put(exc)

    def _put(self, item: bytes | BaseException) -> None:
        while not self.stopping.is_set():
            try:
                self.chunks.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def read(self, count: int) -> bytes:
        """Up to ``count`` bytes: what is left of the current chunk, or the next one."""
        if self.at >= len(self.current):
            if self.done:
                return b""
            item = self.chunks.get()
            if isinstance(item, BaseException):
                self.done = True
                raise item
            self.current, self.at = item, 0
            if not item:
                self.done = True
                return b""
        out = (
            self.current[self.at : self.at + count] if self.at or count < len(self.current) else self.current
        )
        self.at += len(out)
        return out

    def close(self) -> None:
        """Stop the thread (it ends after the read it is in: a read from a pipe may wait)."""
        self.stopping.set()
        self.thread.join(timeout=1)


class Bounded:
    """The next ``size`` bytes of a ``Buffered``, as a file to read: one member's data."""

    def __init__(self, source: Buffered, size: int) -> None:
        self.source = source
        self.left = size

    def read(self, count: int = -1) -> bytes:
        count = self.left if count < 0 else min(count, self.left)
        out = self.source.read(count)
        self.left -= len(out)
        return out

    def skip(self, count: int) -> None:
        """Pass over ``count`` of the member's bytes (``Buffered.skip``)."""
        count = min(count, self.left)
        self.source.skip(count)
        self.left -= count


def checked_read(data: BinaryIO, size: int, member: str, name: str) -> bytes:
    """All of a member's bytes, which must be as many as its header says."""
    out = data.read(size + 1)
    if len(out) != size:
        raise PackError(
            f"{name}: member {member} holds {len(out):,} bytes where the archive says {size:,}; "
            "it is damaged or cut short (download it again)"
        )
    return out


def _read_exactly(stream: BinaryIO, count: int) -> bytes:
    chunks = []
    while count > 0:
        chunk = stream.read(count)
        if not chunk:
            break
        chunks.append(chunk)
        count -= len(chunk)
    return b"".join(chunks)


def _decompressed(kind: str, raw: BinaryIO) -> BinaryIO:
    if kind == "gzip":
        return (igzip or gzip).GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if kind == "bzip2":
        return bz2.BZ2File(raw)  # type: ignore[return-value]
    if kind == "xz":
        return lzma.LZMAFile(raw)  # type: ignore[return-value]
    if kind == "zstd":
        if zstandard is None:
            raise PackError(
                "the source is a zstd-compressed tar, which needs zstandard: "
                "pip install 'dlfs-data[zstd]' (make install installs it)"
            )
        return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)  # type: ignore[return-value]
    return raw


@contextmanager
def reading(source: str, kind: str) -> Iterator[None]:
    """Turn a failure to read or decode the source into one line that says what to do: damage
    (``DAMAGE``: fetch the archive again), or the disk's own error. Anything else passes on: a
    bug, whose message must not blame the archive."""
    try:
        yield
    except OSError as exc:
        if exc.errno is not None:
            raise PackError(f"cannot read {source}: {exc.strerror}; check the disk or the file") from None
        raise _damaged(source, kind, exc) from None
    except DAMAGE as exc:
        raise _damaged(source, kind, exc) from None


def _damaged(source: str, kind: str, exc: BaseException) -> PackError:
    return PackError(
        f"cannot read {source} as {kind}: {exc or type(exc).__name__}; the archive is damaged or cut short "
        "(download it again)"
    )


class ArchiveStream:
    """The source's kind (``tar``, ``tar.gz``, ..., or ``zip``) and, for a tar, its uncompressed
    bytes as a ``Buffered``; a zip is read from its file (its directory is at its end)."""

    def __init__(self, source: str, prefetch: bool = True, opened: BinaryIO | None = None) -> None:
        """``prefetch``: read the tar in a thread of its own (``Prefetch``); without, a plain
        tar's stream is its file, which ``Buffered.skip`` seeks past bytes the pass does not read
        (the in-place pass reads them itself, where they lie). ``opened``: the source already open
        as a stream that reads and skips (an object in S3: ``positional.S3Tar``)."""
        self.source = source
        self.file: BinaryIO | None = None
        self.ahead: Prefetch | None = None
        self.opened = opened
        if opened is not None:
            raw = opened
            self.name = source
        elif source == "-":
            # Unbuffered: a read returns what the pipe holds, not once a whole chunk has come.
            raw: BinaryIO = sys.stdin.buffer.raw  # type: ignore[attr-defined]
            self.name = "standard input"
        else:
            try:
                raw = self.file = open(source, "rb", buffering=0)  # closed by close()
            except OSError as exc:
                raise PackError(f"cannot open {source}: {exc.strerror}") from None
            self.name = source
        try:
            head = _read_exactly(raw, SNIFF)
            compression = sniff(head)
            if compression == "zip":
                if self.file is None and opened is None:
                    raise PackError(
                        "a zip cannot be read from standard input (its directory is at its end); "
                        "save it to a file and pack that"
                    )
                self.kind = "zip"
                return
            if not compression and self.file is not None and zipfile.is_zipfile(self.file):
                self.kind = "zip"  # found by its directory at the end: data before it (a self-extractor)
                return
            if not compression:
                raise PackError(
                    f"{self.name} is neither a directory nor an archive dlfs reads "
                    "(tar, tar.gz, tar.zst, tar.xz, tar.bz2, zip)"
                )
            self.kind = "tar" if compression == "tar" else f"tar.{_SUFFIX[compression]}"
            if compression == "tar":
                if not prefetch:
                    self.stream = Buffered(raw, head)
                    return
                self.ahead = Prefetch(raw)
                self.stream = Buffered(self.ahead, head)  # type: ignore[arg-type]
                return
            inner = _decompressed(compression, _Prefixed(head, raw))
            with reading(self.name, self.kind):
                first = _read_exactly(inner, SNIFF)
            if sniff(first) != "tar":
                raise PackError(f"{self.name} is {compression}-compressed but holds no tar; unpack it first")
            self.ahead = Prefetch(inner)
            self.stream = Buffered(self.ahead, first)  # type: ignore[arg-type]
        except BaseException:
            self.close()
            raise

    def drain(self) -> None:
        """Read a tar's stream to its end: a compressed stream's checksum comes last, after the
        padding that follows tar's end-of-archive marker."""
        if self.kind != "zip":
            while self.stream.read(CHUNK):
                pass

    def close(self) -> None:
        if self.ahead is not None:
            self.ahead.close()
        if self.file is not None:
            self.file.close()
        if self.opened is not None:
            self.opened.close()


_SUFFIX = {"gzip": "gz", "bzip2": "bz2", "xz": "xz", "zstd": "zst"}


class _Prefixed(io.RawIOBase):
    """The bytes sniffed, then the rest of the stream: what a decompressor reads."""

    def __init__(self, prefix: bytes, inner: BinaryIO) -> None:
        self.prefix = prefix
        self.inner = inner

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")
        if self.prefix:
            got = min(len(self.prefix), len(view))
            view[:got], self.prefix = self.prefix[:got], self.prefix[got:]
            return got
        data = self.inner.read(len(view))
        view[: len(data)] = data
        return len(data)
