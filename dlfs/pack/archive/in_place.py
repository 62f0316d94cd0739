"""``dlfs pack --in-place``: index tar files so that a mount serves every member from the tar itself.

The source is an uncompressed tar, or a folder of them (WebDataset shards), each becoming a folder
named after it (``shard-000.tar`` -> ``shard-000/``). The pass is the archive pass of an ordinary
pack (``source.Archive.record``: the same names, links, duplicates and refusals), but instead of
copying a member's bytes into a shard it checksums them and records where they lie in the tar:
with ``--expand-tars`` a nested tar's members are contiguous bytes of the outer file too. Only the
index is written.

A member's place is (window, offset in it): the windows cut each tar into runs of at most
``WINDOW_MAX`` bytes, a new one starting at the first member that would cross the end, so the
index's 32-bit ``offset`` column addresses tars of any size (``dlfs.core.format``). Each tar's
identity (size, mtime) is recorded; a mount refuses a tar that no longer matches
(``dlfs.core.store.archives``), and a byte changed inside a member fails its checksum.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import xxhash
from tqdm import tqdm

from dlfs.core import format as fmt
from dlfs.core.errors import PackError
from dlfs.pack.archive import members, rows
from dlfs.pack.archive.ledger import Folder, Ledger
from dlfs.pack.archive.members import Member
from dlfs.pack.archive.source import Archive, advance
from dlfs.pack.archive.tarscan import FileRun, HintedReads
from dlfs.pack.columns import Placed
from dlfs.pack.options import PackOptions, PackSummary, progress_bar, show_files
from dlfs.pack.pipeline import Payload
from dlfs.pack.spill import Spill
from dlfs.pack.walk import Tree

#: What to do instead, in every refusal of a source or member that cannot be served in place.
INSTEAD = "pack without --in-place, which copies the bytes into shards"
TAR_SUFFIX = ".tar"
#: Bytes of a member read and hashed at a time.
READ_CHUNK = 1 << 20
#: Most bytes from a window's base to the end of its last member: the 32-bit ``offset`` column's
#: reach.
WINDOW_MAX = fmt.SHARD_MAX


class ArchiveWindows:
    """Where members lie: windows of the tars, numbered in the order members arrive (the shard
    list of the index), and the tars' identities."""

    def __init__(self, dataset_id: str, archives: list[dict[str, Any]]) -> None:
        self.dataset_id = dataset_id
        self.archives = archives
        #: (archive number, base, end) of each window.
        self.windows: list[list[int]] = []

    def place_run(
        self, archive: int, offsets: np.ndarray, sizes: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """``place`` for members in increasing offsets: their windows and offsets in them."""
        last = self.windows[-1] if self.windows else None
        ends = offsets + sizes
        if (
            last is not None
            and last[0] == archive
            and int(offsets[-1]) + max(int(sizes[-1]), 1) - last[1] <= WINDOW_MAX
        ):
            last[2] = max(last[2], int(ends.max()))
            return np.full(len(offsets), len(self.windows) - 1, np.int64), offsets - last[1]
        placed = [
            self.place(archive, offset, size)
            for offset, size in zip(offsets.tolist(), sizes.tolist(), strict=True)
        ]
        return np.array([w for w, _ in placed], np.int64), np.array([o for _, o in placed], np.int64)

    def place(self, archive: int, offset: int, size: int) -> tuple[int, int]:
        """(window, offset in it) of ``size`` bytes at ``offset`` of tar ``archive``; members of a
        tar arrive in increasing offsets."""
        last = self.windows[-1] if self.windows else None
        if last is None or last[0] != archive or offset + max(size, 1) - last[1] > WINDOW_MAX:
            last = [archive, offset, offset]
            self.windows.append(last)
        last[2] = max(last[2], offset + size)
        return len(self.windows) - 1, offset - last[1]

    def finish(self) -> list[tuple[str, int]]:
        """The index's shard list: each window's name and length."""
        return [
            (fmt.window_name(self.dataset_id, k), end - base) for k, (_, base, end) in enumerate(self.windows)
        ]

    def meta(self) -> dict[str, Any]:
        """The index metadata of an in-place dataset (``format._check_windows``)."""
        return {"archives": self.archives, "windows": [[number, base] for number, base, _ in self.windows]}

    def abort(self) -> None:
        """Nothing was written."""


class _Checksums:
    """The in-place pass's ``source.Sink``: each file's checksum and place in its tar."""

    def __init__(
        self,
        ledger: Ledger,
        windows: ArchiveWindows,
        summary: PackSummary,
        archive: Archive,
        number: int,
        bar: tqdm,
        started: float,
    ) -> None:
        self.ledger, self.windows, self.summary = ledger, windows, summary
        assert archive.stream.file is not None  # ``InPlace`` takes tars by path only
        self.tar, self.number = archive.name, number
        self.buffer = memoryview(bytearray(READ_CHUNK))
        #: Every read of member bytes, the scanner's and ``_checksum``'s.
        self.reads = HintedReads(archive.stream.file.fileno())
        self.scanner = archive.scanner(self.reads, held=False)
        self.bar, self.started = bar, started

    def add_run(self, run: FileRun) -> None:
        shards, offsets = self.windows.place_run(self.number, run.offsets, run.sizes)
        self.ledger.add_run(run, shards, offsets, run.sizes, run.checksums)
        size = int(run.sizes.sum())
        self.summary.source_bytes += size
        advance(self.bar, self.ledger, self.started, size, len(run))

    def add_file(self, member: Member, data: BinaryIO) -> None:
        if not member.contiguous:
            raise PackError(
                f"{members.show(member.path)} in {self.tar} is a GNU sparse file, whose bytes do not lie "
                f"in the tar as they read; {INSTEAD}"
            )
        digest = self._checksum(member)
        shard, offset = self.windows.place(self.number, member.offset, member.size)
        payload = Payload(b"", 0, member.size, digest)
        self.ledger.add(member, payload, shard, offset, member.size)
        self.summary.source_bytes += member.size
        advance(self.bar, self.ledger, self.started, member.size)

    def _checksum(self, member: Member) -> int:
        """The checksum of a member's bytes, read from where they lie in the tar (the pass then
        seeks past them: ``streams.Source.skip``), into one reused buffer, hashed without a copy."""
        hasher = xxhash.xxh3_64()
        at, left = member.offset, member.size
        while left:
            view = self.buffer[: min(left, len(self.buffer))]
            got = self.reads.read_at(view, at)
            if got == 0:
                raise PackError(
                    f"{self.tar} is cut short inside {members.show(member.path)}; download it again"
                )
            hasher.update(view[:got])
            at += got
            left -= got
        return hasher.intdigest()

    def add(self, member: Member, data: bytes | None) -> None:
        self.ledger.add(member)

    def finish_pending(self) -> None:
        """Every member is recorded as it arrives."""


class InPlace:
    """The tars of an in-place pack; ``pack`` indexes them one after another, each in one pass
    with only its own file open (a folder of WebDataset shards may hold thousands)."""

    def __init__(self, source: str) -> None:
        path = Path(source)
        self.name = source
        self.folder = path.is_dir()
        self.kind = "tar folder" if self.folder else "tar"
        self.tars = _tars_in(path) if self.folder else [source]
        #: What the index records of each tar, as each is opened (``ArchiveWindows.meta``).
        self.identities: list[dict[str, Any]] = []
        if self.folder:
            st = path.stat()
            self.root = Folder(
                fmt.ROOT_ROW, b"", stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns
            )
        else:
            first = self._open(source)
            self.root = first.root
            first.close()

    def _open(self, tar: str) -> Archive:
        """The tar opened, or a one-line refusal of what cannot be served in place."""
        archive = Archive(tar, read_ahead=False)
        problem = ""
        if archive.kind != "tar":
            problem = f"{archive.name} is a {archive.kind}, whose members cannot be read in place"
        elif archive.stream.file is None:
            problem = f"{archive.name} is not a file that a mount could read members from"
        if problem:
            archive.close()
            raise PackError(f"{problem}; {INSTEAD}")
        return archive

    def windows(self, dataset_id: str) -> ArchiveWindows:
        return ArchiveWindows(dataset_id, self.identities)

    def pack(
        self, windows: ArchiveWindows, spill: Spill, options: PackOptions, summary: PackSummary
    ) -> tuple[Tree, Placed]:
        """Record every member of every tar, and where its bytes lie; the tree and placements."""
        ledger = Ledger(spill, self.root)
        summary.archives = len(self.tars)
        started = time.monotonic()
        with progress_bar(options) as bar:
            for number, tar in enumerate(self.tars):
                archive = self._open(tar)
                try:
                    self._index(archive, number, ledger, windows, options, summary, (bar, started))
                finally:
                    archive.close()
            show_files(bar, len(ledger), started)  # the bar's last line counts every member
        return rows.build(ledger, spill, options, summary)

    def _index(
        self,
        archive: Archive,
        number: int,
        ledger: Ledger,
        windows: ArchiveWindows,
        options: PackOptions,
        summary: PackSummary,
        progress: tuple[tqdm, float],
    ) -> None:
        """Record one tar's members and identity (``progress``: the bar, and when the pass
        began); refuse a tar that changed while it was read, which every mount would refuse."""
        assert archive.stream.file is not None
        before = os.fstat(archive.stream.file.fileno())
        self.identities.append(
            {"path": os.path.abspath(archive.name), "size": before.st_size, "mtime_ns": before.st_mtime_ns}
        )
        prefix = b""
        if self.folder:  # the tar becomes a folder, as a nested one does with --expand-tars
            prefix = os.fsencode(Path(archive.name).name)[: -len(TAR_SUFFIX)]
            tar = Member(
                prefix, stat.S_IFREG, before.st_mode, before.st_uid, before.st_gid, before.st_mtime_ns
            )
            ledger.folder(members.folder_of(tar, prefix))
        sink = _Checksums(ledger, windows, summary, archive, number, *progress)
        archive.record(ledger, sink, options, summary, prefix)
        after = os.fstat(archive.stream.file.fileno())
        if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
            raise PackError(f"{archive.name} changed while it was indexed; pack it again once it is complete")

    def close(self) -> None:
        """Nothing is held open between tars."""


def _tars_in(folder: Path) -> list[str]:
    """The ``.tar`` files of a folder of WebDataset shards, by name; anything else is refused."""
    found = sorted(os.scandir(folder), key=lambda entry: os.fsencode(entry.name))
    for entry in found:
        if not (members.expanded_folder(os.fsencode(entry.name)) and entry.is_file()):
            raise PackError(
                f"{folder} holds {entry.name}, which is not a .tar file; --in-place takes a tar or a folder "
                "of .tar files (WebDataset shards)"
            )
    if not found:
        raise PackError(f"{folder} holds no .tar files; --in-place takes a tar or a folder of them")
    return [entry.path for entry in found]
