"""Columns kept in files while a pack runs, so its memory does not grow with the file count.

Every per-file value a pack keeps (the walk's rows, where each file went) lives in a typed column
file in a private folder; only per-directory state and fixed-size buffers stay in memory. A column
is appended in chunks (``extend``), then read by range (``read``, a ``pread``: the bytes stay in
the page cache, not in the process), or gathered and scattered by row through a shared mapping
whose pages are dropped from the process after every call (``gather``, ``scatter``). Packing
1.28 M tiny files peaked at 377 MB with the columns in memory, 51 MB this way; 14.2 M files peak
at 58 MiB, 85 MiB in random placement (``make bench-packmem``; what a fault maps: PIECE).
"""

from __future__ import annotations

import errno
import mmap
import os
import shutil
import tempfile
from array import array
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from dlfs.core.errors import writing

#: Spill folders' name prefix; one left by a killed pack is removed by the next pack into the
#: same destination (``remove_stale``).
PREFIX = ".dlfs-pack-spill-"
#: Bytes a column is appended in, at most. The page cache holds a write in folios as large as the
#: write, and a fault maps a whole folio: gathering 64 rows at random from a column written in
#: 512 KiB pieces mapped 512 KiB a row, in 64 KiB pieces 64 KiB (the kernel's fault-around).
PIECE = 1 << 16
#: Bytes of a column a gather or scatter maps before it drops them. A column this small is mapped
#: whole in one go, since the rows of a chunk share its pages: 4,096 random rows of a column of
#: 1.28 M 8-byte values took 0.3 ms that way, 1.7 ms in batches of 512. A larger one is touched
#: ROWS_MAPPED rows at a time, each mapping at most PIECE: 4,096 rows at once mapped the whole of a
#: 108 MiB column.
MAPPED_BYTES = 32 << 20
ROWS_MAPPED = MAPPED_BYTES // PIECE
#: Rows a column's gathers and scatters touch before its pages are dropped: at most PIECE mapped
#: a row, 4 MiB of a column. A drop (``madvise``) costs 5 us, and an archive of one-file folders
#: gathers a few rows per folder: dropping after every call was a fifth of its pack.
ROWS_BEFORE_DROP = 64


