"""The pyfuse3 adapter: kernel requests in, calls on Index and FileBytes out.

Thin on purpose. Domain errors become errno values here and nowhere else. Inode numbers are index
rows + 1, so the kernel's lookup counting needs no table (``forget`` only updates what the daemon knows
the kernel knows, ``dlfs.fuse.known``), and entry
and attribute timeouts are long because a packed dataset never changes.

File handles are inode numbers. With the pyfuse3 build from ``tools/build_pyfuse3.py``, ``open``,
``opendir`` and ``flush`` answer ENOSYS: the kernel then stops sending them, keeps file pages and
directory listings cached (its defaults without an open), and hands READ/READDIR the inode. On stock
pyfuse3 the opens are answered and carry the inode as handle, so the rest of the code is the same.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Sequence

import numpy as np
import pyfuse3
import trio
from pyfuse3 import (
    EntryAttributes,
    FileHandleT,
    FileInfo,
    FileNameT,
    FlagT,
    InodeT,
    ReaddirToken,
    RequestContext,
    StatvfsData,
)

from dlfs.core import format as fmt
from dlfs.core.errors import DlfsError
from dlfs.core.index import Attrs, Index
from dlfs.core.protocol import CONTROL_NAME, latency_bucket
from dlfs.fuse import dirents
from dlfs.fuse.control import ControlTree
from dlfs.fuse.known import KernelKnowledge
from dlfs.fuse.lister import FolderLister
from dlfs.fuse.mount_stats import RequestCounts
from dlfs.fuse.server import NativeServer
from dlfs.fuse.trio_file_bytes import TrioFileBytes
from dlfs.readahead.engine import ReadAhead

#: The data never changes while mounted, so the kernel may keep names and attributes for a day.
CACHE_TIMEOUT = 24 * 3600.0
STATFS_BLOCK = 4096
#: A directory's st_blksize. glibc's opendir sizes its getdents buffer by it (32 KiB to 1 MiB), and
#: the kernel sizes each READDIR request by that buffer (up to max_pages; 6.18 here): a class folder
#: of a thousand images is then one round trip, and one more to find its end, instead of one per
#: 32 KiB. Measured, cold ImageFolder scan of 200k entries: READDIRs 1,403 -> 402.
LISTING_BLOCK = 1 << 20
NAME_MAX = 255
DOTS = (b".", b"..")
#: Entries prepared per vectorised step of a READDIR reply on stock pyfuse3 (a reply holds hundreds).
READDIR_BATCH = 64
#: True with the pyfuse3 build that passes the inode when the kernel skipped open.
SKIP_OPEN = "inode_as_fh_without_open" in getattr(pyfuse3, "dlfs_features", ())
#: True with the pyfuse3 build that takes directory records encoded by ``dlfs.fuse.dirents``.
RAW_READDIR = "readdir_reply_raw" in getattr(pyfuse3, "dlfs_features", ())


def _row(inode: int) -> int:
    return inode - pyfuse3.ROOT_INODE


def _inode(row: int) -> InodeT:
    return InodeT(row + pyfuse3.ROOT_INODE)


class DlfsOperations(pyfuse3.Operations):
    """Read-only operations over one dataset; every mutating request is refused by the ``ro`` mount."""

    #: Read by the patched pyfuse3 at INIT: True lets the kernel list files without attributes
    #: (fast ``find``: only directories get theirs); False makes every listing carry attributes, so
    #: the kernel knows every inode after a scan and the read-ahead can push pages for all of them.
    readdirplus_auto = False

    def __init__(
        self,
        index: Index,
        file_bytes: TrioFileBytes,
        control: ControlTree,
        readahead: ReadAhead | None = None,
        lister: FolderLister | None = None,
        known: KernelKnowledge | None = None,
        answered: RequestCounts | None = None,
        native: NativeServer | None = None,
    ) -> None:
        super().__init__()
        self.index = index
        self.file_bytes = file_bytes
        self.control = control
        self.readahead = readahead
        self.lister = lister
        self.known = known if known is not None else KernelKnowledge(index)
        #: The requests answered here, counted for ``.dlfs/stats`` (``mount_stats``).
        self.answered = answered if answered is not None else RequestCounts()
        #: The C threads that answer the hot requests before they reach this object, if running.
        self.native = native
        self._listings = dirents.Encoder(
            index, pyfuse3.ROOT_INODE, CACHE_TIMEOUT, (STATFS_BLOCK, LISTING_BLOCK)
        )

    def _entry(self, row: int, a: Attrs | None = None) -> EntryAttributes:
        return self._attributes(_inode(row), a or self.index.attrs(row), CACHE_TIMEOUT, CACHE_TIMEOUT)

    async def _control_entry(self, inode: int) -> EntryAttributes:
        """Control entries are re-resolved on every path walk (entry timeout 0): resolving an order
        file is how a reader announces itself. Stats also expire at once, so each read is fresh; a stats
        snapshot gone since answers ESTALE."""
        try:
            attrs = await trio.to_thread.run_sync(self.control.attrs, inode)
        except LookupError as exc:
            raise pyfuse3.FUSEError(errno.ESTALE) from exc
        return self._attributes(inode, attrs, 0, 0 if self.control.is_volatile(inode) else CACHE_TIMEOUT)

    @staticmethod
    def _attributes(inode: int, a: Attrs, entry_timeout: float, attr_timeout: float) -> EntryAttributes:
        entry = EntryAttributes()
        entry.st_ino = InodeT(inode)
        entry.generation = 0
        entry.entry_timeout = entry_timeout
        entry.attr_timeout = attr_timeout
        entry.st_mode = pyfuse3.ModeT(a.mode)
        entry.st_nlink = a.nlink
        entry.st_uid = a.uid
        entry.st_gid = a.gid
        entry.st_size = a.size
        entry.st_blksize = LISTING_BLOCK if stat.S_ISDIR(a.mode) else STATFS_BLOCK
        entry.st_blocks = a.blocks
        entry.st_atime_ns = a.mtime_ns
        entry.st_mtime_ns = a.mtime_ns
        entry.st_ctime_ns = a.mtime_ns
        return entry

    @staticmethod
    def _bare_entry(row: int, mode: int) -> EntryAttributes:
        """What plain READDIR carries: inode and type. The kernel looks up the rest if needed."""
        entry = EntryAttributes()
        entry.st_ino = _inode(row)
        entry.st_mode = pyfuse3.ModeT(mode)
        return entry

    def _check(self, inode: int) -> int:
        row = _row(inode)
        if not 0 <= row < self.index.count:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return row

    async def lookup(self, parent_inode: InodeT, name: FileNameT, ctx: RequestContext) -> EntryAttributes:
        self.answered.requests["lookup"] += 1
        if self.control.owns(parent_inode) or (parent_inode == pyfuse3.ROOT_INODE and name == CONTROL_NAME):
            return await self._control_lookup(parent_inode, name)
        parent = self._check(parent_inode)
        if name == b".":
            return self._entry(parent)
        if name == b"..":
            return self._entry(int(self.index.parent[parent]))
        row = self.index.lookup(parent, name)
        if row is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if self.lister is not None:
            self.lister.looked_up(parent)
        return self._entry(self.index.hard_links.inode_row(row))

    async def _control_lookup(self, parent_inode: int, name: bytes) -> EntryAttributes:
        inode = self.control.lookup(parent_inode, name)
        if inode is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if inode == pyfuse3.ROOT_INODE:
            return self._entry(fmt.ROOT_ROW)
        if self.control.is_order(inode):
            try:
                reading = await trio.to_thread.run_sync(self.control.reading, inode)
            except LookupError as exc:  # its file set forgotten since the lookup: announce it again
                raise pyfuse3.FUSEError(errno.ENOENT) from exc
            if self.readahead is not None:
                self.readahead.activate(reading)
                if self.native is not None:
                    self.native.watch_reads()  # the read-ahead follows the reader by its READs
        return await self._control_entry(inode)

    async def getattr(self, inode: InodeT, ctx: RequestContext) -> EntryAttributes:
        self.answered.requests["getattr"] += 1
        if self.control.owns(inode):
            return await self._control_entry(inode)
        return self._entry(self._check(inode))

    async def readlink(self, inode: InodeT, ctx: RequestContext) -> FileNameT:
        row = self._check(inode)
        if not self.index.is_symlink(row):
            raise pyfuse3.FUSEError(errno.EINVAL)
        return FileNameT(self.index.readlink(row))

    async def opendir(self, inode: InodeT, ctx: RequestContext) -> FileHandleT:
        if SKIP_OPEN:
            raise pyfuse3.FUSEError(errno.ENOSYS)
        if not self.index.is_dir(self._check(inode)):
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return FileHandleT(inode)

    async def readdir(self, fh: FileHandleT, start_id: int, token: ReaddirToken) -> None:
        """Positions 0 and 1 are '.' and '..'; position p >= 2 is child p - 2 of the directory.

        ``start_id`` is the position where the previous reply stopped, so a listing split over
        several requests resumes exactly there. With the patched pyfuse3 a reply's entries are
        encoded in one call (``dlfs.fuse.dirents``), for plain READDIR (``token.plus`` false) only names,
        inodes and types; on stock pyfuse3 they go one call each, in small vectorised batches.
        """
        self.answered.requests["readdir"] += 1
        if self.control.owns(fh):
            await self._control_readdir(fh, start_id, token)
            return
        row = self._check(fh)
        rows = self.index.children(row)
        for position in range(start_id, len(DOTS)):
            # Bare even in READDIRPLUS: the kernel takes no attributes from '.' and '..' entries.
            target = row if position == 0 else int(self.index.parent[row])
            entry = self._bare_entry(target, self.index.mode.item(target))
            if not pyfuse3.readdir_reply(token, FileNameT(DOTS[position]), entry, position + 1):
                return
        first = max(start_id - len(DOTS), 0)
        plus = getattr(token, "plus", True)  # stock pyfuse3 always answers READDIRPLUS
        if RAW_READDIR:
            attrs = self._attributes_for(row, plus)
            self._readdir_encoded(rows, rows.start + first, attrs, token)
            with_attributes = attrs == dirents.Attributes.ALL
        else:
            self._readdir_entries(rows, rows.start + first, plus, token)
            with_attributes = plus
        if start_id == 0 and rows:  # a listing begins (the kernel's cache did not answer it)
            if with_attributes:
                self.known.listing_began(row)
            elif self.lister is not None:
                self.lister.scanned(row)  # the read-ahead will want these files' inodes

    def _readdir_entries(self, rows: range, start: int, plus: bool, token: ReaddirToken) -> None:
        """Children from ``start`` on, one call each, prepared in small vectorised batches (stock
        pyfuse3)."""
        for first in range(start, rows.stop, READDIR_BATCH):
            batch = range(first, min(first + READDIR_BATCH, rows.stop))
            if plus:
                entries = map(self._entry, batch, self.index.attrs_run(batch))
            else:
                entries = map(self._bare_entry, batch, self.index.mode[first : batch.stop].tolist())
            for child, name, entry in zip(batch, self.index.names_run(batch), entries, strict=True):
                next_id = child - rows.start + len(DOTS) + 1
                if not pyfuse3.readdir_reply(token, FileNameT(name), entry, next_id):
                    return
                self._listed(range(child, child + 1), plus)

    def _attributes_for(self, row: int, plus: bool) -> dirents.Attributes:
        """READDIRPLUS_AUTO asks for attributes with the first request of every listing, to learn
        whether the program stats the entries. Attributes for every entry would make the kernel
        build an inode for each, the cost auto mode is there to avoid; directories get theirs, so
        a scan's walk into each folder needs no LOOKUP."""
        if not plus:
            return dirents.Attributes.NONE
        if self.readdirplus_auto and not self.known.wants_attributes(row):
            return dirents.Attributes.DIRS
        return dirents.Attributes.ALL

    def _readdir_encoded(
        self, rows: range, start: int, attrs: dirents.Attributes, token: ReaddirToken
    ) -> None:
        """Children from ``start`` on, encoded a reply's worth at a time (``dlfs.fuse.dirents``)."""
        while start < rows.stop:
            next_id = start - rows.start + len(DOTS) + 1
            records, count = self._listings.encode(range(start, rows.stop), next_id, token.size, attrs)
            if count == 0 or not pyfuse3.readdir_reply_raw(token, records):
                return
            self._listed(range(start, start + count), attrs == dirents.Attributes.ALL)
            start += count

    def _listed(self, rows: range, plus: bool) -> None:
        """Entries with attributes make the kernel know the inodes, which a push needs."""
        if plus:
            self.known.listed(rows)

    async def _control_readdir(self, inode: int, start_id: int, token: ReaddirToken) -> None:
        listing = [(b".", inode), (b"..", self.control.lookup(inode, b"..")), *self.control.entries(inode)]
        for position in range(start_id, len(listing)):
            name, child = listing[position]
            entry = (
                self._entry(fmt.ROOT_ROW) if child == pyfuse3.ROOT_INODE else await self._control_entry(child)
            )
            if not pyfuse3.readdir_reply(token, FileNameT(name), entry, position + 1):
                return

    async def releasedir(self, fh: FileHandleT) -> None:
        return None

    async def open(self, inode: InodeT, flags: FlagT, ctx: RequestContext) -> FileInfo:
        if SKIP_OPEN:
            raise pyfuse3.FUSEError(errno.ENOSYS)
        row = self._check(inode)
        if flags & os.O_ACCMODE != os.O_RDONLY or flags & (os.O_TRUNC | os.O_APPEND):
            raise pyfuse3.FUSEError(errno.EROFS)
        if not self.index.is_file(row):
            raise pyfuse3.FUSEError(errno.EISDIR if self.index.is_dir(row) else errno.EINVAL)
        return FileInfo(fh=FileHandleT(inode), keep_cache=True)

    async def read(self, fh: FileHandleT, off: int, size: int) -> bytes:
        self.answered.requests["read"] += 1
        if self.control.owns(fh):
            try:
                return await trio.to_thread.run_sync(self.control.read, fh, off, size)
            except LookupError as exc:
                raise pyfuse3.FUSEError(errno.ESTALE) from exc
        row = self._check(fh)
        if not self.index.is_file(row):
            raise pyfuse3.FUSEError(errno.EISDIR if self.index.is_dir(row) else errno.EINVAL)
        started = time.perf_counter()
        if self.readahead is not None:
            self.readahead.observe(row)
            await self.readahead.arrival(row)
        try:
            data = await self.file_bytes.read(row, off, size)
        except DlfsError as exc:
            raise pyfuse3.FUSEError(errno.EIO) from exc
        self.answered.requests["read_bytes"] += len(data)
        took = time.perf_counter() - started
        self.answered.read_latency[latency_bucket(took)] += 1
        self.answered.read_seconds += took
        return data

    async def release(self, fh: FileHandleT) -> None:
        return None

    async def forget(self, inode_list: Sequence[tuple[InodeT, int]]) -> None:
        """Nothing to free (inodes are rows); the record of what the kernel knows, the lister and
        the read-ahead learn which entries the kernel lost. Their folders' listings go back to the
        mode's own: after the kernel forgot a tree, a scan under ``--readdirplus auto`` is as fast
        as the first one, not one giving every file attributes because the read-ahead once wanted
        them."""
        if not inode_list:
            return
        self.answered.requests["forget"] += len(inode_list)
        self.control.forget([inode for inode, _ in inode_list if self.control.is_volatile(inode)])
        rows = np.fromiter((inode for inode, _ in inode_list), dtype=np.int64) - pyfuse3.ROOT_INODE
        rows = rows[(rows >= 0) & (rows < self.index.count)]
        folders = self.known.forgotten(rows)
        if self.lister is not None and folders:
            self.lister.forgotten(folders)
        if self.readahead is not None:
            self.readahead.forgotten(rows)

    async def statfs(self, ctx: RequestContext) -> StatvfsData:
        out = StatvfsData()
        out.f_bsize = STATFS_BLOCK
        out.f_frsize = STATFS_BLOCK
        out.f_blocks = (self.index.total_stored + STATFS_BLOCK - 1) // STATFS_BLOCK
        out.f_bfree = out.f_bavail = 0
        out.f_files = self.index.count
        out.f_ffree = out.f_favail = 0
        out.f_namemax = NAME_MAX
        return out
