"""File bytes from shards: fetch, decompress, verify, cache.

Every byte handed out has been checked against the checksum recorded at pack time; a mismatch is an
``IntegrityError`` (EIO at the mount), logged once per file, never wrong bytes. Files up to
``WHOLE_PAYLOAD_LIMIT`` are read whole (one storage request, then cached); larger ones are checked
once by streaming, then served by range. Every method blocks: ``dlfs.fuse.trio_file_bytes`` runs them in
threads for the mount's event loop, except ``load_cached``, which never waits for storage.
"""

from __future__ import annotations

import logging

import numpy as np
import xxhash

from dlfs.core import format as fmt
from dlfs.core.errors import DlfsError, IntegrityError
from dlfs.core.index import Index
from dlfs.core.ram_cache import RamCache
from dlfs.core.store import Descriptors, Forgets, PartlyLocal, Store

log = logging.getLogger(__name__)

VERIFY_CHUNK = 8 << 20
#: Files up to this size whose stored bytes are all in the page cache are read in the event loop
#: itself, with a read that must not wait: the hop to a thread and back cost more than the read.
INLINE_LIMIT = 1 << 20


class FileBytes:
    """A dataset's files, checked, through the RAM cache."""

    def __init__(self, index: Index, store: Store, cache: RamCache) -> None:
        self.index = index
        self.store = store
        self.cache = cache
        self.storage_reads = 0
        self.storage_bytes = 0
        self._reported = np.zeros(index.count, dtype=bool)

    def read_range(self, row: int, offset: int, length: int) -> bytes:
        """``length`` bytes of a file's stored payload, starting ``offset`` bytes into it."""
        self.storage_reads += 1
        self.storage_bytes += length
        return self.store.read(self.index.shard_of(row), int(self.index.offset[row]) + offset, length)

    def read_file_range(self, row: int, offset: int, length: int) -> bytes:
        """``length`` bytes of a large file (stored raw, or as a sparse file's runs), starting
        ``offset`` bytes into the file; fewer past its end."""
        if not int(self.index.flags[row]) & fmt.FLAG_SPARSE:
            return self.read_range(row, offset, length)
        length = max(0, min(length, int(self.index.size[row]) - offset))
        at, stored, runs = self.index.sparse.piece(row, offset, length)
        return fmt.expand_sparse(self.read_range(row, at, stored) if stored else b"", runs, offset, length)

    def fetch_into(self, row: int, shard_offset: int, buffer: memoryview, wait: bool = True) -> int | None:
        """Any byte range of the shard holding ``row`` (read-ahead covers neighbours with one read);
        see ``Store.read_into``."""
        got = self.store.read_into(self.index.shard_of(row), shard_offset, buffer, wait)
        if got is not None:
            self.storage_reads += 1
            self.storage_bytes += got
        return got

    def will_fetch(self, row: int, shard_offset: int, length: int) -> None:
        self.store.will_read(self.index.shard_of(row), shard_offset, length)

    def descriptor(self, shard: int, direct: bool = False, partial: bool = False) -> int | None:
        """A descriptor to ``pread`` shard number ``shard`` from, at ``index.shard_base[shard]``
        plus a row's offset, for readers in C (the read-ahead's push loop); see
        ``Store.descriptor``. ``partial``: also one of a disk tier's local file, whose bytes the
        caller reads only where ``local`` vouches for them."""
        name = self.index.shard_names[shard]
        if isinstance(self.store, Descriptors):
            return self.store.descriptor(name, direct=direct)
        if partial and isinstance(self.store, PartlyLocal):
            return self.store.local_descriptor(name, direct=direct)
        return None

    @property
    def partly_local(self) -> bool:
        """The store keeps some bytes in a local tier (``stage`` fills it)."""
        return isinstance(self.store, PartlyLocal)

    def stage(self, spans: list[tuple[int, int, int]]) -> None:
        """Fetch these (first row, shard offset, length) ranges into the store's local tier, every
        read hinted first so that all are in flight at once. A failure is left to the files' own
        reads, which report it."""
        store = self.store
        if not isinstance(store, PartlyLocal):
            return  # no local tier to fill
        for row, offset, length in spans:
            self.store.will_read(self.index.shard_of(row), offset, length)
        for row, offset, length in spans:
            try:
                store.fill(self.index.shard_of(row), offset, length)
            except DlfsError as exc:
                log.debug("staging shard %s at %d failed: %s", self.index.shard_of(row), offset, exc)

    def local(self, rows: np.ndarray) -> np.ndarray:
        """Which of these files' stored bytes the shards' descriptors read (all, from a directory)."""
        if not isinstance(self.store, PartlyLocal):
            return np.ones(rows.size, dtype=bool)
        index, store = self.index, self.store
        places = zip(
            index.shard[rows].tolist(), index.offset[rows].tolist(), index.stored[rows].tolist(), strict=True
        )
        return np.fromiter(
            (store.local(index.shard_names[shard], offset, length) for shard, offset, length in places),
            dtype=bool,
            count=rows.size,
        )

    def hold(self, row: int, data: bytes) -> None:
        """Keep a whole file fetched elsewhere (the read-ahead) for the next ``read`` of it."""
        self.cache.put(row, data)

    def report(self, row: int, error: DlfsError) -> None:
        """Log a file's failure once, however often it is asked for again."""
        if not self._reported[row]:
            self._reported[row] = True
            log.error("%s: %s", self.index.location(row), error)

    def is_whole(self, row: int) -> bool:
        return int(self.index.size[row]) <= fmt.WHOLE_PAYLOAD_LIMIT

    def load(self, row: int) -> bytes:
        """The whole original file; only for files up to WHOLE_PAYLOAD_LIMIT. Bytes that fail
        their check in a store's own tier are dropped there and read once more from the source."""
        stored = int(self.index.stored[row])
        try:
            return self.decode(row, self.read_range(row, 0, stored))
        except IntegrityError:
            if not self.forget(row):
                raise
            return self.decode(row, self.read_range(row, 0, stored))

    def forget(self, row: int) -> bool:
        """Drop a file's stored bytes from the store's own tier (they failed a check); False
        where the store has none, so reading again would read the same bytes."""
        if not isinstance(self.store, Forgets):
            return False
        self.store.forget(self.index.shard_of(row), int(self.index.offset[row]), int(self.index.stored[row]))
        return True

    def load_cached(self, row: int) -> bytes | None:
        """``load`` for a small file whose stored bytes are all in the page cache, never waiting for
        storage (so the event loop may call it); None when some are not."""
        stored = int(self.index.stored[row])
        if max(stored, int(self.index.size[row])) > INLINE_LIMIT:  # nor a long lz4 decompression
            return None
        buffer = memoryview(bytearray(stored))
        if self.fetch_into(row, int(self.index.offset[row]), buffer, wait=False) is None:
            return None
        try:
            return bytes(self.decode(row, buffer))
        except IntegrityError:
            if self.forget(row):
                return None  # ``load`` reads it again from the source
            raise

    def decode(self, row: int, stored: bytes | memoryview) -> bytes | memoryview:
        """Stored payload -> original bytes, verified against the file's checksum."""
        index = self.index
        flags = int(index.flags[row])
        runs = index.sparse.runs(row) if flags & fmt.FLAG_SPARSE else None
        return fmt.decode_payload(stored, flags, int(index.size[row]), int(index.checksum[row]), runs)

    def check(self, row: int) -> None:
        """Verify one file of any size against its checksum without holding it whole. A large
        file is stored raw or as sparse runs, and either checksum is of its stored bytes."""
        if self.is_whole(row):
            self.load(row)
            return
        stored = int(self.index.stored[row])
        hasher = xxhash.xxh3_64()
        for start in range(0, stored, VERIFY_CHUNK):
            chunk = self.read_range(row, start, min(VERIFY_CHUNK, stored - start))
            if not chunk:
                break
            hasher.update(chunk)
        if hasher.intdigest() != int(self.index.checksum[row]):
            raise IntegrityError("checksum mismatch")
