"""An S3 prefix of objects, one per file, as a pack source (``dlfs pack s3://BUCKET/PREFIX/ DST``).

The listing (``S3Store.objects``) comes in key order, as an archive's members come in archive
order, so the archive pass writes it (``archive.archive_source.write_members``): each object's bytes go into
the shards as they arrive, and the index's rows are sorted out of the ledger at the end. A thread
of its own lists the objects and keeps ``--threads`` GETs in flight, in listing order, while the
pass writes, holding at most FETCH_BYTES fetched or being fetched (``_InFlight``). An object larger
than ``fmt.WHOLE_PAYLOAD_LIMIT`` is never held whole: it is fetched in ranged GETs of STREAM_CHUNK,
RANGES_AHEAD of them ahead of the writer, which streams it into its shard. Every GET names the
entity tag the listing gave (``If-Match``): an object written again after the listing stops the
pack in one line, so no file mixes the bytes of two versions.

Keys are untrusted, like archive member names, and pass the same rules (``archive.members``). Two
more: a key that is not already a normal path (an empty or ``.`` component: two keys could name
one file) and a key with a control character (which the S3 client cannot fetch) are refused. A
zero-byte key ending in ``/`` (the folder marker a console makes) is a folder. Files are 0644 and
folders 0755, owned by the user who packs, each object's LastModified its mtime.
"""

from __future__ import annotations

import io
import os
import re
import stat
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextlib import closing
from dataclasses import replace
from typing import TYPE_CHECKING, BinaryIO, cast

from dlfs.core import format as fmt
from dlfs.core.errors import PackError
from dlfs.core.store import Store
from dlfs.core.store.s3.store import ObjectChanged, S3Store, StoredObject
from dlfs.pack.archive.archive_source import Sink, record_member, write_members
from dlfs.pack.archive.ledger import Folder, Ledger
from dlfs.pack.archive.members import Member, Refused, normalize, show
from dlfs.pack.columns import Placed
from dlfs.pack.interruption import block_in_thread
from dlfs.pack.options import DEFAULT_THREADS as DEFAULT_PACK_THREADS
from dlfs.pack.options import PackOptions, PackSummary
from dlfs.pack.pipeline import MAX_INFLIGHT_BYTES, STREAM_CHUNK
from dlfs.pack.spill import Spill
from dlfs.pack.walk import Tree
from dlfs.pack.writers import InOrderShards

if TYPE_CHECKING:
    from dlfs.pack.source import Pools

#: GETs in flight where ``--threads`` is not given. A GET waits on the network, not on a core, so
#: many overlap well on any machine; docs/design.md has the measurement behind the figure.
DEFAULT_THREADS = 64
#: Bytes of fetched objects held ahead of the writer (which holds up to MAX_INFLIGHT_BYTES of its
#: own): many times what a 10 Gbit/s link carries in a 10 ms round trip.
FETCH_BYTES = MAX_INFLIGHT_BYTES // 4
#: Members listed ahead of the pass at most (each a few hundred bytes).
MEMBERS_AHEAD = 1 << 14
#: Ranged GETs of one large object in flight ahead of the writer.
RANGES_AHEAD = 4
#: What the source is called in messages and in the index's build record.
KIND = "s3 objects"
#: ASCII control characters: the S3 client refuses a key with one.
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
FILE_MODE, FOLDER_MODE = 0o644, 0o755


