"""An archive as a pack source: one sequential pass that writes every member's bytes into the
shards as it arrives, then the index's rows sorted out of what it recorded.

Members are read on the calling thread (``tar``, ``zip``); their bytes are checksummed, and with
``--compress`` or ``--transform`` encoded, by the pool in batches, the results written in arrival
order by ``InOrderShards`` and recorded in the ``Ledger``. A member larger than
``fmt.WHOLE_PAYLOAD_LIMIT`` is streamed into its shard chunk by chunk. At most
``pipeline.MAX_INFLIGHT_BYTES`` of members are held at once.
"""

from __future__ import annotations

import os
import stat
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Executor, Future
from typing import TYPE_CHECKING, BinaryIO, Protocol

import numpy as np
import xxhash
from tqdm import tqdm

from dlfs.core import format as fmt
from dlfs.core.errors import DlfsError, InternalError
from dlfs.core.store import Store
from dlfs.pack.archive import members, rows
from dlfs.pack.archive.ledger import Folder, Ledger
from dlfs.pack.archive.members import Member, Refused
from dlfs.pack.archive.positional import LocalTar
from dlfs.pack.archive.streams import ArchiveStream, checked_read, reading
from dlfs.pack.archive.tar import tar_members
from dlfs.pack.archive.tarscan import FileRun, ReadAt, TarScanner
from dlfs.pack.archive.zip import zip_members
from dlfs.pack.columns import Placed
from dlfs.pack.options import PROGRESS_EVERY, PackOptions, PackSummary, fail_or_skip, progress_bar, show_files
from dlfs.pack.pipeline import (
    BATCH_BYTES,
    BATCH_FILES,
    MAX_INFLIGHT_BYTES,
    STREAM_CHUNK,
    Payload,
    encode,
    sparse_payload,
)
from dlfs.pack.spill import Spill
from dlfs.pack.transform import Transform
from dlfs.pack.walk import Tree
from dlfs.pack.writers import InOrderShards

if TYPE_CHECKING:
    from dlfs.pack.source import Pools

#: A member with its bytes (None: a folder, symlink or hard link), as a batch hands it to the pool.
Item = tuple[Member, bytes | None]
#: What a pool task encodes of a member: its bytes (None: nothing to store), and a sparse file's
#: size (None for any other file).
Encoding = tuple[bytes | None, int | None]


def _encode_batch(items: list[Encoding], compress: bool, transform: Transform | None) -> list[Payload | None]:
    """Encode a batch of members' bytes in one pool task (in a worker process with a transform); a
    sparse file's runs are stored as they are."""
    return [
        None
        if data is None
        else encode(data, compress, transform)
        if size is None
        else sparse_payload(data, size)
        for data, size in items
    ]


def advance(bar: tqdm | None, ledger: Ledger, started: float, size: int, count: int = 1) -> None:
    """``count`` more members of ``size`` bytes recorded: the bar, and now and then its files/s."""
    if bar is None:
        return
    bar.update(size)
    if len(ledger) // PROGRESS_EVERY != (len(ledger) - count) // PROGRESS_EVERY:
        show_files(bar, len(ledger), started)


def scans(source: str, options: PackOptions) -> bool:
    """Whether a pack of ``source`` copies runs of plain tar members from its file as the C loop
    takes them (``ArchiveSource.scanner``): members stored as they are, the source a regular file (not
    standard input, nor a pipe such as ``<(curl ...)``). Such a pack reads the tar where its
    members lie, without ``Prefetch``."""
    plain = not options.compress and options.transform is None and options.path_map is None
    return plain and source != "-" and os.path.isfile(source) and TarScanner.available()


