"""The FUSE adapter's handlers awaited directly: no kernel, no mount."""

from __future__ import annotations

import errno
import os
import struct
from pathlib import Path

import pyfuse3
import pytest
import trio
from page_cache import drop_from_memory
from trees import write

from dlfs.core import file_bytes as file_bytes_module
from dlfs.core import ram_cache as cache_module
from dlfs.core.index import Index
from dlfs.core.order import OrderSpec
from dlfs.core.ram_cache import RamCache
from dlfs.core.store.local import LocalStore
from dlfs.fuse import dirents
from dlfs.fuse import operations as fs
from dlfs.fuse.control import ControlTree
from dlfs.fuse.operations import DlfsOperations
from dlfs.fuse.trio_file_bytes import TrioFileBytes
from dlfs.pack import PackOptions, pack


def _operations(dataset: Path) -> DlfsOperations:
    store = LocalStore(dataset)
    index = Index.load(store)
    return DlfsOperations(
        index, TrioFileBytes(index, store, RamCache(1 << 20)), ControlTree(index, OrderSpec(), dict)
    )


@pytest.fixture
def ops(packed: Path) -> DlfsOperations:
    return _operations(packed)


def _run(fn, *args):  # type: ignore[no-untyped-def]
    return trio.run(fn, *args)


def test_lookup_getattr_and_read_follow_the_source(ops: DlfsOperations, odd_tree: Path) -> None:
    classes = _run(ops.lookup, pyfuse3.ROOT_INODE, b"classes", None)
    sub = _run(ops.lookup, classes.st_ino, b"n00000001", None)
    entry = _run(ops.lookup, sub.st_ino, b"n00000001_3.JPEG", None)
    expected = (odd_tree / "classes/n00000001/n00000001_3.JPEG").read_bytes()
    assert entry.st_size == len(expected)
    assert _run(ops.getattr, entry.st_ino, None).st_mtime_ns == entry.st_mtime_ns
    assert _run(ops.read, entry.st_ino, 0, 1 << 20) == expected
    assert _run(ops.read, entry.st_ino, 100, 50) == expected[100:150]
    assert _run(ops.read, entry.st_ino, len(expected) + 10, 50) == b""


def test_opens_are_left_to_the_kernel_with_the_patched_pyfuse3(ops: DlfsOperations) -> None:
    """ENOSYS makes the kernel stop sending OPEN/OPENDIR/FLUSH and cache pages and listings."""
    assert fs.SKIP_OPEN, "make install builds pyfuse3 with tools/build_pyfuse3.py"
    for call in (ops.open(2, os.O_RDONLY, None), ops.opendir(1, None), ops.flush(2)):
        with pytest.raises(pyfuse3.FUSEError) as info:
            trio.run(lambda call=call: call)
        assert info.value.errno == errno.ENOSYS


def test_on_stock_pyfuse3_opens_are_answered_with_the_inode_as_handle(ops, monkeypatch) -> None:
    monkeypatch.setattr(fs, "SKIP_OPEN", False)
    inode = ops.index.resolve(b"plain.txt") + 1
    info = _run(ops.open, inode, os.O_RDONLY, None)
    assert info.fh == inode and info.keep_cache
    assert _run(ops.opendir, pyfuse3.ROOT_INODE, None) == pyfuse3.ROOT_INODE
    for call, code in [
        (lambda: ops.open(pyfuse3.ROOT_INODE, os.O_RDONLY, None), errno.EISDIR),
        (lambda: ops.opendir(inode, None), errno.ENOTDIR),
        (lambda: ops.open(inode, os.O_WRONLY, None), errno.EROFS),
    ]:
        with pytest.raises(pyfuse3.FUSEError) as raised:
            trio.run(call)
        assert raised.value.errno == code