class ObjectSource:
    """The objects below an ``s3://`` prefix, packed as the files of a tree."""

    def __init__(self, url: str, options: PackOptions) -> None:
        self.store = S3Store(url, options.store)
        #: GETs in flight.
        self.threads = options.threads
        self.name = self.store.url
        self.kind = KIND
        #: The tree's root, and every folder no marker names.
        self.root = Folder(fmt.ROOT_ROW, b"", FOLDER_MODE, os.geteuid(), os.getegid(), time.time_ns())

    #: A local folder the destination must not lie inside: none (``source.Source``).
    local_folder = None

    def close(self) -> None:
        self.store.close()

    def shards(self, store: Store, dataset_id: str, options: PackOptions) -> InOrderShards:
        """Shards written in listing order."""
        return InOrderShards(store, dataset_id, options.shard_size)

    def pack(
        self, shards: InOrderShards, spill: Spill, options: PackOptions, summary: PackSummary, pools: Pools
    ) -> tuple[Tree, Placed]:
        """Write every object into ``shards``; the tree and placements for the index. The writer's
        checksums are CPU work: its batches in flight follow the cores, not the GETs."""
        writing = replace(options, threads=min(options.threads, DEFAULT_PACK_THREADS))
        return write_members(self, shards, spill, writing, summary, pools.encoders)

    def record(self, ledger: Ledger, sink: Sink, options: PackOptions, summary: PackSummary) -> None:
        """Fetch every object, ``readers`` at once, and hand each to ``record_member`` in listing
        order."""
        gets = ThreadPoolExecutor(self.threads, thread_name_prefix="dlfs-get", initializer=block_in_thread)
        try:
            with closing(self._fetched(gets, self.threads)) as fetched:  # its lister stops first
                for member, data in fetched:
                    record_member(ledger, sink, member, data, options, summary)
            sink.finish_pending()
        except ObjectChanged as exc:
            raise PackError(f"{exc.url} changed while it was packed; re-run dlfs pack") from None
        finally:
            gets.shutdown(wait=True, cancel_futures=True)

    def _members(self) -> Iterator[tuple[Member, StoredObject]]:
        """Each listed object as a member; one line for a prefix that holds none."""
        listed = False
        for stored in self.store.objects():
            listed = True
            if stored.key:  # not the marker of the prefix itself: that folder is the root
                yield _member(stored, self.root.uid, self.root.gid), stored
        if not listed:
            raise PackError(f"{self.name} holds no objects; check the bucket and the prefix")

    def _fetched(self, gets: Executor, threads: int) -> Iterator[tuple[Member, BinaryIO | None]]:
        """The members in listing order with their bytes. A thread of its own lists them and
        requests their GETs, up to ``threads`` and FETCH_BYTES ahead of the caller, so that GETs
        keep coming while the caller writes."""
        queue = _InFlight(threads, FETCH_BYTES)
        feeder = threading.Thread(target=self._feed, args=(gets, queue), name="dlfs-list", daemon=True)
        feeder.start()
        try:
            while (entry := queue.take()) is not None:
                yield self._ready(entry, gets)
        finally:
            queue.close()
            feeder.join(timeout=1)  # it may be waiting on a listing page: that ends by itself

    def _feed(self, gets: Executor, queue: _InFlight) -> None:
        block_in_thread()  # Ctrl-C goes to the main thread, which then closes the queue
        try:
            for member, stored in self._members():
                whole = _is_file(member) and 0 < member.size <= fmt.WHOLE_PAYLOAD_LIMIT
                held = member.size if whole else 0
                if not queue.admit(held):
                    return
                future = None
                if whole:
                    future = gets.submit(self._get, stored, 0, stored.size)
                    future.add_done_callback(queue.fetched)
                queue.put((member, stored, future), held)
        except BaseException as exc:  # handed to the caller, which raises it
            queue.end(exc)
        else:
            queue.end()

    def _get(self, stored: StoredObject, offset: int, length: int) -> bytes:
        """``length`` bytes of the object at ``offset``, of the version listed."""
        return bytes(self.store.get_object(stored.key, offset, length, stored.etag))

    def _ready(self, entry: Entry, gets: Executor) -> tuple[Member, BinaryIO | None]:
        member, stored, future = entry
        if not _is_file(member):
            return member, None
        if future is not None:
            return member, io.BytesIO(future.result())
        if member.size == 0:
            return member, io.BytesIO()
        return member, cast(BinaryIO, _Ranged(self._get, stored, gets))


#: A member, its object, and the GET of its bytes where it is fetched whole.
Entry = tuple[Member, StoredObject, "Future[bytes] | None"]