class Sink(Protocol):
    """Where ``ArchiveSource.record`` hands members that are not folders: a writer into shards, or the
    in-place pass's checksummer (``in_place``)."""

    #: Takes runs of plain members from the tar's file (``add_run``); None: every member one by one.
    scanner: TarScanner | None

    def add_run(self, run: FileRun) -> None:
        """Regular files taken by the scanner, their bytes in ``run.buffer``."""

    def add_file(self, member: Member, data: BinaryIO) -> None:
        """A regular file, its bytes in ``data``, to read now or leave unread (the pass then
        skips them)."""

    def add(self, member: Member, data: bytes | None) -> None:
        """A symlink or hard link (``data`` None)."""

    def finish_pending(self) -> None:
        """Every member handed over is recorded in the ledger."""


class ArchiveSource:
    """An archive source, opened: its kind is known and its stream is at its first byte."""

    def __init__(self, source: str, prefetch: bool = True, opened: BinaryIO | None = None) -> None:
        """``prefetch``, ``opened``: see ``ArchiveStream``."""
        self.stream = ArchiveStream(source, prefetch, opened)
        self.kind = self.stream.kind
        self.name = self.stream.name
        if self.stream.file is not None:
            st = os.fstat(self.stream.file.fileno())
            uid, gid, mtime_ns = st.st_uid, st.st_gid, st.st_mtime_ns
        else:
            uid, gid, mtime_ns = os.geteuid(), os.getegid(), time.time_ns()
        #: The tree's root, and every folder no member names: as ``tar x`` makes a missing one.
        self.root = Folder(fmt.ROOT_ROW, b"", 0o755, uid, gid, mtime_ns)

    def close(self) -> None:
        self.stream.close()

    def scanner(self, read_at: ReadAt, held: bool, options: PackOptions) -> TarScanner | None:
        """The C loop over runs of plain members, reading through ``read_at`` (``held``: see
        ``TarScanner``): for a plain tar read from its file without ``Prefetch``, where the
        library is built, and no ``--map`` moves members (``Ledger.admit`` moves them one by one)."""
        if self.kind != "tar" or self.stream.file is None or self.stream.ahead is not None:
            return None
        if options.path_map is not None or not TarScanner.available():
            return None
        return TarScanner(read_at, checksum=True, held=held)

    def _members(
        self, options: PackOptions, prefix: bytes, scanner: TarScanner | None
    ) -> Iterator[tuple[Member, BinaryIO | None] | FileRun]:
        if self.kind == "zip":
            assert self.stream.file is not None
            return zip_members(self.stream.file, self.name, self.root.uid, self.root.gid, options.expand_tars)
        end = os.fstat(self.stream.file.fileno()).st_size if scanner and self.stream.file else 0
        return tar_members(
            self.stream.stream, self.name, options.expand_tars, prefix, scanner=scanner, end=end
        )

    #: A local folder the destination must not lie inside: none (``source.Source``).
    local_folder = None

    def shards(self, store: Store, dataset_id: str, options: PackOptions) -> InOrderShards:
        """Shards written in arrival order."""
        return InOrderShards(store, dataset_id, options.shard_size)

    def pack(
        self, shards: InOrderShards, spill: Spill, options: PackOptions, summary: PackSummary, pools: Pools
    ) -> tuple[Tree, Placed]:
        """Write every member into ``shards``; the tree and placements for the index."""
        if self.stream.file is None or not scans(self.name, options):
            return write_members(self, shards, spill, options, summary, pools.encoders)
        tar = LocalTar(self.name, self.stream.file.fileno())
        try:
            scanner = self.scanner(tar.read_into, True, options)
            return write_members(self, shards, spill, options, summary, pools.encoders, scanner)
        finally:
            tar.close()

    def record(
        self, ledger: Ledger, sink: Sink, options: PackOptions, summary: PackSummary, prefix: bytes = b""
    ) -> None:
        """Read every member, in one pass, into ``ledger`` (folders) and ``sink`` (the rest), its
        path under ``prefix`` (a tar's)."""
        try:
            self._record(ledger, sink, options, summary, prefix)
        finally:
            if sink.scanner is not None:
                sink.scanner.close()

    def _record(
        self, ledger: Ledger, sink: Sink, options: PackOptions, summary: PackSummary, prefix: bytes
    ) -> None:
        """``record``'s pass; a failure that is neither the archive's nor the user's is a bug,
        reported with where in the archive it happened."""
        iterator = self._members(options, prefix, sink.scanner)
        at = 0
        try:
            while True:
                with reading(self.name, self.kind):
                    item = next(iterator, None)
                if item is None:
                    break
                if isinstance(item, FileRun):
                    at = int(item.offsets[0])
                    run = _beside_symlinks(item, ledger, options, summary)
                    if len(run):
                        sink.add_run(run)
                    continue
                at = item[0].offset
                record_member(ledger, sink, *item, options, summary)
            sink.finish_pending()
            with reading(self.name, self.kind):
                self.stream.drain()
        except (DlfsError, InternalError):
            raise
        except Exception as exc:
            raise InternalError(f"internal error while reading {self.name} near offset {at:,}") from exc


