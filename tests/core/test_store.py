"""The local backend's reads into a caller's buffer, and the ones that must not wait for the disk."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from page_cache import drop_from_memory

from dlfs.core import libc
from dlfs.core.errors import DatasetError
from dlfs.core.store.local import LocalStore

SIZE = 4 << 20
MIB = 1 << 20


@pytest.fixture
def store(on_disk: Path) -> Iterator[LocalStore]:
    (on_disk / "shard").write_bytes(os.urandom(SIZE))
    store = LocalStore(on_disk, random_access=True)
    yield store
    store.close()


@pytest.mark.parametrize(("offset", "length"), [(0, 100), (4095, 3 * MIB), (SIZE - 10, 100), (SIZE, 5)])
def test_read_into_fills_the_buffer_as_read_would(store: LocalStore, offset: int, length: int) -> None:
    buffer = memoryview(bytearray(length))
    got = store.read_into("shard", offset, buffer)
    assert got is not None
    assert bytes(buffer[:got]) == store.read("shard", offset, length)


def _refused_without_waiting(store: LocalStore, path: Path, buffer: memoryview, first: int = 0) -> bool:
    """Does a read that must not wait give up, with only ``first`` bytes in memory? Asked a few
    times: a refused RWF_NOWAIT read still starts the kernel's read, and on this VM's disk that
    read sometimes lands before the check (1 time in 12). A read that waits never gives up."""
    for _ in range(5):
        drop_from_memory(path)
        if first:
            store.read_into("shard", 4096, buffer[:first])
        if store.read_into("shard", 4096, buffer, wait=False) is None:
            return True
    return False


def test_without_waiting_only_bytes_in_memory_are_read(store: LocalStore, on_disk: Path) -> None:
    buffer = memoryview(bytearray(MIB))
    assert _refused_without_waiting(store, on_disk / "shard", buffer)
    assert _refused_without_waiting(store, on_disk / "shard", buffer, MIB // 2), "half of it is not in memory"
    store.will_read("shard", 4096, MIB)
    assert store.read_into("shard", 4096, buffer) == MIB
    assert store.read_into("shard", 4096, buffer, wait=False) == MIB
    assert bytes(buffer) == store.read("shard", 4096, MIB)


def test_without_waiting_bytes_in_memory_are_read_where_the_filesystem_cannot_say(in_tmpfs: Path) -> None:
    """tmpfs refuses RWF_NOWAIT (EOPNOTSUPP): its pages are asked about instead, and read."""
    data = os.urandom(SIZE)
    (in_tmpfs / "shard").write_bytes(data)
    store = LocalStore(in_tmpfs, random_access=True)
    buffer = memoryview(bytearray(MIB))
    try:
        assert store.read_into("shard", 4096, buffer, wait=False) == MIB
    finally:
        store.close()
    assert bytes(buffer) == data[4096 : 4096 + MIB]


def test_without_waiting_nothing_is_read_where_neither_the_filesystem_nor_cachestat_can_say(
    in_tmpfs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel without cachestat (before 6.5) and a filesystem that refuses RWF_NOWAIT: the read
    counts as one that would wait."""
    monkeypatch.setattr(libc, "in_memory", lambda fd, offset, length: None)
    (in_tmpfs / "shard").write_bytes(os.urandom(SIZE))
    store = LocalStore(in_tmpfs, random_access=True)
    try:
        assert store.read_into("shard", 4096, memoryview(bytearray(MIB)), wait=False) is None
    finally:
        store.close()


def test_a_missing_object_is_named(store: LocalStore) -> None:
    with pytest.raises(DatasetError, match="gone"):
        store.read_into("gone", 0, memoryview(bytearray(10)))
    with pytest.raises(DatasetError, match="gone"):
        store.will_read("gone", 0, 10)


def test_a_shard_writer_keeps_every_payload_in_order(on_disk: Path) -> None:
    """Payloads are gathered into few writes (more of them than one writev takes, empty ones, ones
    larger than the gathering buffer): the shard holds exactly their concatenation."""
    store = LocalStore(on_disk)
    payloads = [os.urandom(n % 700) for n in range(1500)] + [b"", os.urandom(5 * MIB), b"x"]
    writer = store.create("shard")
    for payload in payloads:
        writer.write(payload)
    writer.commit()
    assert (on_disk / "shard").read_bytes() == b"".join(payloads)
