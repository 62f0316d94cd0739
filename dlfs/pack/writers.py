"""Shard writers: numbered shards of about ``target`` bytes for one dataset; a file never spans two.

Two writers share one small interface (``ShardSet``): the write loop asks for the reads that feed
it (``reads``), hands over each outcome (``put``) and ends with ``finish`` or ``abort``.

``InOrderShards`` places then writes each payload, shard after shard, for payloads whose stored
size is known only once read (lz4), and for stores that take an object in order only (S3): it
writes through the store's ``ShardWriter``. ``InPlaceShards``, for stores that are ``WritesInPlace``
(directories), writes through ``InPlaceWriter``s: it gives every file its slot from the walk's
size as the read pipeline submits it, with several shards open at once, and the thread that read
a file writes it into its slot while its bytes are still in that core's cache. Handed to one
writer instead, the bytes are copied out of memory they were read into long before, which here
cost more than all of tar's work: without fsyncs, 2.2 GB of JPEGs packed in 1.2-1.35x tar cf's
time in order, 0.79x (warm) and 0.58x (cold) in place.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from concurrent.futures import Executor
from typing import Any, Generic, TypeVar

from dlfs.core import format as fmt
from dlfs.core.store import InPlaceWriter, ShardWriter, Store, WritesInPlace
from dlfs.pack.options import PackOptions
from dlfs.pack.pipeline import File, Outcome, Payload, Slot, prefetch, stream_into

Writer = TypeVar("Writer", ShardWriter, InPlaceWriter)


class ShardSet(ABC, Generic[Writer]):
    """The shards one pack writes, and how its files get into them."""

    def __init__(self, store: Store, dataset_id: str, target: int) -> None:
        self.store = store
        self.dataset_id = dataset_id
        self.target = target
        self.created: list[str] = []
        #: Shard writers not yet committed; ``abort`` drops them.
        self.open: list[Writer] = []

    def _full(self, end: int, length: int) -> bool:
        """Does a shard that reaches ``end`` take no file of ``length`` more? A file never spans
        shards, one larger than the target gets a shard of its own, and every file starts below the
        target (an empty one too), which bounds the offsets the index holds (``fmt.SHARD_MAX``)."""
        return end > fmt.HEADER_SIZE and end + max(length, 1) > self.target

    def _create(self) -> tuple[int, Writer]:
        """The next numbered shard: its number and its writer, which is kept open."""
        number = len(self.created)
        self.created.append(fmt.shard_name(self.dataset_id, number))
        self.open.append(self._writer(self.created[-1]))
        return number, self.open[-1]

    @abstractmethod
    def _writer(self, name: str) -> Writer:
        """A new shard's writer, from the store."""

    @abstractmethod
    def reads(
        self, pool: Executor, files: Iterator[list[File]], options: PackOptions
    ) -> Iterator[tuple[File, Slot | None, Outcome]]:
        """The read pipeline over ``files`` (placement order) that feeds this writer."""

    @abstractmethod
    def put(self, file: File, slot: Slot | None, outcome: Payload | None) -> tuple[Payload, int, int]:
        """Store one file's read outcome, or stream a large one (None); (payload, shard, offset)."""

    @abstractmethod
    def finish(self) -> list[tuple[str, int]]:
        """Commit every shard; (name, length) of each, in shard order."""

    def meta(self) -> dict[str, Any]:
        """Shard files need nothing in the index besides their list."""
        return {}

    def abort(self) -> None:
        """Drop every shard this pack created, so a failed pack leaves none behind: the open ones'
        uploads aborted, the written ones deleted, and any upload a writer that never got into
        ``open`` started (an interruption between the two) aborted with the store's."""
        for writer in self.open:
            writer.abort()
        self.open = []
        for name in self.created:
            self.store.delete(name)
        self.store.abort_uploads()