def _beside_symlinks(run: FileRun, ledger: Ledger, options: PackOptions, summary: PackSummary) -> FileRun:
    """The run without its members that lie beyond a symlink member (``Ledger.check_path``)."""
    if not ledger.symlinks:
        return run
    keep = np.ones(len(run), dtype=bool)
    for k in range(len(run)):
        try:
            ledger.check_path(run.path(k))
        except Refused as exc:
            fail_or_skip(str(exc), options, summary, run.path(k))
            keep[k] = False
    return run if keep.all() else run.select(keep)


class OnePassSource(Protocol):
    """A source whose members come in one pass (an ``ArchiveSource``, ``objects.ObjectSource``)."""

    name: str
    kind: str
    #: The tree's root, and every folder no member names.
    root: Folder

    def record(self, ledger: Ledger, sink: Sink, options: PackOptions, summary: PackSummary) -> None:
        """Hand every member to ``record_member``, then have ``sink`` finish."""


def write_members(
    source: OnePassSource,
    shards: InOrderShards,
    spill: Spill,
    options: PackOptions,
    summary: PackSummary,
    pool: Executor,
    scanner: TarScanner | None = None,
) -> tuple[Tree, Placed]:
    """Write every member of ``source`` into ``shards`` as it comes (runs of plain tar members
    through ``scanner``); the tree and placements for the index."""
    ledger = Ledger(spill, source.root)
    writer = _Writer(source.name, source.kind, pool, shards, ledger, options, summary)
    writer.scanner = scanner
    with progress_bar(options) as bar:
        writer.bar = bar
        source.record(ledger, writer, options, summary)
        show_files(bar, len(ledger), writer.started)  # the bar's last line counts every member
    return rows.build(ledger, spill, options, summary)


def record_member(
    ledger: Ledger,
    sink: Sink,
    member: Member,
    data: BinaryIO | None,
    options: PackOptions,
    summary: PackSummary,
) -> None:
    """One member into ``ledger`` (a folder) or ``sink`` (the rest), unless a rule refuses it."""
    if not ledger.admit(member, options, summary):
        return
    if member.kind == stat.S_IFDIR:
        ledger.folder(member)
    elif member.kind == stat.S_IFREG:
        assert data is not None
        sink.add_file(member, data)
    else:
        sink.add(member, None)


