"""The native request server: the mount's hot requests answered in C on several threads.

Every request pyfuse3 answers waits for one Python thread, and an unmodified loader that follows no
published order sends three per image: a LOOKUP, the IOCTL of Python's ``open()`` (isatty) and a
READ. ``_server.c`` reads all requests from ``/dev/fuse`` on ``threads`` threads (clones of the
session's descriptor), and its handlers (``_handlers.c``) answer LOOKUP, GETATTR and READ of the
dataset's entries, listings that give files no attributes, IOCTL and STATFS from the index columns
and the shards, never entering the interpreter; everything else reaches pyfuse3 unchanged through
libfuse's custom I/O (``pyfuse3.custom_io``), so the control tree, listings with attributes and the
read-ahead stay in Python, which gets FORGETs gathered into batches and the folders the C threads
listed (``take_scanned``). What goes where, and why, is in docs/design.md.
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

import numpy as np
import pyfuse3

from dlfs.core.file_bytes import FileBytes
from dlfs.core.index import Index
from dlfs.core.protocol import LATENCY_BUCKETS
from dlfs.fuse import dirents
from dlfs.fuse.known import KernelKnowledge

log = logging.getLogger(__name__)

LIBRARY = Path(__file__).with_name("_server.so")
#: Opcode counters of ``struct counts``.
OPCODES = 64
#: How long ``close`` waits for the threads after the unmount.
STOP_TIMEOUT_MS = 2000
#: The region ``--region-ahead auto`` fetches around a file read from storage, in one request (see
#: ``fetch_region`` in ``_handlers.c``).
REGION = 4 << 20
#: ``auto`` fetches regions only when the shards take at most this share of the machine's memory:
#: beyond, a region would be evicted before the reader comes back for the rest of it.
REGION_MEMORY_SHARE = 0.5

#: Folders taken from the C threads per call in ``take_scanned``.
SCANNED_BATCH = 4096

#: The opcodes the stats name (include/uapi/linux/fuse.h); others are counted by number.
OPCODE_NAMES = {
    1: "lookup", 2: "forget", 3: "getattr", 15: "read", 17: "statfs", 25: "flush", 26: "init",
    28: "readdir", 36: "interrupt", 39: "ioctl", 42: "batch_forget", 44: "readdirplus",
}  # fmt: skip


class _Dataset(ctypes.Structure):
    """``struct dataset`` of ``_handlers.h``."""

    _fields_ = [
        ("c", dirents.Columns),
        ("r", dirents.Reply),
        ("parent", ctypes.c_void_p),
        ("shard", ctypes.c_void_p),
        ("offset", ctypes.c_void_p),
        ("checksum", ctypes.c_void_p),
        ("flags", ctypes.c_void_p),
        ("shard_fds", ctypes.c_void_p),
        ("shard_base", ctypes.c_void_p),
        ("count", ctypes.c_uint64),
        ("statfs_blocks", ctypes.c_uint64),
        ("statfs_bsize", ctypes.c_uint32),
        ("control_name", ctypes.c_char * 32),
        ("region", ctypes.c_uint64),
        ("wanted", ctypes.c_void_p),
        ("readdirplus_auto", ctypes.c_uint32),
        ("run_parent", ctypes.c_void_p),
        ("run_start", ctypes.c_void_p),
        ("runs", ctypes.c_uint64),
    ]


class _Counts(ctypes.Structure):
    """``struct counts`` of ``_handlers.h``."""

    _fields_ = [
        ("answered", ctypes.c_uint64 * OPCODES),
        ("cpu_ns", ctypes.c_uint64 * OPCODES),
        ("forwarded", ctypes.c_uint64 * OPCODES),
        ("read_bytes", ctypes.c_uint64),
        ("regions", ctypes.c_uint64),
        ("read_latency", ctypes.c_uint64 * LATENCY_BUCKETS),
        ("read_ns", ctypes.c_uint64),
    ]


def region_for(index: Index, asked: int | None) -> int:
    """The region to fetch around a file read from storage: ``asked``, or for None (auto) ``REGION``
    when the shards fit in ``REGION_MEMORY_SHARE`` of this machine's memory, else 0."""
    if asked is not None:
        return asked
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return REGION if index.total_stored <= memory * REGION_MEMORY_SHARE else 0


