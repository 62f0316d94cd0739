"""The hidden control tree at ``MNT/.dlfs``: published epoch orders, the file list they index, the
datasets' announced file sets, live stats, mount config.

``readdir`` of the mount root never lists ``.dlfs`` (so ImageFolder never takes it for a class),
but ``lookup`` resolves it, like ZFS's ``.zfs``. The names and the order files' format are the
protocol of ``dlfs.core.protocol`` (documented in the README); this module serves them.

Inode numbers start after the dataset's own, so they never collide with index rows. Every lookup of
``stats`` gives a snapshot of its own under a fresh inode: the kernel keeps one size per inode, and
readers sharing one whose bytes changed under them got a snapshot cut short or padded with zeros
(found by the soak test, 16 readers of ``stats`` at once).
"""

from __future__ import annotations

import dataclasses
import json
import stat
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

import numpy as np

from dlfs.core import format as fmt
from dlfs.core.fileset import Announced, FileSet
from dlfs.core.index import Attrs, Index
from dlfs.core.libc import stat_blocks
from dlfs.core.order import OrderSpec, epoch_order
from dlfs.core.protocol import (
    CONFIG_NAME,
    CONTROL_NAME,
    FILES_NAME,
    ORDER_NAME,
    SET_NAME,
    STATS_NAME,
    OrderKey,
    Reading,
    escape,
    parse_order_name,
)

MOUNT_ROOT = fmt.ROOT_ROW + 1
#: Order files kept generated at once; each is up to a few tens of MB for ImageNet.
ORDER_CACHE = 8
#: Stats snapshots kept for the readers that looked them up; an older one is gone (ESTALE).
STATS_SNAPSHOTS = 256
#: Stats snapshots' inodes start this far past the control root, beyond any order file's.
STATS_INODES = 1 << 40
#: Announced file sets' inodes start this far past the control root, between orders' and stats'.
SET_INODES = 1 << 39
DIR_MODE = stat.S_IFDIR | 0o555
FILE_MODE = stat.S_IFREG | 0o444


