"""Where a dataset's bytes live: the small interface every backend implements.

``pack`` writes through it and ``mount``/``verify`` read through it, so an object-store backend only
has to implement these methods. Everything here is blocking: callers on the trio loop go through
``trio.to_thread``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Protocol

from dlfs.errors import DatasetError, StoreError
from dlfs.pagecache import in_memory


class ShardWriter(Protocol):
    def write(self, data: bytes | memoryview) -> None:
        """Append (pack writes in order)."""

    def write_at(self, offset: int, *data: bytes | memoryview) -> None:
        """Write ``data`` back to back from ``offset``, from any thread (pack writes in place);
        only where the store's ``writes_in_place`` is true."""

    def written_through(self, end: int) -> None:
        """Every byte below ``end`` has been written in place (a hint to start storing them)."""

    def commit(self, size: int | None = None) -> None:
        """Make the written bytes readable under the final name (durable, unless the store
        was opened with ``durable=False``). ``size``: the object's length, where bytes written
        in place leave its end unwritten (a skipped file's slot)."""

    def abort(self) -> None:
        """Forget the partial object."""


class Store(Protocol):
    """A flat namespace of immutable objects (shards and the index) with ranged reads."""

    url: str
    #: Shard writers take ``write_at``: pack lays every file out up front and its readers write in
    #: parallel. Object stores, which take an object in order, will not.
    writes_in_place: bool

    def read(self, name: str, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes at ``offset`` (fewer only at the end of the object)."""

    def read_into(self, name: str, offset: int, buffer: memoryview, wait: bool = True) -> int | None:
        """Fill ``buffer`` with the bytes at ``offset``; returns how many (fewer only at the end of
        the object). ``wait=False``: None, at once, unless all of them are in memory already."""

    def will_read(self, name: str, offset: int, length: int) -> None:
        """A hint that this range is read soon. Storage serves all the hinted ranges at once, so a
        reader that hints a batch first waits for its slowest read, not for the sum of them."""

    def descriptor(self, name: str, direct: bool = False) -> int | None:
        """A descriptor to ``pread`` the object from, where the backend has one, for the
        read-ahead's C loop (``dlfs.push``); None: it reads through ``read_into`` instead.
        ``direct``: one that bypasses the page cache (O_DIRECT), or None where it cannot."""

    def size(self, name: str) -> int | None:
        """The object's size, or None when it does not exist."""

    def names(self) -> list[str]: ...

    def map_index(self, name: str) -> memoryview:
        """The whole object, memory-mapped where the backend can, for zero-copy numpy views."""

    def put_atomic(self, name: str, data: bytes) -> None:
        """Publish ``data`` under ``name`` so readers see the old object or the new, never a part."""

    def create(self, name: str) -> ShardWriter: ...

    def delete(self, name: str) -> None: ...

    def close(self) -> None: ...


@contextlib.contextmanager
def _writing(path: Path) -> Iterator[None]:
    """A failed write (a full disk, a read-only one) as one line for the user, not a traceback."""
    try:
        yield
    except OSError as exc:
        raise StoreError(
            f"cannot write {path}: {exc.strerror}; free space there or pack somewhere else"
        ) from exc


WRITE_BUFFER = 4 << 20
#: Payloads per writev (IOV_MAX is 1024).
WRITE_GATHER = 512
#: Written bytes handed to the disk at a time, so that the fsync at the end finds little left.
WRITEBACK_STEP = 32 << 20
_SYNC_FILE_RANGE_WRITE = 2
_libc = ctypes.CDLL(None, use_errno=True)
_libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]


