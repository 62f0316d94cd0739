"""A dataset in a directory of a local or network filesystem: shards and the index as plain files.

Everything that is particular to files lives here: descriptors kept open, ``pread``/``preadv``,
reads that must not wait (``_read_in_memory``), ``posix_fadvise`` hints, ``O_DIRECT`` descriptors
for the read-ahead's C loop, and writes gathered into ``writev`` with early write-back.
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path
from typing import BinaryIO

from dlfs.core import libc
from dlfs.core.errors import DatasetError, StoreError, writing
from dlfs.core.sealed import sealed_copy
from dlfs.core.sniff import instead_of_a_dataset
from dlfs.core.store.interface import InPlaceWriter, ShardWriter

WRITE_BUFFER = 4 << 20
#: Payloads per writev (IOV_MAX is 1024).
WRITE_GATHER = 512
#: Written bytes handed to the disk at a time, so that the fsync at the end finds little left.
WRITEBACK_STEP = 32 << 20


def _read_in_memory(fd: int, buffer: memoryview, offset: int) -> int | None:
    """Fill ``buffer`` from ``offset`` of ``fd`` only if the bytes are in the page cache; None if
    some are not, or the file ends before the buffer does. The question comes first, as a refused
    ``RWF_NOWAIT`` read starts reading what it misses. A filesystem that cannot promise a read will
    not wait refuses ``RWF_NOWAIT`` (EOPNOTSUPP: tmpfs, squashfs, overlayfs, FUSE): there the answer
    to the question decides alone, as in ``_pagecache.h``'s ``read_all``."""
    held = libc.in_memory(fd, offset, len(buffer))
    if held is False:
        return None
    try:
        got = os.preadv(fd, [buffer], offset, os.RWF_NOWAIT)
    except BlockingIOError:
        return None
    except OSError as exc:
        if exc.errno != errno.EOPNOTSUPP:
            raise
        if held is None:  # no cachestat to ask either
            return None
        got = os.preadv(fd, [buffer], offset)
    return got if got == len(buffer) else None  # short: only a part is in memory


class _NewFile:
    """A shard file being written: ``durable``, ``commit`` returns once the bytes are on the
    disk; otherwise once the kernel has them, like tar or cp."""

    def __init__(self, path: Path, durable: bool) -> None:
        self._path = path
        self._durable = durable
        with writing(path):
            self._file: BinaryIO = open(path, "wb", buffering=0)
        #: Bytes handed to the kernel, and how many of them the disk was asked to write.
        self._written = 0
        self._started = 0

    def _write_all(self, buffers: list[bytes | memoryview], offset: int | None) -> None:
        """Every buffer, in order, at ``offset`` or (None) at the file's position, going on after
        short writes."""
        left = sum(map(len, buffers))
        with writing(self._path):
            while left:
                if offset is None:
                    done = os.writev(self._file.fileno(), buffers)
                else:
                    done = os.pwritev(self._file.fileno(), buffers, offset)
                    offset += done
                left -= done
                while buffers and done >= len(buffers[0]):
                    done -= len(buffers.pop(0))
                if done:
                    buffers[0] = memoryview(buffers[0])[done:]

    def _start_writeback(self) -> None:
        """Start writing what the packer wrote so far, without waiting for it.

        Left to the kernel, a shard's gigabyte stays dirty until ``commit``'s fsync, and packing
        then stops for as long as the disk needs to write it all; started early, the writing
        overlaps with reading the next files.
        """
        libc.start_writeback(self._file.fileno(), self._started, self._written - self._started)
        self._started = self._written

    def _commit(self, size: int | None) -> None:
        with writing(self._path):
            if size is not None:
                os.ftruncate(self._file.fileno(), size)
            if self._durable:
                os.fsync(self._file.fileno())
            self._file.close()

    def abort(self) -> None:
        self._file.close()
        self._path.unlink(missing_ok=True)


class _AppendedFile(_NewFile):
    """A shard file written in order (``ShardWriter``)."""

    def __init__(self, path: Path, durable: bool) -> None:
        super().__init__(path, durable)
        self._pending: list[bytes | memoryview] = []
        self._held = 0

    def write(self, data: bytes | memoryview) -> None:
        """Gather payloads and hand them to the kernel ``WRITE_BUFFER`` bytes at a time, in one
        ``writev``: a buffered file copied every payload once more into its buffer, and each flush
        is a syscall during which the writing thread may lose the GIL to the reader threads."""
        self._pending.append(data)
        self._held += len(data)
        if self._held >= WRITE_BUFFER or len(self._pending) >= WRITE_GATHER:
            self._flush()
        if self._durable and self._written - self._started >= WRITEBACK_STEP:
            self._start_writeback()

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        self._write_all(pending, None)
        self._written += self._held
        self._held = 0

    def commit(self) -> None:
        self._flush()
        self._commit(None)


class _PlacedFile(_NewFile):
    """A shard file written at any offset, from any thread (``InPlaceWriter``)."""

    def write_at(self, offset: int, *data: bytes | memoryview) -> None:
        self._write_all(list(data), offset)

    def written_through(self, end: int) -> None:
        if self._durable and end - self._started >= WRITEBACK_STEP:
            self._written = end
            self._start_writeback()

    def commit(self, size: int) -> None:
        self._commit(size)


