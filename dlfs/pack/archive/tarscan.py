"""Runs of plain tar members taken in C (``_tarscan.c``): a buffer of the tar's bytes at a time,
its headers parsed, its names normalised and its members checksummed in one call.

A tar read from a file spends most of its pass, in Python, on the common member: a regular file
under a ustar or GNU header, its name needing no rule. ``TarScanner.run`` takes a run of those
from a header on, as columns (``FileRun``); the first header it does not take (pax and GNU
extensions, folders, links, a damaged header, the end of the tar, a member larger than the buffer)
goes to the Python reader, ``tar.tar_members``, which then asks for the next run. The C loop takes
a member only where ``tarfile`` and ``members`` would give it exactly the same path and attributes
without a refusal or a warning (``tests/pack/test_tarscan.py`` checks it against them).

Reads go through one function, ``read_at(view, offset)`` (``positional.LocalTar.read_into``).
Without the library built, every member takes the Python reader.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlfs.core import format as fmt
from dlfs.pack.archive.members import KEPT_MODE

LIBRARY = Path(__file__).with_name("_tarscan.so")
#: Bytes of the tar held at a time: a member larger than this takes the Python reader.
BUFFER = 4 << 20
#: Most members in one run.
ROOM = 4096
#: Room for their paths.
PATHS_ROOM = 1 << 20
#: Why a run stopped (``_tarscan.c``): the buffer ends before the next header or member bytes.
STOP_BUFFER = 0
BLOCK = 512

#: Reads bytes of the tar at an offset into a view; how many it read (fewer only at the end).
ReadAt = Callable[[memoryview, int], int]


#: The columns of a ``FileRun`` with one entry per member.
COLUMNS = (
    "offsets", "sizes", "mtimes_ns", "modes", "uids", "gids", "checksums",
    "path_starts", "path_ends", "name_starts",
)  # fmt: skip


@dataclass
class FileRun:
    """Regular-file members in arrival order, as columns. ``offsets``: where each one's bytes start
    in the stream; ``paths``: their normalised paths under the tar's prefix, path i being
    ``paths[path_starts[i]:path_ends[i]]`` with its last component from ``name_starts[i]``;
    ``new_folder``: its folder may differ from the previous member's. ``buffer`` holds the tar's
    bytes from ``buffer_start`` (every member's bytes among them) until the next run is asked for."""

    offsets: np.ndarray
    sizes: np.ndarray
    mtimes_ns: np.ndarray
    modes: np.ndarray
    uids: np.ndarray
    gids: np.ndarray
    checksums: np.ndarray
    paths: bytes
    path_starts: np.ndarray
    path_ends: np.ndarray
    name_starts: np.ndarray
    new_folder: np.ndarray
    buffer: memoryview
    buffer_start: int

    def __len__(self) -> int:
        return len(self.sizes)

    def path(self, k: int) -> bytes:
        return self.paths[self.path_starts[k] : self.path_ends[k]]

    def folder(self, k: int) -> bytes:
        """Member k's folder: its path without the last component."""
        return self.paths[self.path_starts[k] : max(self.name_starts[k] - 1, self.path_starts[k])]

    def names(self) -> tuple[bytes, np.ndarray]:
        """Every member's last component, back to back, and where each ends."""
        lengths = self.path_ends - self.name_starts
        ends = np.cumsum(lengths)
        picked = np.repeat(self.name_starts - (ends - lengths), lengths) + np.arange(int(ends[-1]))
        return np.frombuffer(self.paths, np.uint8)[picked].tobytes(), ends

    def select(self, keep: np.ndarray) -> FileRun:
        """The members where ``keep`` is true; each after a dropped one looks up its folder."""
        after_dropped = np.concatenate([[False], ~keep[:-1]])
        columns = {name: getattr(self, name)[keep] for name in COLUMNS}
        new_folder = (self.new_folder.astype(bool) | after_dropped)[keep]
        return FileRun(
            **columns,
            paths=self.paths,
            new_folder=new_folder,
            buffer=self.buffer,
            buffer_start=self.buffer_start,
        )


class TarScanner:
    """The tar's bytes, a buffer at a time, read through ``read_at``, and the C loop over them.
    While the loop (and whoever takes its runs) works through one buffer, a thread reads the next:
    ``read_at`` lets go of the GIL, so the copy out of the page cache (or a wait on the disk)
    happens beside the checksums. ``checksum``: checksum each member (not needed where the caller
    hashes the bytes itself). ``held``: a run's ``buffer`` may be held past the next run (by a
    shard writer gathering its writes), so each read goes into a new array; else the arrays are
    used again, as a new one costs its pages' first touch."""

    def __init__(self, read_at: ReadAt, checksum: bool, held: bool, library: Path = LIBRARY) -> None:
        self.read_at, self.checksum, self.held = read_at, checksum, held
        lib = ctypes.CDLL(str(library))
        self._scan = lib.dlfs_tar_scan
        self._scan.restype = ctypes.c_int32
        self._scan.argtypes = [
            ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
            ctypes.c_char_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
            ctypes.c_int32, ctypes.c_int64, *[ctypes.c_void_p] * 13,
        ]  # fmt: skip
        #: The bytes held: the tar's from ``start``, ``filled`` of them, at ``base`` in ``array``
        #: (``_fill``: each array is 2 * BUFFER, read into its upper half, the bytes kept from the
        #: last one just below).
        self.array = np.empty(0, np.uint8)
        self.base = 0
        self.view = memoryview(self.array)
        self.start, self.filled = 0, 0
        self._buffer = self.array.ctypes.data
        self.spares: list[np.ndarray] = []
        self.reader = ThreadPoolExecutor(1, thread_name_prefix="dlfs-tar-read")
        #: The read under way: its offset, its array, how many bytes it will have read.
        self.ahead: tuple[int, np.ndarray, Future[int]] | None = None
        self.columns = (
            *(np.empty(ROOM, np.int64) for _ in range(3)),
            *(np.empty(ROOM, np.uint32) for _ in range(3)),
            np.empty(ROOM, np.uint64),
            np.empty(ROOM, np.int64),
            np.empty(ROOM, np.int64),
            np.empty(ROOM, np.uint8),
        )
        self.paths = np.empty(PATHS_ROOM, np.uint8)
        self.next, self.stop = np.zeros(1, np.int64), np.zeros(1, np.int32)
        #: The addresses of the arrays above, passed as they are (numpy's checks cost more than the
        #: C loop over a short run).
        self._outputs = [a.ctypes.data for a in (*self.columns, self.paths, self.next, self.stop)]

    @classmethod
    def available(cls, library: Path = LIBRARY) -> bool:
        return library.exists()

    def run(self, at: int, end: int, prefix: bytes, expand: bool) -> tuple[FileRun | None, int]:
        """The run of members from the header at offset ``at`` (the tar's bytes end at ``end``),
        their paths under ``prefix``, tars among them left to the Python reader where ``expand``;
        and the offset of the first header it leaves. None where it takes no member."""
        count = self._scan_held(at, end, prefix, expand)
        if not count and self.stop[0] == STOP_BUFFER and self._fill(at):
            count = self._scan_held(at, end, prefix, expand)  # the member did not fit: it takes Python's
        if not count:
            return None, at
        offsets, sizes, mtimes, modes, uids, gids, checksums, ends, names, new_folder = (
            column[:count].copy() for column in self.columns
        )
        paths = self.paths[: int(ends[-1])].tobytes()
        starts = np.concatenate([[0], ends[:-1]])
        run = FileRun(
            offsets, sizes, mtimes, modes & KEPT_MODE, uids, gids, checksums, paths, starts, ends, names,
            new_folder, self.view, self.start,
        )  # fmt: skip
        return run, int(self.next[0])

    def _scan_held(self, at: int, end: int, prefix: bytes, expand: bool) -> int:
        """The C loop over the bytes held, from the header at ``at``: how many members it took."""
        count: int = self._scan(
            self._buffer, self.start, self.filled, at, end, prefix, len(prefix), expand, self.checksum,
            fmt.NAME_MAX, ROOM, PATHS_ROOM, *self._outputs,
        )  # fmt: skip
        return count

    def _fill(self, at: int) -> bool:
        """Hold the tar's bytes from ``at`` on: those already held (where they fit below the upper
        half of an array; else they are read again), then the next BUFFER of them (read ahead
        where they follow on); start reading the BUFFER after. Whether any came."""
        held_end = self.start + self.filled
        keep = held_end - at if self.start <= at < held_end else 0
        if keep > BUFFER:
            keep = 0
        offset = at + keep
        array, got = self._read(offset)
        tail = self.base + at - self.start
        array[BUFFER - keep : BUFFER] = self.array[tail : tail + keep]
        if not self.held and len(self.array):
            self.spares.append(self.array)
        self.array, self.base = array, BUFFER - keep
        self.view = memoryview(array)[self.base : BUFFER + got]
        self.start, self.filled, self._buffer = at, keep + got, array.ctypes.data + self.base
        if got == BUFFER:
            ahead = self._array()
            self.ahead = (
                offset + got,
                ahead,
                self.reader.submit(self.read_at, memoryview(ahead)[BUFFER:], offset + got),
            )
        return got > 0

    def _read(self, offset: int) -> tuple[np.ndarray, int]:
        """An array holding BUFFER bytes (fewer at the end) from ``offset`` in its upper half: the
        read ahead, where it is of these bytes; else one made now."""
        if self.ahead is not None:
            at, array, read = self.ahead
            self.ahead = None
            got = read.result()  # waited for even when of other bytes: it writes into the array
            if at == offset:
                return array, got
            if not self.held:
                self.spares.append(array)
        array = self._array()
        return array, self.read_at(memoryview(array)[BUFFER:], offset)

    def _array(self) -> np.ndarray:
        return self.spares.pop() if self.spares else np.empty(2 * BUFFER, np.uint8)

    def close(self) -> None:
        """Wait for the read under way, and end the thread."""
        self.reader.shutdown(wait=True)
