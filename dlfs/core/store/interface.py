"""Where a dataset's bytes live: the small interface every backend implements.

``pack`` writes through it and ``mount``/``verify`` read through it: a flat namespace of immutable
objects (shards and the index) with ranged reads. A backend promises nothing about how it stores
bytes; what a local directory can do beyond that is an optional interface, asked for with
``isinstance``: ``Descriptors`` for the read-ahead's C loop, ``WritesInPlace`` for pack's readers.
What a caller plans around is asked of every store: ``hints_in_memory``, ``stats``. Everything here
is blocking: callers on the trio loop go through ``trio.to_thread``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class StoreOptions:
    """How to reach a store and what may sit in front of it; local directories use none of it."""

    #: An S3-compatible endpoint (Ceph RGW, SeaweedFS, MinIO); None: the AWS way (AWS_ENDPOINT_URL,
    #: the profile's ``endpoint_url``, else AWS itself).
    endpoint_url: str | None = None
    #: Seconds one request may take, and retries of a failing one may go on, before a read fails.
    timeout: float = 30.0
    #: A local directory caching ranges of the shards (``dlfs.core.store.disk_tier``), and its budget.
    disk_tier: str | None = None
    disk_tier_size: int = 0


class ShardWriter(Protocol):
    """A new object written from its first byte to its last (pack writes in order)."""

    def write(self, data: bytes | memoryview) -> None:
        """Append."""

    def commit(self) -> None:
        """Make the written bytes readable under the final name (durable, unless the store
        was opened with ``durable=False``)."""

    def abort(self) -> None:
        """Forget the partial object."""


class InPlaceWriter(Protocol):
    """A new object written at any offset, from any thread (pack writes in place: it lays every
    file out up front and its readers write in parallel)."""

    def write_at(self, offset: int, *data: bytes | memoryview) -> None:
        """Write ``data`` back to back from ``offset``."""

    def written_through(self, end: int) -> None:
        """Every byte below ``end`` has been written (a hint to start storing them)."""

    def commit(self, size: int) -> None:
        """Make the object, ``size`` bytes long, readable under the final name (durable, unless
        the store was opened with ``durable=False``). Bytes never written (a skipped file's slot)
        read as zeros."""

    def abort(self) -> None:
        """Forget the partial object."""


class Store(Protocol):
    """A flat namespace of immutable objects (shards and the index) with ranged reads."""

    url: str
    #: ``will_read`` fetches into this process's memory (an object store's GETs), where a local
    #: store's hints fill the page cache: whoever budgets the daemon's memory counts them.
    hints_in_memory: bool

    def read(self, name: str, offset: int, length: int) -> bytes:
        """Exactly ``length`` bytes at ``offset`` (fewer only at the end of the object)."""

    def read_buffer(self, name: str, offset: int, length: int) -> bytes | memoryview:
        """What ``read`` gives, in the buffer the store received it in: an object store's response
        body, which ``read`` copies into ``bytes`` (for 8 MiB GETs, half the CPU of filling the disk
        tier)."""

    def read_into(self, name: str, offset: int, buffer: memoryview, wait: bool = True) -> int | None:
        """Fill ``buffer`` with the bytes at ``offset``; returns how many (fewer only at the end of
        the object). ``wait=False``: None, at once, unless all of them are in memory already."""

    def will_read(self, name: str, offset: int, length: int) -> None:
        """A hint that this range is read soon. Storage serves all the hinted ranges at once, so a
        reader that hints a batch first waits for its slowest read, not for the sum of them."""

    def size(self, name: str) -> int | None:
        """The object's size, or None when it does not exist."""

    def sizes(self) -> dict[str, int]:
        """Every object's size by name (one listing, however many shards)."""

    def names(self) -> list[str]: ...

    def map_index(self, name: str) -> memoryview:
        """The whole object in memory that nothing outside this process can change once it is
        returned (``dlfs.core.sealed``), for zero-copy numpy views."""

    def put_file(self, name: str, path: Path) -> None:
        """Publish the local file ``path`` under ``name`` so readers see the old object or the new,
        never a part. ``path`` may be moved: a local store renames it into place."""

    def create(self, name: str) -> ShardWriter: ...

    def delete(self, name: str) -> None: ...

    def abort_uploads(self) -> None:
        """Drop what interrupted writers left where listing cannot see it (S3's open uploads),
        this process's writers still open first."""

    def unfinished_uploads(self) -> list[str]:
        """The names whose uploads interrupted writers left open (S3's); none for a directory."""

    def stats(self) -> dict[str, dict[str, int]]:
        """What the store counted, by section of the mount's statistics: ``store``, an object
        store's requests and their bytes; ``disk_tier``, the disk tier's; none for a directory."""

    def close(self) -> None: ...


@runtime_checkable
class WritesInPlace(Protocol):
    """A store whose new objects take writes at any offset (files): pack then lays every file out
    up front and its readers write them in parallel. Object stores take an object in order."""

    def create_in_place(self, name: str) -> InPlaceWriter: ...


@runtime_checkable
class Descriptors(Protocol):
    """A store whose objects are files: the read-ahead's C loop reads them itself, many per call and
    without the GIL (``dlfs.readahead.native``). Stores without it are read through ``read_into``."""

    def descriptor(self, name: str, direct: bool = False) -> int | None:
        """A descriptor to ``pread`` the object from. ``direct``: one that bypasses the page cache
        (O_DIRECT), or None where the filesystem cannot."""


@runtime_checkable
class Forgets(Protocol):
    """A store with a tier of its own (``cached``): bytes that failed a checksum are dropped there,
    so that reading them again goes to the source."""

    def forget(self, name: str, offset: int, length: int) -> None: ...


@runtime_checkable
class PartlyLocal(Protocol):
    """A store holding some of its bytes in local files at the objects' own offsets (the disk
    tier): the read-ahead's C loop reads those itself, as from a local dataset."""

    def local(self, name: str, offset: int, length: int) -> bool:
        """Are all of these bytes in the local file now?"""

    def local_descriptor(self, name: str, direct: bool = False) -> int | None:
        """A descriptor of the object's local file, to ``pread`` the bytes ``local`` vouches for
        (or None where it cannot, say no direct I/O)."""

    def fill(self, name: str, offset: int, length: int) -> None:
        """Fetch whatever of these bytes the local file lacks into it (after ``will_read``: all
        the hinted fetches are in flight at once)."""