def test_dot_and_dotdot_resolve(ops: DlfsOperations) -> None:
    classes = _run(ops.lookup, pyfuse3.ROOT_INODE, b"classes", None)
    assert _run(ops.lookup, classes.st_ino, b"..", None).st_ino == pyfuse3.ROOT_INODE
    assert _run(ops.lookup, classes.st_ino, b".", None).st_ino == classes.st_ino


@pytest.mark.parametrize(
    ("call", "code"),
    [
        (lambda ops: ops.lookup(pyfuse3.ROOT_INODE, b"missing", None), errno.ENOENT),
        (lambda ops: ops.getattr(10**9, None), errno.ENOENT),
        (lambda ops: ops.read(pyfuse3.ROOT_INODE, 0, 10), errno.EISDIR),
        (lambda ops: ops.read(ops.index.resolve(b"link-to-file") + 1, 0, 10), errno.EINVAL),
        (lambda ops: ops.readlink(ops.index.resolve(b"plain.txt") + 1, None), errno.EINVAL),
    ],
    ids=["lookup-missing", "getattr-bad-inode", "read-dir", "read-symlink", "readlink-file"],
)
def test_bad_requests_get_the_right_errno(ops: DlfsOperations, call, code: int) -> None:
    with pytest.raises(pyfuse3.FUSEError) as info:
        trio.run(lambda: call(ops))
    assert info.value.errno == code


def test_concurrent_reads_of_one_file_share_one_storage_fetch(ops: DlfsOperations) -> None:
    row = ops.index.resolve(b"random.bin")
    results: list[bytes] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for k in range(10):

                async def one(offset: int = k * 1000) -> None:
                    results.append(await ops.read(row + 1, offset, 1000))

                nursery.start_soon(one)

    trio.run(main)
    assert len(results) == 10
    assert ops.file_bytes.storage_reads == 1


def test_cache_never_exceeds_its_budget() -> None:
    cache = RamCache(1000)
    for k in range(50):
        cache.put(k, bytes(k * 37 % 400))
        assert cache.used <= 1000
    cache.put(99, bytes(5000))
    assert cache.get(99) is None and cache.used <= 1000
    assert cache.evictions > 0


def test_a_small_file_in_the_page_cache_is_read_without_a_thread(on_disk: Path) -> None:
    """A thread hop per READ cost more than the read (a warm epoch without read-ahead: 2.3k files/s
    through threads, 4.6-7.1k inline); a file with bytes not in memory still goes to a thread, where
    waiting for storage blocks no other request."""
    src = on_disk / "src"
    write(src / "small.bin", os.urandom(50_000))
    write(src / "large.bin", os.urandom(file_bytes_module.INLINE_LIMIT + 1))
    write(src / "zeros.bin", bytes(2 * file_bytes_module.INLINE_LIMIT))  # a few KiB once compressed
    pack(src, on_disk / "ds", PackOptions(compress=True, progress=False))
    ops = _operations(on_disk / "ds")
    small, large, zeros = (ops.index.resolve(name) for name in (b"small.bin", b"large.bin", b"zeros.bin"))
    assert small is not None and large is not None and zeros is not None
    assert ops.index.stored[zeros] < file_bytes_module.INLINE_LIMIT
    (shard,) = (on_disk / "ds").glob("*.shard")
    for _ in range(10):  # this VM's DAMON may take a page of a file just read (docs/benchmarks.md)
        shard.read_bytes()
        if (inline := ops.file_bytes.load_cached(small)) is not None:
            break
    assert inline == (src / "small.bin").read_bytes()
    assert ops.file_bytes.load_cached(large) is None, "large files are read in a thread"
    assert ops.file_bytes.load_cached(zeros) is None, "and so are files that decompress large"
    drop_from_memory(shard)
    assert ops.file_bytes.load_cached(small) is None, "not in memory: it must not wait"
    assert _run(ops.file_bytes.read, small, 0, 1 << 20) == (src / "small.bin").read_bytes()