def available(index: Index) -> str | None:
    """None when this process can serve ``index`` in C, else why not (for the mount's log)."""
    if dirents.Columns.of(index) is None:
        return "the index's columns are not in this host's byte order"
    if not LIBRARY.exists():
        return f"{LIBRARY.name} is not built (make install builds it)"
    mirrors = {"columns": dirents.Columns, "reply": dirents.Reply, "dataset": _Dataset, "counts": _Counts}
    mismatch = dirents.mismatch(ctypes.CDLL(str(LIBRARY)), mirrors)
    if mismatch is not None:
        return f"{LIBRARY.name} {mismatch} (make install rebuilds it)"
    if "custom_io" not in getattr(pyfuse3, "dlfs_features", ()):
        return "pyfuse3 lacks custom_io (tools/build_pyfuse3.py builds it)"
    return None


def _library() -> ctypes.CDLL:
    """``_server.so``, with the signatures of what Python calls."""
    lib = ctypes.CDLL(str(LIBRARY))
    lib.dlfs_server_io.restype = ctypes.c_void_p
    lib.dlfs_server_prepare.argtypes = [ctypes.c_void_p]
    lib.dlfs_server_counts.argtypes = [ctypes.POINTER(_Counts)]
    lib.dlfs_handlers_new.restype = ctypes.c_void_p
    lib.dlfs_handlers_new.argtypes = [ctypes.POINTER(_Dataset)]
    lib.dlfs_handlers_free.argtypes = [ctypes.c_void_p]
    lib.dlfs_handlers_watch_reads.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.dlfs_handlers_take_scanned.restype = ctypes.c_int64
    lib.dlfs_handlers_take_scanned.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    lib.dlfs_handlers_scans_pending.restype = ctypes.c_int64
    lib.dlfs_handlers_scans_pending.argtypes = [ctypes.c_void_p]
    return lib