class _InFlight:
    """The members between the thread that lists them and requests their GETs, and the pass that
    takes them, in listing order: at most ``threads`` GETs in flight, ``budget`` bytes fetched or
    being fetched (one larger object alone) and MEMBERS_AHEAD members. Fetched bytes wait here while
    the pass writes, so the GETs go on meanwhile."""

    def __init__(self, threads: int, budget: int) -> None:
        self.threads, self.budget = threads, budget
        self.entries: deque[tuple[Entry, int]] = deque()
        self.held = 0
        self.fetching = 0
        self.ended = self.closed = False
        self.error: BaseException | None = None
        self.changed = threading.Condition()

    def admit(self, size: int) -> bool:
        """Wait until a member whose GET brings ``size`` bytes (0: none) fits, and count its GET;
        False once the pass has stopped taking."""
        with self.changed:
            self.changed.wait_for(
                lambda: (
                    self.closed
                    or not self.entries
                    or (
                        len(self.entries) < MEMBERS_AHEAD
                        and self.held + size <= self.budget
                        and (not size or self.fetching < self.threads)
                    )
                )
            )
            self.fetching += bool(size) and not self.closed
            return not self.closed

    def fetched(self, _: Future[bytes]) -> None:
        """A GET ended (its future's callback)."""
        with self.changed:
            self.fetching -= 1
            self.changed.notify_all()

    def put(self, entry: Entry, size: int) -> None:
        with self.changed:
            self.entries.append((entry, size))
            self.held += size
            self.changed.notify_all()

    def end(self, error: BaseException | None = None) -> None:
        """Every member is in, or listing failed with ``error``."""
        with self.changed:
            self.ended, self.error = True, error
            self.changed.notify_all()

    def take(self) -> Entry | None:
        """The next entry; None after the last one."""
        with self.changed:
            self.changed.wait_for(lambda: self.entries or self.ended)
            if not self.entries:
                if self.error is not None:
                    raise self.error
                return None
            entry, size = self.entries.popleft()
            self.held -= size
            self.changed.notify_all()
            return entry

    def close(self) -> None:
        """The pass takes no more: the lister stops."""
        with self.changed:
            self.closed = True
            self.changed.notify_all()


def _is_file(member: Member) -> bool:
    """A file whose bytes the pack reads (not a folder, nor refused)."""
    return member.kind == stat.S_IFREG and not member.problem


def _member(stored: StoredObject, uid: int, gid: int) -> Member:
    """The file or folder an object is, or, breaking a rule, a member carrying its ``problem``."""
    raw = stored.key.encode()
    marker = raw.endswith(b"/")
    kind, mode = (stat.S_IFDIR, FOLDER_MODE) if marker else (stat.S_IFREG, FILE_MODE)
    member = Member(raw, kind, mode, uid, gid, stored.mtime_ns, 0 if marker else stored.size)
    try:
        member.path = _path(raw, marker, stored.size)
    except Refused as exc:
        member.problem = str(exc)
    return member


def _path(raw: bytes, marker: bool, size: int) -> bytes:
    """The path in the tree of the key ``raw``, which must be a normal path already."""
    if marker and size:
        raise Refused(
            f"object {show(raw)} ends in '/' but holds {size:,} bytes, so it is neither a folder nor a file"
        )
    if CONTROL.search(raw.decode()):
        raise Refused(
            f"object {show(raw)!r} has a control character in its key, which the S3 client cannot fetch"
        )
    key = raw[:-1] if marker else raw
    path = normalize(key, "object")
    if path != key:
        raise Refused(f"object {show(raw)} has an empty or '.' component in its key, which no file path has")
    return path


class _Ranged(io.RawIOBase):
    """A large object's bytes, read in order: ranged GETs of STREAM_CHUNK, RANGES_AHEAD of them in
    flight ahead of the reader, each only of the listed version."""

    def __init__(
        self, get: Callable[[StoredObject, int, int], bytes], stored: StoredObject, gets: Executor
    ) -> None:
        super().__init__()
        self._get, self._stored, self._gets = get, stored, gets
        self._starts = iter(range(0, stored.size, STREAM_CHUNK))
        self._pending: deque[Future[bytes]] = deque()
        self._chunk, self._at = b"", 0
        for _ in range(RANGES_AHEAD):
            self._request()

    def _request(self) -> None:
        start = next(self._starts, None)
        if start is not None:
            length = min(STREAM_CHUNK, self._stored.size - start)
            self._pending.append(self._gets.submit(self._get, self._stored, start, length))

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if self._at == len(self._chunk):
            if not self._pending:
                return b""
            self._chunk, self._at = self._pending.popleft().result(), 0
            self._request()
        if self._at == 0 and (size < 0 or size >= len(self._chunk)):
            self._at = len(self._chunk)
            return self._chunk
        end = len(self._chunk) if size < 0 else self._at + size
        out = self._chunk[self._at : end]
        self._at += len(out)
        return out
