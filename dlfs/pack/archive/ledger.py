"""The ledger: an archive's members in the order they arrive, with where each one's bytes went.

An archive's member order is arbitrary, so the pass writes each member's bytes as it arrives and
records it here; the index's rows are sorted out of the ledger at the end (``rows``). Per member
the ledger holds LEDGER_COLUMNS (92 bytes) and its name, in column files of the pack's ``Spill``;
in memory it keeps only a buffer of FLUSH_ROWS members, every folder (path, name and attributes,
~250 bytes each) and the path of every symlink, so that a member reached through one is refused as
it arrives.
"""

from __future__ import annotations

import stat
from array import array
from dataclasses import dataclass

import numpy as np

from dlfs.core import format as fmt
from dlfs.core.errors import PackError
from dlfs.pack.archive.members import Member, Refused, show
from dlfs.pack.archive.tarscan import FileRun
from dlfs.pack.options import PackOptions, PackSummary, fail_or_skip
from dlfs.pack.pipeline import Payload
from dlfs.pack.spill import Spill, append_buffers
from dlfs.pack.walk import FLUSH_ROWS

#: Per member: its folder, type and permissions (``stat`` bits; ``members.HARDLINK`` for a hard
#: link; 0 once dropped), owner, size, mtime, where its name ends in ``names``, where its payload
#: went (shard, offset, stored bytes, checksum, flags), its link target's number in ``link_end``,
#: and where its bytes lie in the archive (``source``, ``contiguous``), for serving them in place.
LEDGER_COLUMNS = {
    "parent": "I",
    "mode": "H",
    "uid": "I",
    "gid": "I",
    "size": "Q",
    "mtime": "q",
    "name_end": "Q",
    "shard": "I",
    "offset": "Q",
    "stored": "Q",
    "checksum": "Q",
    "flags": "B",
    "link": "Q",
    "source": "Q",
    "contiguous": "B",
}


@dataclass
class Folder:
    """A folder of the tree, named by a member or implied by one's path."""

    parent: int
    name: bytes
    mode: int
    uid: int
    gid: int
    mtime_ns: int
    #: A member named it (else its attributes are the root's defaults).
    named: bool = False
    #: The number the next member had when a folder member last named it (-1: none did), which
    #: ``rows`` weighs against a file or symlink at the same path.
    named_at: int = -1