class LocalStore:
    """A directory on a local or network filesystem, read with ``pread`` on cached descriptors.

    ``durable=False``: writes return without waiting for the disk (``dlfs pack --no-sync``).
    """

    #: ``will_read`` asks the kernel to read ahead into the page cache.
    hints_in_memory = False

    def __init__(
        self, root: str | os.PathLike[str], random_access: bool = False, durable: bool = True
    ) -> None:
        self.root = Path(root)
        self.url = str(self.root)
        self.random_access = random_access
        self.durable = durable
        self._fds: dict[str, int] = {}
        self._direct_fds: dict[str, int] = {}
        self._lock = threading.Lock()

    def _fd(self, name: str, direct: bool = False) -> int:
        """The object's cached descriptor; ``direct``: opened with O_DIRECT (OSError where the
        filesystem has no direct I/O)."""
        fds = self._direct_fds if direct else self._fds
        fd = fds.get(name)
        if fd is None:
            with self._lock:
                fd = fds.get(name)
                if fd is None:
                    flags = os.O_RDONLY | os.O_CLOEXEC | (os.O_DIRECT if direct else 0)
                    fd = self._open(name, flags)
                    if self.random_access:
                        # Every read asks for exactly the bytes it needs (a file, or a run of
                        # neighbours); kernel read-ahead past them read 2.3x the dataset from a cold
                        # disk in a shuffled epoch, and competed with the reads that mattered.
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
                    fds[name] = fd
        return fd

    def _open(self, name: str, flags: int) -> int:
        try:
            return os.open(self.root / name, flags)
        except FileNotFoundError as exc:
            raise DatasetError(f"{name} is missing from {self.root}") from exc

    def read(self, name: str, offset: int, length: int) -> bytes:
        try:
            return os.pread(self._fd(name), length, offset)
        except OSError as exc:
            raise self._read_error(name, offset, exc) from exc

    read_buffer = read  # a read makes its own bytes: there is no buffer to lend

    def read_into(self, name: str, offset: int, buffer: memoryview, wait: bool = True) -> int | None:
        try:
            fd = self._fd(name)
            return os.preadv(fd, [buffer], offset) if wait else _read_in_memory(fd, buffer, offset)
        except OSError as exc:
            raise self._read_error(name, offset, exc) from exc

    def will_read(self, name: str, offset: int, length: int) -> None:
        try:
            os.posix_fadvise(self._fd(name), offset, length, os.POSIX_FADV_WILLNEED)
        except OSError as exc:
            raise self._read_error(name, offset, exc) from exc

    def descriptor(self, name: str, direct: bool = False) -> int | None:
        try:
            return self._fd(name, direct)
        except OSError:
            if not direct:
                raise
            return None  # say, a filesystem without direct I/O

    def _read_error(self, name: str, offset: int, exc: OSError) -> StoreError:
        return StoreError(f"reading {self.root / name} at {offset}: {exc.strerror}")

    def size(self, name: str) -> int | None:
        try:
            return (self.root / name).stat().st_size
        except FileNotFoundError:
            return None

    def sizes(self) -> dict[str, int]:
        try:
            with os.scandir(self.root) as entries:
                return {entry.name: entry.stat().st_size for entry in entries if entry.is_file()}
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise self._not_a_dataset() from exc

    def _not_a_dataset(self) -> DatasetError:
        """Why the root holds no dataset when it is not a directory: missing, or a file (an
        archive, perhaps, with the command that makes a dataset of it)."""
        if not os.path.lexists(self.root):
            return DatasetError(f"{self.root} does not exist")
        return DatasetError(instead_of_a_dataset(str(self.root)))

    def names(self) -> list[str]:
        return sorted(self.sizes())

    def map_index(self, name: str) -> memoryview:
        """A sealed in-memory copy (``dlfs.core.sealed``): what is served cannot change after the
        checks, whatever happens to the file."""
        path = self.root / name
        try:
            with open(path, "rb") as f:
                return sealed_copy(f.fileno(), name)
        except FileNotFoundError as exc:
            if not self.root.is_dir():
                raise self._not_a_dataset() from exc
            raise DatasetError(f"{self.root} is not a dlfs dataset (no {name}); run dlfs pack first") from exc
        except NotADirectoryError as exc:
            raise self._not_a_dataset() from exc
        except IsADirectoryError as exc:
            raise DatasetError(f"{path} is a directory, not a dlfs index") from exc

    def put_file(self, name: str, path: Path) -> None:
        """Renamed into place: ``path`` is in this directory's filesystem (pack writes its index
        beside the shards)."""
        with writing(path):
            if self.durable:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            os.replace(path, self.root / name)
        if not self.durable:
            return
        dir_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def create(self, name: str) -> ShardWriter:
        return _AppendedFile(self.root / name, self.durable)

    def create_in_place(self, name: str) -> InPlaceWriter:
        return _PlacedFile(self.root / name, self.durable)

    def delete(self, name: str) -> None:
        try:
            (self.root / name).unlink(missing_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot delete {self.root / name}: {exc.strerror}") from exc

    def abort_uploads(self) -> None:
        """Nothing: an interrupted pack's files are listed, and removed as leftovers."""

    def unfinished_uploads(self) -> list[str]:
        return []

    def stats(self) -> dict[str, dict[str, int]]:
        return {}

    def close(self) -> None:
        with self._lock:
            for fd in [*self._fds.values(), *self._direct_fds.values()]:
                os.close(fd)
            self._fds.clear()
            self._direct_fds.clear()