class ControlTree:
    """Plain-Python model of ``.dlfs``; the FUSE adapter only forwards to it."""

    def __init__(self, index: Index, spec: OrderSpec, stats: Callable[[], dict[str, object]]) -> None:
        self.index = index
        self.spec = spec
        self._stats = stats
        # Reentrant: an order's sequence (made under it) asks for its file set, also under it.
        self._lock = threading.RLock()
        self.root = index.count + 1
        self.order_dir = self.root + 1
        self.config_file = self.root + 3
        self.set_dir = self.root + 4
        self.files_file = self.root + 5
        self._first_order = self.root + 16
        self._order_keys: dict[OrderKey, int] = {}
        #: Each order file's key, and the file set it is made over (kept here: the set may be
        #: forgotten by ``Announced`` while the order file is still read).
        #: Each order name looked up, by inode. A key names its file set by digest only: the sets
        #: themselves stay bounded in ``Announced`` however many names are looked up.
        self._order_inodes: list[OrderKey] = []
        self._announced: Announced | None = None
        self._set_inodes: dict[str, int] = {}
        self._set_digests: dict[int, str] = {}
        self._files_text: bytes | None = None
        self._contents: OrderedDict[int, tuple[Reading, bytes | None]] = OrderedDict()
        self._plain_names: bool | None = None
        self._snapshots: OrderedDict[int, tuple[bytes, int]] = OrderedDict()
        self._next_snapshot = self.root + STATS_INODES
        self._mounted_at = time.time_ns()
        self._files: np.ndarray | None = None

    def owns(self, inode: int) -> bool:
        return (
            self.root <= inode <= self.files_file
            or self.is_order(inode)
            or inode in self._set_digests
            or self.is_volatile(inode)
        )

    def is_order(self, inode: int) -> bool:
        return 0 <= inode - self._first_order < len(self._order_inodes)

    def is_volatile(self, inode: int) -> bool:
        """A stats snapshot: the kernel must not cache its entry or attributes, so that every
        open looks ``stats`` up again and gets a fresh one."""
        return self.root + STATS_INODES <= inode < self._next_snapshot

    def entries(self, inode: int) -> list[tuple[bytes, int]]:
        if inode == self.root:
            return [
                (ORDER_NAME, self.order_dir),
                (STATS_NAME, self.snapshot_stats()),
                (CONFIG_NAME, self.config_file),
                (FILES_NAME, self.files_file),
                (SET_NAME, self.set_dir),
            ]
        return []

    def lookup(self, parent: int, name: bytes) -> int | None:
        """Inode of ``name`` in ``parent`` (the mount root or a control directory), else None."""
        if parent == MOUNT_ROOT:
            return self.root if name == CONTROL_NAME else None
        if name in (b".", b".."):
            up = {self.root: MOUNT_ROOT, self.order_dir: self.root, self.set_dir: self.root}
            return parent if name == b"." else up.get(parent)
        if parent == self.root:
            if name == STATS_NAME:
                return self.snapshot_stats()
            names = {
                ORDER_NAME: self.order_dir,
                CONFIG_NAME: self.config_file,
                FILES_NAME: self.files_file,
                SET_NAME: self.set_dir,
            }
            return names.get(name)
        if parent == self.set_dir:
            return self._set_lookup(name)
        if parent != self.order_dir:
            return None
        key = parse_order_name(name)
        if key is None:
            return None
        if key.fileset is not None and self._fileset(key) is None:
            return None  # never announced, or forgotten since: the sampler announces it again
        if key not in self._order_keys:
            self._order_keys[key] = self._first_order + len(self._order_inodes)
            self._order_inodes.append(key)
        return self._order_keys[key]

    def _fileset(self, key: OrderKey) -> FileSet | None:
        """The announced set an order name is over, None if it names none it knows."""
        if key.fileset is None:
            return None
        with self._lock:
            return self.announced().get(key.fileset)

    def announced(self) -> Announced:
        if self._announced is None:
            self._announced = Announced(int(self.files().size))
        return self._announced

    def _set_lookup(self, name: bytes) -> int | None:
        """A complete set's inode (by its digest), or an announcing name (``dlfs.core.fileset``):
        resolved when it completes its set, not found otherwise."""
        with self._lock:
            announced = self.announced()
            digest = name.decode() if announced.get(name) is not None else announced.receive(name)
        if digest is None:
            return None
        if digest not in self._set_inodes:
            inode = self.root + SET_INODES + len(self._set_inodes)
            self._set_inodes[digest] = inode
            self._set_digests[inode] = digest
        return self._set_inodes[digest]

    def attrs(self, inode: int) -> Attrs:
        if inode in (self.root, self.order_dir, self.set_dir):
            return Attrs(DIR_MODE, 2, 0, 0, 0, 0, self._mounted_at)
        if self.is_volatile(inode):
            return self._file_attrs(*self._snapshot(inode))
        return self._file_attrs(self.content(inode), self._mounted_at)

    def snapshot_stats(self) -> int:
        """Take a stats snapshot and return its new inode. Called on LOOKUP (every open walks the
        path: the entry timeout is 0), so the GETATTR and READs of one open see the same bytes and
        size whatever other readers look up meanwhile. Called in the event loop, which owns the
        counters."""
        inode = self._next_snapshot
        self._next_snapshot += 1
        data = (json.dumps(self._stats(), indent=2, sort_keys=True) + "\n").encode()
        with self._lock:
            self._snapshots[inode] = (data, time.time_ns())
            if len(self._snapshots) > STATS_SNAPSHOTS:
                self._snapshots.popitem(last=False)
        return inode

    def _snapshot(self, inode: int) -> tuple[bytes, int]:
        """(bytes, mtime) of a stats snapshot; LookupError once it has made way for newer ones."""
        with self._lock:
            found = self._snapshots.get(inode)
        if found is None:
            raise LookupError(f"stats snapshot {inode} is gone")
        return found

    def forget(self, inodes: list[int]) -> None:
        """Drop the snapshots the kernel no longer references."""
        with self._lock:
            for inode in inodes:
                self._snapshots.pop(inode, None)

    @staticmethod
    def _file_attrs(data: bytes, mtime_ns: int) -> Attrs:
        return Attrs(FILE_MODE, 1, 0, 0, len(data), stat_blocks(len(data)), mtime_ns)

    def content(self, inode: int) -> bytes:
        if self.is_volatile(inode):
            return self._snapshot(inode)[0]
        if inode == self.config_file:
            return (json.dumps(self.config(), indent=2, sort_keys=True) + "\n").encode()
        if inode == self.files_file:
            with self._lock:
                if self._files_text is None:
                    self._files_text = self._text(self.files())
                return self._files_text
        if inode in self._set_digests:
            with self._lock:
                fileset = self.announced().get(self._set_digests[inode])
            if fileset is None:
                raise LookupError(f"file set {self._set_digests[inode]} is forgotten")
            return (json.dumps({"files": int(fileset.positions.size)}) + "\n").encode()
        text = self._order(inode, text=True)[1]
        assert text is not None
        return text

    def reading(self, inode: int) -> Reading:
        """The sequence behind an order file, without its text: the read-ahead starts on it while
        the text (which the LOOKUP's size needs) is generated."""
        return self._order(inode, text=False)[0]

    def read(self, inode: int, offset: int, size: int) -> bytes:
        return self.content(inode)[offset : offset + size]

    def config(self) -> dict[str, object]:
        return {
            "dataset_id": self.index.dataset_id,
            "format_version": fmt.FORMAT_VERSION,
            "files": int(self.files().size),
            "seed": self.spec.seed,
            "mode": self.spec.mode,
            "block": self.spec.block,
            "window": self.spec.window,
            "transform": self.index.meta.get("transform"),
        }

    def files(self) -> np.ndarray:
        """The file list the order's positions index: storage order for ``block``, rows otherwise."""
        if self._files is None:
            self._files = self.index.file_rows() if self.spec.in_storage_order else self.index.regular_rows()
        return self._files

    def _order(self, inode: int, text: bool) -> tuple[Reading, bytes | None]:
        """The sequence and (if ``text``) the published text of an order file, generated once and
        kept (LRU).

        Called from worker threads (the text of 1.28 M paths takes about a second), hence the lock.
        """
        with self._lock:
            cached = self._contents.get(inode)
            if cached is None:
                cached = self._contents[inode] = (self._sequence(inode), None)
                if len(self._contents) > ORDER_CACHE:
                    self._contents.popitem(last=False)
            self._contents.move_to_end(inode)
            if text and cached[1] is None:
                cached = self._contents[inode] = (cached[0], self._text(cached[0].rows))
            return cached

    def _sequence(self, inode: int) -> Reading:
        """The rows an order file lists: its share of a permutation of the dataset's files (the
        announced set's, else all the mount's), in its seed or the mount's."""
        key = self._order_inodes[inode - self._first_order]
        fileset = self._fileset(key)
        if key.fileset is not None and fileset is None:
            raise LookupError(f"file set {key.fileset} is forgotten")
        files = self.files() if fileset is None else self.files()[fileset.positions]
        spec = self.spec if key.seed is None else dataclasses.replace(self.spec, seed=key.seed)
        rows = files[epoch_order(files.size, spec, key.epoch, key.world_size, key.rank, key.drop_last)]
        return Reading(key.epoch, key.world_size, key.rank, rows, self.spec.neighbour_window, key.label)

    def _text(self, rows: np.ndarray) -> bytes:
        """One path per line; backslashes and newlines in names escaped (names holding them are
        rare, and only then are paths built one by one)."""
        if self._plain_names is None:
            names = self.index.names
            self._plain_names = not bool(np.any((names == ord("\\")) | (names == ord("\n"))))
        if self._plain_names:
            return self.index.path_lines(rows)
        return b"".join(escape(path) + b"\n" for path in self.index.paths(rows))
