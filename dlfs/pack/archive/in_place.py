"""``dlfs pack --in-place``: index tar files so that a mount serves every member from the tar itself.

The source is an uncompressed tar, or a folder of them (WebDataset shards), each becoming a folder
named after it (``shard-000.tar`` -> ``shard-000/``): local files, or objects in S3
(``s3://bucket/key.tar``, ``s3://bucket/prefix/``), read where their bytes lie (``positional``).
The pass is the archive pass of an ordinary pack (``archive_source.ArchiveSource.record``: the
same names, links, duplicates and refusals), but instead of copying a member's bytes into a
shard it checksums them and records where they lie in the tar: with ``--expand-tars`` a nested
tar's members are contiguous bytes of the outer file too. Only the index is written.

A member's place is (shard, offset in it): the shards cut each tar into runs of at most
``IN_PLACE_SHARD_MAX`` bytes, a new one starting at the first member that would cross the end, so the
index's 32-bit ``offset`` column addresses tars of any size (``dlfs.core.format``). Each tar's
identity (path, size, mtime; an object's URL, size, ETag) is recorded; a mount refuses a tar that no
longer matches (``dlfs.core.store.archives``, ``dlfs.core.store.s3.archives``), and a byte changed
inside a member fails its checksum.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, cast

import numpy as np
import xxhash
from tqdm import tqdm

from dlfs.core import format as fmt
from dlfs.core.errors import PackError
from dlfs.core.store import Store, StoreOptions
from dlfs.core.store.s3.location import Location, is_s3
from dlfs.core.store.s3.store import S3Store
from dlfs.pack.archive import members, rows
from dlfs.pack.archive.archive_source import ArchiveSource, advance
from dlfs.pack.archive.ledger import Folder, Ledger
from dlfs.pack.archive.members import Member
from dlfs.pack.archive.positional import LocalTar, Positional, S3Tar
from dlfs.pack.archive.tarscan import FileRun, TarScanner
from dlfs.pack.columns import Placed
from dlfs.pack.options import PackOptions, PackSummary, progress_bar, show_files
from dlfs.pack.pipeline import Payload
from dlfs.pack.spill import Spill
from dlfs.pack.walk import Tree

if TYPE_CHECKING:
    from dlfs.pack.source import Pools

#: What to do instead, in every refusal of a source or member that cannot be served in place.
INSTEAD = "pack without --in-place, which copies the bytes into shards"
TAR_SUFFIX = ".tar"
#: Most bytes from a shard's base to the end of its last member: the 32-bit ``offset`` column's
#: reach.
IN_PLACE_SHARD_MAX = fmt.SHARD_MAX


class TarShards:
    """Where members lie: the shards cut from the tars, numbered in the order members arrive (the shard
    list of the index), and the tars' identities."""

    def __init__(self, dataset_id: str, archives: list[dict[str, Any]]) -> None:
        self.dataset_id = dataset_id
        self.archives = archives
        #: (archive number, base, end) of each shard.
        self.places: list[list[int]] = []

    def place_run(
        self, archive: int, offsets: np.ndarray, sizes: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """``place`` for members in increasing offsets: their shards and offsets in them."""
        last = self.places[-1] if self.places else None
        ends = offsets + sizes
        if (
            last is not None
            and last[0] == archive
            and int(offsets[-1]) + max(int(sizes[-1]), 1) - last[1] <= IN_PLACE_SHARD_MAX
        ):
            last[2] = max(last[2], int(ends.max()))
            return np.full(len(offsets), len(self.places) - 1, np.int64), offsets - last[1]
        placed = [
            self.place(archive, offset, size)
            for offset, size in zip(offsets.tolist(), sizes.tolist(), strict=True)
        ]
        return np.array([w for w, _ in placed], np.int64), np.array([o for _, o in placed], np.int64)

    def place(self, archive: int, offset: int, size: int) -> tuple[int, int]:
        """(shard, offset in it) of ``size`` bytes at ``offset`` of tar ``archive``; members of a
        tar arrive in increasing offsets."""
        last = self.places[-1] if self.places else None
        if last is None or last[0] != archive or offset + max(size, 1) - last[1] > IN_PLACE_SHARD_MAX:
            last = [archive, offset, offset]
            self.places.append(last)
        last[2] = max(last[2], offset + size)
        return len(self.places) - 1, offset - last[1]

    def finish(self) -> list[tuple[str, int]]:
        """The index's shard list: each shard's name and length."""
        return [
            (fmt.in_place_shard_name(self.dataset_id, k), end - base)
            for k, (_, base, end) in enumerate(self.places)
        ]

    def meta(self) -> dict[str, Any]:
        """What the index records of the tars and where in them the shards lie (the loader checks
        it: ``archive_meta.problem``)."""
        return {"archives": self.archives, "windows": [[number, base] for number, base, _ in self.places]}

    def abort(self) -> None:
        """Nothing was written."""


class _Checksums:
    """The in-place pass's ``archive_source.Sink``: each file's checksum and place in its tar."""

    def __init__(
        self,
        ledger: Ledger,
        shards: TarShards,
        summary: PackSummary,
        tar: Positional,
        number: int,
        scanner: TarScanner | None,
        bar: tqdm,
        started: float,
    ) -> None:
        self.ledger, self.shards, self.summary = ledger, shards, summary
        self.tar, self.number, self.scanner = tar, number, scanner
        self.bar, self.started = bar, started

    def add_run(self, run: FileRun) -> None:
        shards, offsets = self.shards.place_run(self.number, run.offsets, run.sizes)
        self.ledger.add_run(run, shards, offsets, run.sizes, run.checksums)
        size = int(run.sizes.sum())
        self.summary.source_bytes += size
        advance(self.bar, self.ledger, self.started, size, len(run))

    def add_file(self, member: Member, data: BinaryIO) -> None:
        if not member.contiguous:
            raise PackError(
                f"{members.show(member.path)} in {self.tar.name} is compressed, so its bytes do not lie "
                f"in the archive as they read; {INSTEAD}"
            )
        digest = self._checksum(member)
        shard, offset = self.shards.place(self.number, member.offset, member.stored)
        payload = Payload(b"", 0 if member.sparse is None else fmt.FLAG_SPARSE, member.size, digest)
        self.ledger.add(member, payload, shard, offset, member.stored)
        self.summary.source_bytes += member.size
        advance(self.bar, self.ledger, self.started, member.size)

    def _checksum(self, member: Member) -> int:
        """The checksum of a member's stored bytes (a sparse file's runs), read from where they lie
        in the tar (the pass then seeks past them: ``streams.Buffered.skip``), hashed without a copy."""
        hasher = xxhash.xxh3_64()
        got = 0
        for piece in self.tar.pieces(member.offset, member.stored):
            hasher.update(piece)
            got += len(piece)
        if got < member.stored:
            raise PackError(
                f"{self.tar.name} is cut short inside {members.show(member.path)}; download it again"
            )
        return hasher.intdigest()

    def add(self, member: Member, data: bytes | None) -> None:
        self.ledger.add(member)

    def finish_pending(self) -> None:
        """Every member is recorded as it arrives."""


class InPlaceSource:
    """The tars of an in-place pack; ``pack`` indexes them one after another, each in one pass
    with only its own file open (a folder of WebDataset shards may hold thousands)."""

    def __init__(self, source: str, options: StoreOptions | None = None) -> None:
        """``source``: a tar or a folder of them, local or in S3 (``options``: how to reach it)."""
        self.name = source
        #: The S3 folder the tars are objects of (their names are keys below it), or None.
        self.bucket: S3Store | None = None
        if is_s3(source):
            self.bucket, single = _s3_source(source, options)
            self.of_tars = single is None
            self.tars = _objects_in(self.bucket) if single is None else [single]
        else:
            self.of_tars = Path(source).is_dir()
            self.tars = _tars_in(Path(source)) if self.of_tars else [source]
        self.kind = "tar folder" if self.of_tars else "tar"
        #: A local folder the destination must not lie inside: none (``source.Source``).
        self.local_folder = None
        #: What the index records of each tar, as each is opened (``TarShards.meta``).
        self.identities: list[dict[str, Any]] = []
        if self.of_tars and self.bucket is None:
            st = Path(source).stat()
            self.root = Folder(
                fmt.ROOT_ROW, b"", stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns
            )
        elif self.of_tars:
            self.root = Folder(fmt.ROOT_ROW, b"", 0o755, os.geteuid(), os.getegid(), time.time_ns())
        else:
            archive, tar = self._open(self.tars[0])
            try:
                _, uid, gid, mtime_ns = tar.owner()
            finally:
                tar.close()
                archive.close()
            self.root = Folder(fmt.ROOT_ROW, b"", 0o755, uid, gid, mtime_ns)

    def _open(self, tar: str) -> tuple[ArchiveSource, Positional]:
        """The tar opened, and read where its bytes lie; or a one-line refusal of what cannot be
        served in place."""
        positional: Positional | None = None
        if self.bucket is not None:
            positional = S3Tar(self.bucket, tar)
            archive = ArchiveSource(positional.name, prefetch=False, opened=cast(BinaryIO, positional))
        else:
            archive = ArchiveSource(tar, prefetch=False)
            if archive.stream.file is not None:
                positional = LocalTar(archive.name, archive.stream.file.fileno())
        problem = ""
        if archive.kind != "tar":
            problem = f"{archive.name} is a {archive.kind}, whose members cannot be read in place"
        elif positional is None:
            problem = f"{archive.name} is not a file that a mount could read members from"
        if problem:
            archive.close()
            raise PackError(f"{problem}; {INSTEAD}")
        assert positional is not None
        return archive, positional

    def shards(self, store: Store, dataset_id: str, options: PackOptions) -> TarShards:
        """The shards the tars' bytes lie in: nothing is written but the index."""
        return TarShards(dataset_id, self.identities)

    def pack(
        self, shards: TarShards, spill: Spill, options: PackOptions, summary: PackSummary, pools: Pools
    ) -> tuple[Tree, Placed]:
        """Record every member of every tar, and where its bytes lie; the tree and placements.
        Every tar is read on this thread: ``pools`` does not serve."""
        ledger = Ledger(spill, self.root)
        summary.archives = len(self.tars)
        started = time.monotonic()
        with progress_bar(options) as bar:
            for number, name in enumerate(self.tars):
                archive, tar = self._open(name)
                try:
                    self._index(archive, tar, number, ledger, shards, options, summary, (bar, started))
                finally:
                    tar.close()
                    archive.close()
            show_files(bar, len(ledger), started)  # the bar's last line counts every member
        return rows.build(ledger, spill, options, summary)

    def _index(
        self,
        archive: ArchiveSource,
        tar: Positional,
        number: int,
        ledger: Ledger,
        shards: TarShards,
        options: PackOptions,
        summary: PackSummary,
        progress: tuple[tqdm, float],
    ) -> None:
        """Record one tar's members and identity (``progress``: the bar, and when the pass
        began); refuse a tar that changed while it was read, which every mount would refuse."""
        before = tar.identity()
        self.identities.append(before)
        prefix = b""
        if self.of_tars:  # the tar becomes a folder, as a nested one does with --expand-tars
            prefix = os.fsencode(Path(archive.name).name)[: -len(TAR_SUFFIX)]
            ledger.folder(members.folder_of(Member(prefix, stat.S_IFREG, *tar.owner()), prefix))
        scanner = archive.scanner(tar.read_into, False, options) if isinstance(tar, LocalTar) else None
        sink = _Checksums(ledger, shards, summary, tar, number, scanner, *progress)
        archive.record(ledger, sink, options, summary, prefix)
        if tar.identity() != before:
            raise PackError(f"{archive.name} changed while it was indexed; pack it again once it is complete")

    def close(self) -> None:
        """Nothing is held open between tars but the S3 client."""
        if self.bucket is not None:
            self.bucket.close()


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


def _s3_source(source: str, options: StoreOptions | None) -> tuple[S3Store, str | None]:
    """The S3 folder of an ``s3://`` source and, where the source names one object, its key
    below it (None: the source is a prefix of objects, named with or without a trailing slash)."""
    location = Location.parse(source)
    if location.prefix and not source.endswith("/"):
        parent, _, key = f"{location.bucket}/{location.prefix}".rpartition("/")
        store = S3Store(f"s3://{parent}", options)
        try:
            if store.head(key) is not None:
                return store, key
        except BaseException:
            store.close()
            raise
        store.close()
    return S3Store(str(location), options), None


def _objects_in(folder: S3Store) -> list[str]:
    """The ``.tar`` objects directly below an S3 prefix of WebDataset shards, by key; anything
    else is refused, as in a local folder."""
    found = sorted((stored.key for stored in folder.objects()), key=os.fsencode)
    for key in found:
        if "/" in key or not members.expanded_folder(os.fsencode(key)):
            raise PackError(
                f"{folder.url}/ holds {key}, which is not a .tar object; --in-place takes a tar or a prefix "
                "of .tar objects (WebDataset shards)"
            )
    if not found:
        raise PackError(f"{folder.url}/ holds no .tar objects; --in-place takes a tar or a prefix of them")
    return found