class _Writer:
    """Members in arrival order: batched to the pool for their payloads, then written and recorded
    in the same order."""

    scanner: TarScanner | None = None

    def __init__(
        self,
        name: str,
        kind: str,
        pool: Executor,
        shards: InOrderShards,
        ledger: Ledger,
        options: PackOptions,
        summary: PackSummary,
    ) -> None:
        #: The archive's name and kind, for messages about reading it.
        self.name, self.kind = name, kind
        self.pool, self.shards, self.ledger = pool, shards, ledger
        self.options, self.summary = options, summary
        self.batch: list[Item] = []
        self.batch_bytes = 0
        self.in_flight: deque[tuple[list[Member], Future[list[Payload | None]], int]] = deque()
        self.inflight = 0
        self.bar: tqdm | None = None
        self.started = time.monotonic()

    def add_file(self, member: Member, data: BinaryIO) -> None:
        self.summary.source_bytes += member.size
        if member.stored > fmt.WHOLE_PAYLOAD_LIMIT:
            self.finish_pending()
            self._stream(member, data)
            return
        with reading(self.name, self.kind):
            content = checked_read(data, member.stored, members.show(member.path), self.name)
        self.add(member, content)

    def add(self, member: Member, data: bytes | None) -> None:
        self.batch.append((member, data))
        self.batch_bytes += len(data) if data else 0
        if len(self.batch) >= BATCH_FILES or self.batch_bytes >= BATCH_BYTES:
            self._submit()

    def _submit(self) -> None:
        if not self.batch:
            return
        items, self.batch = self.batch, []
        encodings = [(data, None if member.sparse is None else member.size) for member, data in items]
        future = self.pool.submit(_encode_batch, encodings, self.options.compress, self.options.transform)
        self.in_flight.append(([member for member, _ in items], future, self.batch_bytes))
        self.inflight += self.batch_bytes
        self.batch_bytes = 0
        while self.in_flight and (
            len(self.in_flight) > 2 * self.options.threads or self.inflight > MAX_INFLIGHT_BYTES
        ):
            self._drain_one()

    def finish_pending(self) -> None:
        """Write and record every member handed over so far."""
        self._submit()
        while self.in_flight:
            self._drain_one()

    def add_run(self, run: FileRun) -> None:
        """Write the run's members from the scanner's buffer (which the shard writer may hold on
        to: the scanner reads on into a new one), after every member handed over before them."""
        self.finish_pending()
        shards, offsets = np.empty(len(run), np.int64), np.empty(len(run), np.int64)
        sizes = run.sizes.tolist()
        for k, (at, size) in enumerate(zip((run.offsets - run.buffer_start).tolist(), sizes, strict=True)):
            shards[k], offsets[k] = self.shards.place(size)
            self.shards.write(run.buffer[at : at + size])
        self.ledger.add_run(run, shards, offsets, run.sizes, run.checksums)
        size = sum(sizes)
        self.summary.source_bytes += size
        advance(self.bar, self.ledger, self.started, size, len(run))

    def _drain_one(self) -> None:
        batch, future, charged = self.in_flight.popleft()
        self.inflight -= charged
        for member, payload in zip(batch, future.result(), strict=True):
            if payload is None:
                self.ledger.add(member)
                continue
            shard, offset = self.shards.place(len(payload.stored))
            self.shards.write(payload.stored)
            self._record(member, payload, shard, offset, len(payload.stored))

    def _stream(self, member: Member, data: BinaryIO) -> None:
        """Copy a large member into its shard chunk by chunk, hashing as it goes."""
        shard, offset = self.shards.place(member.stored)
        hasher = xxhash.xxh3_64()
        left = member.stored
        while left:
            with reading(self.name, self.kind):
                chunk = data.read(min(left, STREAM_CHUNK))
                if not chunk:
                    raise EOFError(f"member {members.show(member.path)} is cut short")
            hasher.update(chunk)
            self.shards.write(chunk)
            left -= len(chunk)
        flags = 0 if member.sparse is None else fmt.FLAG_SPARSE
        payload = Payload(b"", flags, member.size, hasher.intdigest())
        self._record(member, payload, shard, offset, member.stored)

    def _record(self, member: Member, payload: Payload, shard: int, offset: int, stored: int) -> None:
        self.ledger.add(member, payload, shard, offset, stored)
        self.summary.compressed_files += bool(payload.flags & fmt.FLAG_LZ4)
        if self.options.transform is not None:
            if payload.kept is None:
                self.summary.transformed_files += 1
            else:
                kept = self.summary.kept_files
                kept[payload.kept.value] = kept.get(payload.kept.value, 0) + 1
        advance(self.bar, self.ledger, self.started, payload.size)