class Column:
    """A typed column in a file: appended in chunks, then read by range or accessed by row.

    ``gather`` and ``scatter`` touch the rows through a shared mapping of the file and drop the
    touched pages from the process once ROWS_BEFORE_DROP rows were touched (``MADV_DONTNEED``; on a
    shared file mapping the written bytes stay in the page cache), so the process never holds more
    than MAPPED_BYTES of a column.
    """

    def __init__(self, path: Path, dtype: np.dtype | str, length: int = 0) -> None:
        self.path = path
        self.dtype = np.dtype(dtype)
        with writing(path):
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            if length:
                _reserve(self._fd, length * self.dtype.itemsize)
        self.length = length
        self._map: mmap.mmap | None = None
        self._view: np.ndarray | None = None
        #: Rows touched through the mapping since its pages were last dropped.
        self._touched = 0

    def __len__(self) -> int:
        return self.length

    def extend(self, values: np.ndarray | memoryview | bytes) -> None:
        """Append values of this column's type (``bytes``: raw bytes of a ``u1`` column)."""
        raw = memoryview(values).cast("B")
        written = 0
        with writing(self.path):
            while written < len(raw):
                piece = raw[written : written + PIECE]
                written += os.pwrite(self._fd, piece, self.length * self.dtype.itemsize + written)
        self.length += len(raw) // self.dtype.itemsize
        self._unmap()

    def read(self, start: int, stop: int) -> np.ndarray:
        """Values ``start`` up to ``stop``, as a new array."""
        stop = min(stop, self.length)
        count = max(0, stop - start)
        out = np.empty(count, dtype=self.dtype)
        raw = memoryview(out).cast("B")
        done = 0
        while done < len(raw):
            got = os.preadv(self._fd, [raw[done:]], start * self.dtype.itemsize + done)
            if got == 0:
                raise OSError(f"spill column {self.path} is shorter than written")
            done += got
        return out

    def fenced(self, start: int, stop: int) -> np.ndarray:
        """Values ``start - 1`` up to ``stop``, the one before value 0 taken as 0 (int64). For a
        column of where each item of a blob ends (names, link targets): item k of ``start`` up to
        ``stop`` spans ``out[k - start]`` up to ``out[k - start + 1]`` of the blob."""
        ends = self.read(max(start - 1, 0), stop).astype(np.int64)
        return ends if start else np.concatenate([np.zeros(1, dtype=np.int64), ends])

    def chunks(self, step: int) -> list[tuple[int, int]]:
        """``(start, stop)`` ranges covering the column, ``step`` values each."""
        return [(start, min(start + step, self.length)) for start in range(0, self.length, step)]

    def gather(self, rows: np.ndarray) -> np.ndarray:
        """The values at ``rows``, as a new array."""
        out = np.empty(len(rows), dtype=self.dtype)
        if not len(rows):
            return out  # nothing to map, nor to drop
        for at, view in self._batches(len(rows)):
            out[at] = view[rows[at]]
        return out

    def scatter(self, rows: np.ndarray, values: np.ndarray) -> None:
        """Set the values at ``rows``."""
        for at, view in self._batches(len(rows)):
            view[rows[at]] = values[at]

    def slices(self, starts: np.ndarray, ends: np.ndarray) -> list[bytes]:
        """Bytes ``starts[k]`` up to ``ends[k]`` of a ``u1`` column, for each k (names)."""
        out: list[bytes] = []
        for at, view in self._batches(len(starts)):
            bounds = zip(starts[at].tolist(), ends[at].tolist(), strict=True)
            out += [view[start:end].tobytes() for start, end in bounds]
        return out

    def _batches(self, count: int) -> Iterator[tuple[slice, np.ndarray]]:
        """``(slice of the caller's rows, the mapped column)`` for each batch of ``count`` rows
        (see MAPPED_BYTES), the pages touched dropped after a batch once ROWS_BEFORE_DROP rows
        were."""
        step = count if self.length * self.dtype.itemsize <= MAPPED_BYTES else ROWS_MAPPED
        for start in range(0, count, max(step, 1)):
            view = self._mapped()
            try:
                yield slice(start, start + step), view
            finally:
                self._touched += min(step, count - start)
                if self._touched >= ROWS_BEFORE_DROP:
                    self._drop()

    def _mapped(self) -> np.ndarray:
        if self._view is None:
            self._map = mmap.mmap(self._fd, self.length * self.dtype.itemsize)
            # A read of a row never written (a sparse column being scattered) then maps its page
            # alone, not the 64 KiB of zeros the kernel's read-ahead fills around it.
            self._map.madvise(mmap.MADV_RANDOM)
            self._view = np.frombuffer(self._map, dtype=self.dtype)
        return self._view

    def _drop(self) -> None:
        """Drop every page of the mapping from the process: the whole of it, since a fault maps
        neighbouring pages too (the kernel's fault-around, whole large folios), outside the rows
        a call touched. Walking the page tables of an untouched range costs next to nothing."""
        assert self._map is not None
        self._map.madvise(mmap.MADV_DONTNEED)
        self._touched = 0

    def _unmap(self) -> None:
        if self._map is not None:
            self._view = None
            self._map.close()
            self._map = None
            self._touched = 0

    def close(self) -> None:
        self._unmap()
        os.close(self._fd)


def _reserve(fd: int, size: int) -> None:
    """Make a preallocated column ``size`` bytes of zeros, its blocks reserved: ``scatter``
    writes it through a mapping, where a full disk is a SIGBUS that kills the pack, not an error
    it can report. A filesystem that cannot reserve (some network ones) gets a sparse file."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        os.ftruncate(fd, size)


def append_buffers(pairs: Iterable[tuple[Column, array | bytearray]]) -> None:
    """Append each in-memory buffer to its column, and empty it."""
    for column, buffer in pairs:
        column.extend(buffer)  # type: ignore[arg-type]
        del buffer[:]


class Spill:
    """A pack's private folder of columns, removed with everything in it by ``close``."""

    def __init__(self, parent: str | os.PathLike[str]) -> None:
        self.root = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=parent))
        self._columns: list[Column] = []
        self._inner: list[Spill] = []

    def inner(self) -> Spill:
        """A folder of its own inside this one, closed with it: for a second set of columns under
        the same names (the walked tree that ``--map`` lays out again)."""
        self._inner.append(Spill(self.root))
        return self._inner[-1]

    def column(self, name: str, dtype: np.dtype | str, length: int = 0) -> Column:
        self._columns.append(Column(self.root / name, dtype, length))
        return self._columns[-1]

    def path(self, name: str) -> Path:
        """A file in the folder for the caller to write (the index, before it is published)."""
        return self.root / name

    def close(self) -> None:
        for inner in self._inner:
            inner.close()
        for column in self._columns:
            column.close()
        shutil.rmtree(self.root, ignore_errors=True)


def remove_stale(parent: Path) -> None:
    """Remove the spill folders in ``parent`` of packs that were killed before they could clean up
    (their process is gone); a running pack's folder stays."""
    for entry in parent.glob(f"{PREFIX}*"):
        pid = entry.name[len(PREFIX) :].partition("-")[0]
        if entry.is_dir() and not entry.is_symlink() and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