class InOrderShards(ShardSet[ShardWriter]):
    """Payloads appended one after another by the write loop, one shard open at a time."""

    def __init__(self, store: Store, dataset_id: str, target: int) -> None:
        super().__init__(store, dataset_id, target)
        self.done: list[tuple[str, int]] = []
        self._pos = 0

    def _writer(self, name: str) -> ShardWriter:
        return self.store.create(name)

    def reads(
        self, pool: Executor, files: Iterator[list[File]], options: PackOptions
    ) -> Iterator[tuple[File, Slot | None, Outcome]]:
        return prefetch(pool, files, options)

    def _roll(self) -> None:
        self._close()
        number, writer = self._create()
        writer.write(fmt.shard_header(self.dataset_id, number))
        self._pos = fmt.HEADER_SIZE

    def _close(self) -> None:
        if self.open:
            self.open[-1].commit()
            self.open.pop()
            self.done.append((self.created[-1], self._pos))

    def place(self, length: int) -> tuple[int, int]:
        """(shard number, offset) for the next ``length`` bytes; a file never spans shards."""
        if not self.open or self._full(self._pos, length):
            self._roll()
        return len(self.done), self._pos

    def write(self, data: bytes) -> None:
        self.open[-1].write(data)
        self._pos += len(data)

    def put(self, file: File, slot: Slot | None, outcome: Payload | None) -> tuple[Payload, int, int]:
        """Append a read payload, or stream a large file (``outcome`` None)."""
        _, path, size_hint = file
        if outcome is None:
            shard, offset = self.place(size_hint)
            payload = stream_into(lambda _at, chunk: self.write(chunk), path)
            assert payload is not None  # no limit
            return payload, shard, offset
        shard, offset = self.place(len(outcome.stored))
        self.write(outcome.stored)
        return outcome, shard, offset

    def finish(self) -> list[tuple[str, int]]:
        self._close()
        return self.done


class InPlaceShards(ShardSet[InPlaceWriter]):
    """Every file's slot laid out from the walk's sizes as the read pipeline reaches it, shards
    created as the layout reaches them, each file written into its slot by the reader that read
    it."""

    def __init__(self, store: Store, dataset_id: str, target: int) -> None:
        if not isinstance(store, WritesInPlace):
            raise TypeError(f"{store.url} takes no writes in place")
        super().__init__(store, dataset_id, target)
        self._in_place = store
        #: How far each shard's slots (and appends) reach.
        self._ends: list[int] = []

    def _writer(self, name: str) -> InPlaceWriter:
        return self._in_place.create_in_place(name)

    def reads(
        self, pool: Executor, files: Iterator[list[File]], options: PackOptions
    ) -> Iterator[tuple[File, Slot | None, Outcome]]:
        """The readers write straight into the slots ``lay_out`` gives."""
        return prefetch(pool, files, options, self.lay_out, self.open)

    def lay_out(self, size: int) -> Slot:
        """The slot of the next file in placement order, creating its shard when it starts one; also
        where a file that outgrew its slot since the walk goes, past every slot laid out so far."""
        if not self._ends or self._full(self._ends[-1], size):
            number, writer = self._create()
            writer.write_at(0, fmt.shard_header(self.dataset_id, number))
            self._ends.append(fmt.HEADER_SIZE)
        slot = len(self._ends) - 1, self._ends[-1]
        self._ends[-1] += size
        return slot

    def put(self, file: File, slot: Slot | None, outcome: Payload | None) -> tuple[Payload, int, int]:
        """Done when its reader wrote it in its slot; else stream a large file into the slot, and
        append a file that outgrew its slot since the walk."""
        _, path, size_hint = file
        assert slot is not None  # every file gets one from lay_out
        placed = self._put_at(slot, path, size_hint, outcome)
        self.open[slot[0]].written_through(slot[1] + size_hint)
        return placed

    def _put_at(
        self, slot: tuple[int, int], path: bytes, size_hint: int, outcome: Payload | None
    ) -> tuple[Payload, int, int]:
        shard, offset = slot
        if outcome is not None and outcome.in_place:
            return outcome, shard, offset
        if outcome is not None:
            shard, offset = self.lay_out(len(outcome.stored))
            self.open[shard].write_at(offset, outcome.stored)
            return Payload(b"", 0, outcome.size, outcome.checksum, in_place=True), shard, offset
        payload = self._stream_at(shard, offset, path, size_hint)
        if payload is None:  # outgrown, and of a size known only once streamed
            shard, offset = self.lay_out(0)
            payload = self._stream_at(shard, offset, path)
            assert payload is not None  # no limit
            self._ends[shard] += payload.size
        return payload, shard, offset

    def _stream_at(self, shard: int, offset: int, path: bytes, limit: int | None = None) -> Payload | None:
        writer = self.open[shard]
        return stream_into(lambda at, chunk: writer.write_at(offset + at, chunk), path, limit)

    def finish(self) -> list[tuple[str, int]]:
        done = []
        for number, writer in enumerate(self.open):
            writer.commit(self._ends[number])
            done.append((self.created[number], self._ends[number]))
        self.open = []
        return done