class _LocalWriter:
    """``durable``: ``commit`` returns once the bytes are on the disk; otherwise once the kernel
    has them, like tar or cp."""

    def __init__(self, path: Path, durable: bool) -> None:
        self._path = path
        self._durable = durable
        with _writing(path):
            self._file: BinaryIO = open(path, "wb", buffering=0)
        self._pending: list[bytes | memoryview] = []
        self._held = 0
        self._written = 0
        self._started = 0

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

    def write_at(self, offset: int, *data: bytes | memoryview) -> None:
        self._write_all(list(data), offset)

    def _write_all(self, buffers: list[bytes | memoryview], offset: int | None) -> None:
        """Every buffer, in order, at ``offset`` or (None) at the file's position, going on after
        short writes."""
        left = sum(map(len, buffers))
        with _writing(self._path):
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

    def written_through(self, end: int) -> None:
        if self._durable and end - self._started >= WRITEBACK_STEP:
            self._written = end
            self._start_writeback()

    def _start_writeback(self) -> None:
        """Start writing what the packer wrote so far, without waiting for it.

        Left to the kernel, a shard's gigabyte stays dirty until ``commit``'s fsync, and packing
        then stops for as long as the disk needs to write it all; started early, the writing
        overlaps with reading the next files.
        """
        self._flush()
        _libc.sync_file_range(
            self._file.fileno(), self._started, self._written - self._started, _SYNC_FILE_RANGE_WRITE
        )
        self._started = self._written

    def commit(self, size: int | None = None) -> None:
        self._flush()
        with _writing(self._path):
            if size is not None:
                os.ftruncate(self._file.fileno(), size)
            if self._durable:
                os.fsync(self._file.fileno())
            self._file.close()

    def abort(self) -> None:
        self._file.close()
        self._path.unlink(missing_ok=True)


class LocalStore:
    """A directory on a local or network filesystem, read with ``pread`` on cached descriptors.

    ``durable=False``: writes return without waiting for the disk (``dlfs pack --no-sync``).
    """

    def __init__(
        self, root: str | os.PathLike[str], random_access: bool = False, durable: bool = True
    ) -> None:
        self.root = Path(root)
        self.url = str(self.root)
        self.random_access = random_access
        self.durable = durable
        self.writes_in_place = True
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
                    try:
                        fd = os.open(self.root / name, flags)
                    except FileNotFoundError as exc:
                        raise DatasetError(f"{name} is missing from {self.root}") from exc
                    if self.random_access:
                        # Every read asks for exactly the bytes it needs (a file, or a run of
                        # neighbours); kernel read-ahead past them read 2.3x the dataset from a cold
                        # disk in a shuffled epoch, and competed with the reads that mattered.
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
                    fds[name] = fd
        return fd

    def read(self, name: str, offset: int, length: int) -> bytes:
        try:
            return os.pread(self._fd(name), length, offset)
        except OSError as exc:
            raise self._read_error(name, offset, exc) from exc

    def read_into(self, name: str, offset: int, buffer: memoryview, wait: bool = True) -> int | None:
        try:
            fd = self._fd(name)
            if not wait and in_memory(fd, offset, len(buffer)) is False:
                return None  # RWF_NOWAIT alone would start reading the missing pages first
            got = os.preadv(fd, [buffer], offset, 0 if wait else os.RWF_NOWAIT)
        except BlockingIOError:
            return None
        except OSError as exc:
            raise self._read_error(name, offset, exc) from exc
        return None if not wait and got < len(buffer) else got  # short: only a part is in memory

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

    def names(self) -> list[str]:
        return sorted(entry.name for entry in os.scandir(self.root) if entry.is_file())

    def map_index(self, name: str) -> memoryview:
        import mmap

        path = self.root / name
        try:
            with open(path, "rb") as f:
                if os.fstat(f.fileno()).st_size == 0:
                    return memoryview(b"")
                return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
        except FileNotFoundError as exc:
            raise DatasetError(f"{self.root} is not a dlfs dataset (no {name}); run dlfs pack first") from exc
        except IsADirectoryError as exc:
            raise DatasetError(f"{path} is a directory, not a dlfs index") from exc

    def put_atomic(self, name: str, data: bytes) -> None:
        tmp = self.root / f".{name}.tmp-{os.getpid()}"
        try:
            with _writing(tmp), open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                if self.durable:
                    os.fsync(f.fileno())
        except StoreError:
            tmp.unlink(missing_ok=True)
            raise
        os.replace(tmp, self.root / name)
        if not self.durable:
            return
        dir_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def create(self, name: str) -> ShardWriter:
        return _LocalWriter(self.root / name, self.durable)

    def delete(self, name: str) -> None:
        try:
            (self.root / name).unlink(missing_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot delete {self.root / name}: {exc.strerror}") from exc

    def close(self) -> None:
        with self._lock:
            for fd in [*self._fds.values(), *self._direct_fds.values()]:
                os.close(fd)
            self._fds.clear()
            self._direct_fds.clear()


def open_store(location: str | os.PathLike[str], random_access: bool = False) -> Store:
    """The backend for a dataset location; today only local directories.

    ``random_access``: reads will not follow storage order (a mount), so reading ahead of each
    read in storage order only wastes bandwidth.
    """
    return LocalStore(location, random_access)