def test_evictions_hand_freed_memory_back_each_quarter_budget() -> None:
    """What the cache evicts stays in glibc's arenas until trimmed: the daemon's RSS grew to almost
    twice the cache's budget without it."""
    assert cache_module.trim_allocator is not None, "glibc's malloc_trim not found"
    cache = RamCache(1000)
    for row in range(4):
        cache.put(row, bytes(250))
    cache.put(4, bytes(250))
    assert (cache.evictions, cache.trims) == (1, 0), "a quarter evicted: not yet"
    cache.put(5, bytes(250))
    assert (cache.evictions, cache.trims) == (2, 1)
    for row in range(6, 12):
        cache.put(row, bytes(250))
    assert (cache.evictions, cache.stats()["trims"]) == (8, 4), "one every two evictions of 250"
    cache.put(11, bytes(250))  # replacing an entry evicts nothing
    assert (cache.evictions, cache.trims) == (8, 4)


class _Token:
    """Stands in for pyfuse3's ReaddirToken: the room left in the reply, the kind of request, and
    what was put in it (each name with its node id; None in plain READDIR)."""

    def __init__(self, size: int, plus: bool) -> None:
        self.size, self.plus = size, plus
        self.listed: list[tuple[bytes, int | None]] = []

    def take(self, records: bytes) -> None:
        head = dirents.DIRENT.itemsize + (dirents.ENTRY_OUT.itemsize if self.plus else 0)
        at = 0
        while at < len(records):
            (namelen,) = struct.unpack_from("=I", records, at + head - 8)
            nodeid = struct.unpack_from("=Q", records, at)[0] if self.plus else None
            self.listed.append((records[at + head : at + head + namelen], nodeid))
            at += (head + namelen + 7) & ~7
        self.size -= len(records)


def _list(
    ops: DlfsOperations, inode: int, token: _Token, monkeypatch: pytest.MonkeyPatch
) -> dict[bytes, int | None]:
    """The entries of one READDIR reply, '.' and '..' left out."""

    def raw(token: _Token, records) -> bool:  # type: ignore[no-untyped-def]
        if records.size > token.size:
            return False
        token.take(records.tobytes())
        return True

    monkeypatch.setattr(pyfuse3, "readdir_reply_raw", raw, raising=False)
    monkeypatch.setattr(pyfuse3, "readdir_reply", lambda token, name, entry, next_id: True)
    _run(ops.readdir, inode, 0, token)
    return dict(token.listed)


@pytest.mark.parametrize(
    ("auto", "plus", "wanted"),
    [(False, True, False), (True, False, False), (True, True, False), (True, True, True)],
)
def test_a_listing_carries_the_attributes_each_mode_wants(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, auto: bool, plus: bool, wanted: bool
) -> None:
    """With ``--readdirplus auto`` the kernel asks for attributes with the first request of every
    listing, as a probe: files then get none (a zero node id, so the kernel builds no inode for
    them), folders get theirs; a folder the read-ahead wants the files of gets them all. Every mode
    lists the whole folder in one reply."""
    files = {f"image-{k:05d}.JPEG".encode() for k in range(1000)}
    folders = {f"sub-{k}".encode() for k in range(3)}
    for name in files:
        write(tmp_path / "src" / "cls" / name.decode(), b"x")
    for name in folders:
        (tmp_path / "src" / "cls" / name.decode()).mkdir()
    pack(tmp_path / "src", tmp_path / "ds", PackOptions(progress=False))
    ops = _operations(tmp_path / "ds")
    ops.readdirplus_auto = auto
    cls = ops.index.resolve(b"cls")
    assert cls is not None
    if wanted:
        ops.known.want_attributes(cls)
    listed = _list(ops, cls + 1, _Token(1 << 20, plus), monkeypatch)
    assert set(listed) == files | folders
    for name, nodeid in listed.items():
        row = ops.index.lookup(cls, name)
        assert row is not None
        if not plus:
            assert nodeid is None
        elif auto and not wanted and name in files:
            assert nodeid == 0
        else:
            assert nodeid == row + 1