class Handlers:
    """The C request handlers of one mount (``_handlers.c``): what they answer from and what their
    threads share. ``shard_fds`` (a descriptor per shard, -1 for one Python reads) and ``wanted``
    (``KernelKnowledge.wanted``) are kept here, as the index is by its owner: C holds pointers into
    them until ``close``."""

    def __init__(
        self,
        index: Index,
        shard_fds: np.ndarray,
        control_name: bytes,
        timeout: float,
        blksize: tuple[int, int],
        statfs_block: int,
        region: int,
        wanted: np.ndarray,
        readdirplus_auto: bool,
    ) -> None:
        columns = dirents.Columns.of(index)
        if columns is None:
            raise ValueError("index columns not in this host's byte order (see available())")
        self.library = _library()
        self._arrays = (shard_fds, wanted)
        self.dataset = _Dataset(
            c=columns,
            r=dirents.Reply.of(pyfuse3.ROOT_INODE, timeout, blksize),
            parent=index.parent.ctypes.data,
            shard=index.shard.ctypes.data,
            offset=index.offset.ctypes.data,
            checksum=index.checksum.ctypes.data,
            flags=index.flags.ctypes.data,
            shard_fds=shard_fds.ctypes.data,
            shard_base=index.shard_base.ctypes.data,
            count=index.count,
            statfs_blocks=-(-index.total_stored // statfs_block),
            statfs_bsize=statfs_block,
            control_name=control_name,
            region=region,
            wanted=wanted.ctypes.data,
            readdirplus_auto=readdirplus_auto,
            run_parent=index.run_parent.ctypes.data,
            run_start=index.run_start.ctypes.data,
            runs=index.run_start.size,
        )
        self.pointer = self.library.dlfs_handlers_new(ctypes.byref(self.dataset))
        if not self.pointer:
            raise MemoryError("no memory for the native request handlers")
        self._scanned = np.empty(SCANNED_BATCH, dtype=np.uint64)

    def watch_reads(self) -> None:
        """Leave every READ of a dataset file to Python: the read-ahead follows readers by them."""
        self.library.dlfs_handlers_watch_reads(self.pointer, 1)

    def take_scanned(self) -> list[int]:
        """Folders whose listings the handlers began without attributes for their files since the
        last call: what ``FolderLister.scanned`` counts."""
        taken: list[int] = []
        take = self.library.dlfs_handlers_take_scanned
        while n := take(self.pointer, self._scanned.ctypes.data, self._scanned.size):
            taken += self._scanned[:n].tolist()
        return taken

    def scans_pending(self) -> int:
        """Folders the handlers listed that ``take_scanned`` has not passed on yet."""
        return int(self.library.dlfs_handlers_scans_pending(self.pointer))

    def close(self) -> None:
        """Once no thread answers with them."""
        self.library.dlfs_handlers_free(self.pointer)
        self.pointer = None


class NativeServer:
    """The C threads of one mount. ``start`` after ``pyfuse3.init`` and before ``pyfuse3.main``;
    ``close`` after ``pyfuse3.close``."""

    def __init__(
        self,
        index: Index,
        file_bytes: FileBytes,
        control_name: bytes,
        timeout: float,
        blksize: tuple[int, int],
        statfs_block: int,
        region: int,
        known: KernelKnowledge,
        readdirplus_auto: bool,
    ) -> None:
        self.index = index
        self.known = known  # its ``wanted`` column is read by the C threads
        descriptors = (file_bytes.descriptor(k) for k in range(len(index.shard_names)))
        shard_fds = np.array([-1 if fd is None else fd for fd in descriptors], dtype=np.int32)
        #: Shards are files to pread; else (an object store) every READ of a file goes to Python.
        self.reads_files = bool((shard_fds >= 0).all())
        self.handlers = Handlers(
            index,
            shard_fds,
            control_name,
            timeout,
            blksize,
            statfs_block,
            region if self.reads_files else 0,
            known.wanted,
            readdirplus_auto,
        )
        self._lib = self.handlers.library
        self.threads = 0

    def start(self, threads: int) -> None:
        """Take the mounted session's requests: from here on pyfuse3 sees only what C hands it."""
        wait_fd = self._lib.dlfs_server_prepare(self.handlers.pointer)
        if wait_fd < 0:
            raise OSError(-wait_fd, os.strerror(-wait_fd))
        # Threads first: if none starts, pyfuse3 keeps reading the device itself and nothing is lost.
        # Requests they read before pyfuse3's loop runs wait in the queue for it.
        started = self._lib.dlfs_server_start(pyfuse3.dev_fuse_fd(), threads)
        if started < 0:
            raise OSError(-started, f"cannot start the native request threads: {os.strerror(-started)}")
        self.threads = started
        pyfuse3.custom_io(self._lib.dlfs_server_io(), wait_fd)
        region = self.handlers.dataset.region
        if not self.reads_files:
            reads = "READs of files answered in Python (the shards are not local files)"
        elif region:
            reads = f"{region >> 10} KiB regions fetched around files read from storage"
        else:
            reads = "no region fetch"
        log.info("native request server: %d threads, %s", started, reads)

    def take_scanned(self) -> list[int]:
        """``Handlers.take_scanned``."""
        return self.handlers.take_scanned()

    def scans_pending(self) -> int:
        """Folders the C threads listed that ``take_scanned`` has not passed on yet: work for the
        lister that the mount must count as not idle."""
        return self.handlers.scans_pending()

    def watch_reads(self) -> None:
        """``Handlers.watch_reads``."""
        self.handlers.watch_reads()

    def counts(self) -> dict[str, object]:
        """Requests answered in C and handed to Python, by kind, the C threads' CPU per kind, and
        the latency of the READs answered in C (from reading the request to writing the reply) as
        ``.dlfs/stats`` gives Python's: log2 µs buckets and their seconds in all."""
        c = _Counts()
        self._lib.dlfs_server_counts(ctypes.byref(c))
        answered, forwarded, cpu = {}, {}, {}
        for op in range(OPCODES):
            name = OPCODE_NAMES.get(op, f"op{op}")
            if c.answered[op]:
                answered[name] = c.answered[op]
                cpu[name] = round(c.cpu_ns[op] / c.answered[op] / 1000, 2)
            if c.forwarded[op]:
                forwarded[name] = c.forwarded[op]
        return {
            "threads": self.threads,
            "answered": answered,
            "forwarded": forwarded,
            "cpu_us_per_request": cpu,
            "read_bytes": c.read_bytes,
            "regions_fetched": c.regions,
            "read_latency_us_log2": list(c.read_latency),
            "read_seconds": round(c.read_ns / 1e9, 6),
        }

    def session_ended(self) -> bool:
        """True once the kernel ended the session (an unmount from outside): nothing to unmount.

        libfuse learns that from a failed poll of the descriptor it holds, which is no longer the
        device's: without this it tries the unmount again and prints why it failed."""
        return self.threads > 0 and not self._lib.dlfs_server_running()

    def close(self) -> None:
        """After the unmount: wait for the threads (they stop once the kernel ends the session),
        then free their handlers, unless some still serve (and answer with them)."""
        if self.threads and (left := self._lib.dlfs_server_stop(STOP_TIMEOUT_MS)):
            log.warning("%d native request threads still serve a busy lazily-unmounted mount", left)
            return
        self.handlers.close()