class Ledger:
    """Members recorded in arrival order (numbered from 0), and the folders they make."""

    def __init__(self, spill: Spill, root: Folder) -> None:
        self.columns = {
            name: spill.column(f"ledger-{name}", np.dtype(code)) for name, code in LEDGER_COLUMNS.items()
        }
        self.names = spill.column("ledger-names", np.uint8)
        self.link_end = spill.column("ledger-link-end", np.uint64)
        self.links = spill.column("ledger-links", np.uint8)
        self.folders: list[Folder] = [root]
        self.folder_ids: dict[bytes, int] = {b"": fmt.ROOT_ROW}
        #: Every symlink member's path, added as it arrives.
        self.symlinks: set[bytes] = set()
        #: A GNU sparse member's runs of data, by member number.
        self.sparse: dict[int, tuple[tuple[int, int], ...]] = {}
        self.count = 0
        #: Members admitted that are not folders: the number the next one will have once every
        #: member handed on is recorded (a writer records them in batches, later).
        self.arrived = 0
        self._rows = {name: array(code) for name, code in LEDGER_COLUMNS.items()}
        self._names, self._names_length = bytearray(), 0
        self._links, self._links_length = bytearray(), 0
        self._link_end = array("Q")
        self._link_count = 0

    def __len__(self) -> int:
        return self.count

    def folder(self, member: Member) -> None:
        """Record a folder member: the last one named for a path gives its attributes."""
        folder = self.folders[self._folder(member.path)]
        folder.mode, folder.uid, folder.gid = member.mode, member.uid, member.gid
        folder.mtime_ns, folder.named, folder.named_at = member.mtime_ns, True, self.arrived

    def add(
        self, member: Member, payload: Payload | None = None, shard: int = 0, offset: int = 0, stored: int = 0
    ) -> None:
        """Record a file (with its payload's place), symlink or hard link."""
        folder, _, name = member.path.rpartition(b"/")
        rows = self._rows
        rows["parent"].append(self._folder(folder))
        self._names += name
        rows["name_end"].append(self._names_length + len(self._names))
        rows["mode"].append(member.kind | member.mode)
        rows["uid"].append(member.uid)
        rows["gid"].append(member.gid)
        rows["mtime"].append(member.mtime_ns)
        rows["source"].append(member.offset)
        rows["contiguous"].append(member.contiguous)
        rows["link"].append(self._link_count)
        if member.target:
            self._links += member.target
            self._link_end.append(self._links_length + len(self._links))
            self._link_count += 1
        size = len(member.target) if member.kind == stat.S_IFLNK else payload.size if payload else 0
        rows["size"].append(size)
        rows["shard"].append(shard)
        rows["offset"].append(offset)
        rows["stored"].append(stored)
        rows["checksum"].append(payload.checksum if payload else 0)
        rows["flags"].append(payload.flags if payload else 0)
        if member.sparse is not None:
            self.sparse[self.count] = member.sparse
        self.count += 1
        if len(rows["parent"]) >= FLUSH_ROWS:
            self.flush()

    def add_run(
        self, run: FileRun, shards: np.ndarray, offsets: np.ndarray, stored: np.ndarray, checksums: np.ndarray
    ) -> None:
        """Record a run of regular files, their payloads' places and checksums as columns."""
        count = len(run)
        starts = np.flatnonzero(run.new_folder)
        parents = np.array([self._folder(run.folder(k)) for k in starts.tolist()], dtype=np.int64)
        names, name_ends = run.names()
        values = {
            "parent": parents[np.searchsorted(starts, np.arange(count), side="right") - 1],
            "mode": run.modes | stat.S_IFREG,
            "uid": run.uids,
            "gid": run.gids,
            "size": run.sizes,
            "mtime": run.mtimes_ns,
            "name_end": self._names_length + len(self._names) + name_ends,
            "shard": shards,
            "offset": offsets,
            "stored": stored,
            "checksum": checksums,
            "flags": np.zeros(count),
            "link": np.full(count, self._link_count),
            "source": run.offsets,
            "contiguous": np.ones(count),
        }
        self._names += names
        for name, code in LEDGER_COLUMNS.items():
            self._rows[name].frombytes(np.asarray(values[name], dtype=code).tobytes())
        self.count += count
        self.arrived += count
        if len(self._rows["parent"]) >= FLUSH_ROWS:
            self.flush()

    def admit(self, member: Member, options: PackOptions, summary: PackSummary) -> bool:
        """Move ``member`` where ``--map`` places it, then check it: False for one refused (its
        ``problem``, or a path beyond a symlink), which stops the pack or, with ``--skip-errors``,
        is left out with a warning."""
        if options.path_map is not None and not member.problem:
            options.path_map.place(member)
        if member.kind == stat.S_IFLNK:  # refused or not, nothing lies beyond it
            self.symlinks.add(member.path)
        try:
            if member.problem:
                raise Refused(member.problem)
            self.check_path(member.path)
        except Refused as exc:
            fail_or_skip(str(exc), options, summary, member.path)
            return False
        self.arrived += member.kind != stat.S_IFDIR
        return True

    def check_path(self, path: bytes) -> None:
        """Refuse a member whose path runs through a symlink member (``lnk/passwd``)."""
        if not self.symlinks:
            return
        at = path.find(b"/")
        while at >= 0:
            if path[:at] in self.symlinks:
                raise Refused(f"member {show(path)} lies beyond the symlink {show(path[:at])}")
            at = path.find(b"/", at + 1)

    def _folder(self, path: bytes) -> int:
        """The folder at ``path``, made (with its parents) if no member named it yet."""
        found = self.folder_ids.get(path)
        if found is not None:
            return found
        parent, _, name = path.rpartition(b"/")
        parent_id = self._folder(parent)
        root = self.folders[fmt.ROOT_ROW]
        self.folders.append(Folder(parent_id, name, 0o755, root.uid, root.gid, root.mtime_ns))
        self.folder_ids[path] = len(self.folders) - 1
        return len(self.folders) - 1

    def flush(self) -> None:
        """Append the buffered members to the column files."""
        append_buffers((self.columns[name], values) for name, values in self._rows.items())
        self._names_length += len(self._names)
        self._links_length += len(self._links)
        if max(self._names_length, self._links_length) > fmt.BLOB_MAX:
            raise PackError(
                "the archive's names or link targets take more than 4 GiB, more than one index holds; "
                "split it and pack the parts as separate datasets"
            )
        append_buffers(
            ((self.names, self._names), (self.links, self._links), (self.link_end, self._link_end))
        )

    def name_of(self, members: np.ndarray) -> list[bytes]:
        """The names (last path component) of ``members``."""
        if not len(members):
            return []
        ends = self.columns["name_end"].gather(members)
        starts = self.columns["name_end"].gather(np.maximum(members, 1) - 1)
        starts[members == 0] = 0
        return self.names.slices(starts, ends)

    def targets_of(self, links: np.ndarray) -> list[bytes]:
        """The targets numbered ``links`` (the ``link`` column of symlinks and hard links)."""
        if not len(links):
            return []
        ends = self.link_end.gather(links)
        starts = self.link_end.gather(np.maximum(links, 1) - 1)
        starts[links == 0] = 0
        return self.links.slices(starts, ends)
