"""The native request server's handlers (``dlfs/fuse/_handlers.c``) against the index, without a mount.

A socket pair stands in for ``/dev/fuse``: each request goes to ``dlfs_answer`` as the thread loop
hands it what it read from the kernel, and the reply it writes to its end is read back from the
other, so the tests see exactly what the kernel would be told. A request the handlers leave to
Python gets no reply from them.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import stat
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from damage import flip_byte, payload_place
from trees import SMALL_SHARD

from dlfs.core import format as fmt
from dlfs.core.index import Index
from dlfs.core.protocol import CONTROL_NAME
from dlfs.core.store.local import LocalStore
from dlfs.fuse import dirents, server
from dlfs.pack import PackOptions, pack

#: Opcodes (include/uapi/linux/fuse.h).
LOOKUP, GETATTR, OPEN, READ, STATFS, INIT = 1, 3, 14, 15, 17, 26
READDIR, INTERRUPT, IOCTL, READDIRPLUS = 28, 36, 39, 44
#: struct fuse_in_header: len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding.
IN_HEADER = struct.Struct("=IIQQIIIHH")
#: struct fuse_out_header: len, error (-errno), unique.
OUT_HEADER = struct.Struct("=IiQ")
#: struct fuse_read_in (READ and READDIR): fh, offset, size, read_flags, lock_owner, flags, padding.
READ_IN = struct.Struct("=QQIIQII")
#: struct fuse_kstatfs: blocks, bfree, bavail, files, ffree, bsize, namelen, frsize, padding, spare.
STATFS_OUT = struct.Struct("=5Q4I24x")
#: struct fuse_attr_out: attr_valid, attr_valid_nsec, dummy, then struct fuse_attr.
ATTR_HEAD = 16
#: Where struct fuse_entry_out holds its struct fuse_attr.
ATTR_IN_ENTRY = dirents.ENTRY_OUT.fields["ino"][1]
#: The kernel's default largest READ, and what the socket pair carries in one message.
MAX_READ = 128 << 10
TIMEOUT = 3600.0
BLKSIZE = (4096, 1 << 20)
STATFS_BLOCK = 4096


class Kernel:
    """The kernel's end of the socket pair; the handlers answer through the other end."""

    def __init__(self, handlers: server.Handlers) -> None:
        self.handlers = handlers
        self.ours, self._theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        lib = handlers.library
        lib.dlfs_answerer_new.restype = ctypes.c_void_p
        lib.dlfs_answerer_new.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.dlfs_answer.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
        lib.dlfs_answerer_free.argtypes = [ctypes.c_void_p]
        self._answer = lib.dlfs_answer
        self._answerer = lib.dlfs_answerer_new(handlers.pointer, self._theirs.fileno())
        assert self._answerer
        self._unique = 0

    def send(self, request: bytes) -> tuple[bool, bytes | None]:
        """Whether the handlers answered ``request``, and the reply they wrote (None: none)."""
        answered = bool(self._answer(self._answerer, request, len(request)))
        try:
            return answered, self.ours.recv(2 * MAX_READ, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return answered, None

    def ask(self, opcode: int, nodeid: int, body: bytes = b"") -> tuple[int, bytes] | None:
        """(errno, payload) of the reply to a well-formed request, or None when the handlers leave
        it to Python, which then owes the reply."""
        self._unique += 1
        header = IN_HEADER.pack(IN_HEADER.size + len(body), opcode, self._unique, nodeid, 0, 0, 0, 0, 0)
        answered, reply = self.send(header + body)
        if not answered:
            assert reply is None, "a request left to Python was answered too"
            return None
        assert reply is not None, f"opcode {opcode} answered without a reply"
        length, error, unique = OUT_HEADER.unpack_from(reply)
        assert (length, unique) == (len(reply), self._unique)
        return -error, reply[OUT_HEADER.size :]

    def lookup(self, parent: int, name: bytes) -> tuple[int, bytes] | None:
        return self.ask(LOOKUP, parent, name + b"\0")

    def read(self, opcode: int, nodeid: int, offset: int, size: int) -> tuple[int, bytes] | None:
        return self.ask(opcode, nodeid, READ_IN.pack(0, offset, size, 0, 0, 0, 0))

    def close(self) -> None:
        self.handlers.library.dlfs_answerer_free(self._answerer)
        self.ours.close()
        self._theirs.close()


class Dataset:
    """A packed dataset's index and open shards, and ``kernel``: handlers over them."""

    def __init__(self, path: Path) -> None:
        self.store = LocalStore(path)
        self.index = Index.load(self.store)
        fds = [self.store.descriptor(name) for name in self.index.shard_names]
        self.shard_fds = np.array(fds, dtype=np.int32)
        self.wanted = np.zeros(self.index.count, dtype=np.uint8)
        self._opened: list[tuple[server.Handlers, Kernel]] = []

    def kernel(self, readdirplus_auto: bool = True) -> Kernel:
        handlers = server.Handlers(
            self.index,
            self.shard_fds,
            CONTROL_NAME,
            TIMEOUT,
            BLKSIZE,
            STATFS_BLOCK,
            0,
            self.wanted,
            readdirplus_auto,
        )
        kernel = Kernel(handlers)
        self._opened.append((handlers, kernel))
        return kernel

    def close(self) -> None:
        for handlers, kernel in self._opened:
            kernel.close()
            handlers.close()
        self.store.close()


@pytest.fixture
def dataset(packed: Path) -> Iterator[Dataset]:
    d = Dataset(packed)
    try:
        yield d
    finally:
        d.close()


@pytest.fixture
def kernel(dataset: Dataset) -> Kernel:
    return dataset.kernel()


def _entry(payload: bytes) -> np.void:
    assert len(payload) == dirents.ENTRY_OUT.itemsize
    return np.frombuffer(payload, dirents.ENTRY_OUT)[0]


def _walk(kernel: Kernel, root: Path) -> Iterator[tuple[Path, np.void]]:
    """Every entry under ``root`` and the entry LOOKUPs gave it, looked up name by name from the
    mount's root, as the kernel resolves a path."""
    inodes = {root: 1}
    for folder, dirs, names in os.walk(root):
        for name in sorted(dirs + names):
            got = kernel.lookup(inodes[Path(folder)], os.fsencode(name))
            assert got is not None and got[0] == 0, (folder, name, got)
            entry = _entry(got[1])
            inodes[Path(folder, name)] = int(entry["nodeid"])
            yield Path(folder, name), entry


def test_lookup_and_getattr_give_each_entry_the_source_trees_attributes(
    odd_tree: Path, kernel: Kernel
) -> None:
    seen = 0
    for path, entry in _walk(kernel, odd_tree):
        s = os.lstat(path)
        mtime = int(entry["mtime"]) * 1_000_000_000 + int(entry["mtimensec"])
        attrs = [int(entry[f]) for f in ("mode", "nlink", "uid", "gid", "size")]
        assert [*attrs, mtime] == [s.st_mode, s.st_nlink, s.st_uid, s.st_gid, s.st_size, s.st_mtime_ns], path
        assert entry["ino"] == entry["nodeid"] and entry["entry_valid"] == entry["attr_valid"] == TIMEOUT
        attr = kernel.ask(GETATTR, int(entry["nodeid"]))
        assert attr is not None and attr[0] == 0
        # struct fuse_attr_out carries the struct fuse_attr of the entry.
        assert attr[1][ATTR_HEAD:] == entry.tobytes()[ATTR_IN_ENTRY:]
        seen += 1
    assert seen > 400


def test_dot_and_dotdot_name_the_folder_and_its_parent(dataset: Dataset, kernel: Kernel) -> None:
    index = dataset.index
    deep = index.resolve(b"deep/d0/d1")
    assert deep is not None
    for name, row in ((b".", deep), (b"..", int(index.parent[deep]))):
        got = kernel.lookup(deep + 1, name)
        assert got is not None and got[0] == 0 and _entry(got[1])["nodeid"] == row + 1


@pytest.mark.parametrize(
    "folder, name",
    [
        (b"", b"missing"),
        (b"", b"plain.tx"),
        (b"", b"plain.txt2"),
        (b"many", b"file-9999.dat"),
        (b"plain.txt", b"x"),
    ],
    ids=["absent", "prefix", "longer", "in-a-subfolder", "under-a-file"],
)
def test_a_name_that_is_not_there_is_enoent(
    dataset: Dataset, kernel: Kernel, folder: bytes, name: bytes
) -> None:
    row = dataset.index.resolve(folder) if folder else 0
    assert row is not None
    assert kernel.lookup(row + 1, name) == (errno.ENOENT, b"")


def test_the_control_tree_is_left_to_python_and_only_at_the_root(dataset: Dataset, kernel: Kernel) -> None:
    assert kernel.lookup(1, CONTROL_NAME) is None
    many = dataset.index.resolve(b"many")
    assert many is not None and kernel.lookup(many + 1, CONTROL_NAME) == (errno.ENOENT, b"")


def test_inodes_outside_the_dataset_are_left_to_python(dataset: Dataset, kernel: Kernel) -> None:
    """Inode 0 is no inode; those past the dataset's rows are the control tree's, which Python serves."""
    for inode in (0, dataset.index.count + 1, dataset.index.count + 7, 1 << 63):
        assert kernel.lookup(inode, b"plain.txt") is None
        assert kernel.ask(GETATTR, inode) is None
        assert kernel.read(READ, inode, 0, 4096) is None
        assert kernel.read(READDIR, inode, 0, 4096) is None
        assert kernel.read(READDIRPLUS, inode, 0, 4096) is None


def test_malformed_and_unknown_requests_are_left_to_python(dataset: Dataset, kernel: Kernel) -> None:
    plain = dataset.index.resolve(b"plain.txt")
    assert plain is not None
    assert kernel.send(IN_HEADER.pack(IN_HEADER.size, GETATTR, 1, 1, 0, 0, 0, 0, 0)[:-1]) == (False, None)
    assert kernel.ask(LOOKUP, 1, b"plain.txt") is None  # a name without its terminating NUL
    short = READ_IN.pack(0, 0, 4096, 0, 0, 0, 0)[:-1]
    for opcode in (READ, READDIR, READDIRPLUS):
        assert kernel.ask(opcode, plain + 1, short) is None
    for opcode in (OPEN, INIT, 4000):
        assert kernel.ask(opcode, plain + 1) is None
    assert kernel.read(READDIR, plain + 1, 0, 4096) is None  # a file has no listing
    assert kernel.read(READ, 1, 0, 4096) is None  # nor a folder bytes


def test_ioctl_is_enotty_statfs_counts_the_dataset_and_interrupt_needs_no_reply(
    dataset: Dataset, kernel: Kernel
) -> None:
    plain = dataset.index.resolve(b"plain.txt")
    assert plain is not None
    assert kernel.ask(IOCTL, plain + 1, bytes(32)) == (errno.ENOTTY, b"")  # isatty()
    got = kernel.ask(STATFS, 1)
    assert got is not None and got[0] == 0
    blocks, _, _, files, _, bsize, namelen, frsize, _ = STATFS_OUT.unpack(got[1])
    index = dataset.index
    assert (blocks, files, bsize, frsize, namelen) == (
        -(-index.total_stored // STATFS_BLOCK), index.count, STATFS_BLOCK, STATFS_BLOCK, 255
    )  # fmt: skip
    interrupt = IN_HEADER.pack(IN_HEADER.size + 8, INTERRUPT, 99, 0, 0, 0, 0, 0, 0) + struct.pack("=Q", 98)
    assert kernel.send(interrupt) == (True, None)


def _read_whole(kernel: Kernel, inode: int, size: int, chunk: int) -> bytes:
    """A file read as the kernel reads it: ``chunk`` bytes at a time, and once past its end."""
    data = b""
    for offset in range(0, size + 1, chunk):
        got = kernel.read(READ, inode, offset, chunk)
        assert got is not None and got[0] == 0, (inode, offset)
        data += got[1]
    assert kernel.read(READ, inode, size + chunk, chunk) == (0, b"")
    return data


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "lz4"])
def test_reads_return_every_file_whole_in_any_request_size(
    odd_tree: Path, tmp_path: Path, compress: bool
) -> None:
    """Files of several READs come from the slots they share (16 of them for all files): read in
    turns, each file's next READ may find its slot taken by another's."""
    pack(odd_tree, tmp_path / "d", PackOptions(shard_size=SMALL_SHARD, compress=compress, progress=False))
    dataset = Dataset(tmp_path / "d")
    try:
        kernel = dataset.kernel()
        index = dataset.index
        assert bool((index.flags & fmt.FLAG_LZ4).any()) == compress
        files = [(p, index.resolve(os.fsencode(p.relative_to(odd_tree)))) for p in _regular(odd_tree)]
        assert any(p.stat().st_size > MAX_READ for p, _ in files)
        for chunk in (4096, MAX_READ):
            got = {p: b"" for p, _ in files}
            for turn in range(max(p.stat().st_size for p, _ in files) // chunk + 1):
                for p, row in files:
                    reply = kernel.read(READ, row + 1, turn * chunk, chunk)
                    assert reply is not None and reply[0] == 0, p
                    got[p] += reply[1]
            for p, _ in files:
                assert got[p] == p.read_bytes(), (p, chunk)
    finally:
        dataset.close()


def _regular(root: Path) -> list[Path]:
    return sorted(
        Path(folder, name)
        for folder, _, names in os.walk(root)
        for name in names
        if stat.S_ISREG(os.lstat(Path(folder, name)).st_mode)
    )


def test_a_file_that_does_not_match_its_checksum_is_left_to_python(
    odd_tree: Path, packed: Path, dataset: Dataset, kernel: Kernel
) -> None:
    """Python answers it with EIO and logs it; the handlers never return its bytes."""
    shard, offset, length = payload_place(packed, "random.bin")
    flip_byte(shard, offset + length // 2)
    index = dataset.index
    bad, good = index.resolve(b"random.bin"), index.resolve(b"plain.txt")
    assert bad is not None and good is not None
    assert kernel.read(READ, bad + 1, 0, MAX_READ) is None
    assert kernel.read(READ, good + 1, 0, MAX_READ) == (0, (odd_tree / "plain.txt").read_bytes())


def test_reads_the_read_ahead_watches_are_left_to_python(
    odd_tree: Path, dataset: Dataset, kernel: Kernel
) -> None:
    plain = dataset.index.resolve(b"plain.txt")
    assert plain is not None
    assert kernel.read(READ, plain + 1, 0, 4096) == (0, (odd_tree / "plain.txt").read_bytes())
    kernel.handlers.watch_reads()
    assert kernel.read(READ, plain + 1, 0, 4096) is None


def _records(payload: bytes, plus: bool) -> list[tuple[bytes, int, int]]:
    """(name, inode, next offset) of each record of a listing."""
    head = dirents.DIRENT.itemsize + (dirents.ENTRY_OUT.itemsize if plus else 0)
    out, at = [], 0
    while at < len(payload):
        d = np.frombuffer(payload, dirents.DIRENT, 1, at + head - dirents.DIRENT.itemsize)[0]
        out.append((payload[at + head : at + head + int(d["namelen"])], int(d["ino"]), int(d["off"])))
        at += (head + int(d["namelen"]) + 7) & ~7
    return out


@pytest.mark.parametrize("opcode", [READDIR, READDIRPLUS])
def test_a_listing_is_dot_dotdot_then_the_records_the_python_encoder_writes(
    dataset: Dataset, kernel: Kernel, opcode: int
) -> None:
    """READDIRPLUS here gives folders their attributes and files none (``Attributes.DIRS``); each
    folder listed from its start with any children is passed on to the lister once."""
    plus = opcode == READDIRPLUS
    attrs = dirents.Attributes.DIRS if plus else dirents.Attributes.NONE
    index, space = dataset.index, 64 << 10
    dots = 2 * (dirents.DIRENT.itemsize + (dirents.ENTRY_OUT.itemsize if plus else 0) + 8)
    folders = [row for row in range(index.count) if stat.S_ISDIR(int(index.mode[row]))]
    for row in folders:
        got = kernel.read(opcode, row + 1, 0, space)
        assert got is not None and got[0] == 0
        assert _records(got[1][:dots], plus) == [(b".", row + 1, 1), (b"..", int(index.parent[row]) + 1, 2)]
        expected, count = dirents.encode(
            index, index.children(row), 3, space - dots, attrs, 1, TIMEOUT, BLKSIZE
        )
        assert count == len(index.children(row)) and got[1][dots:] == expected.tobytes()
    assert sorted(kernel.handlers.take_scanned()) == [row for row in folders if index.children(row)]
    assert kernel.handlers.scans_pending() == 0


@pytest.mark.parametrize("opcode", [READDIR, READDIRPLUS])
def test_a_listing_resumes_where_each_reply_left_off(dataset: Dataset, kernel: Kernel, opcode: int) -> None:
    index = dataset.index
    many = index.resolve(b"many")
    assert many is not None
    names, offset = [], 0
    while got := kernel.read(opcode, many + 1, offset, 400):
        assert got[0] == 0
        if not got[1]:
            break
        records = _records(got[1], opcode == READDIRPLUS)
        names += [name for name, _, _ in records]
        offset = records[-1][2]
    assert names == [b".", b"..", *(index.name(row) for row in index.children(many))]
    assert kernel.handlers.take_scanned() == [many]  # only the listing's first reply counts


def test_listings_that_must_give_every_entry_attributes_are_left_to_python(dataset: Dataset) -> None:
    """READDIRPLUS of a folder the read-ahead lists for its inodes, and any READDIRPLUS where the
    kernel was not asked for READDIRPLUS_AUTO (it then wants every entry's attributes)."""
    many = dataset.index.resolve(b"many")
    assert many is not None
    auto, always = dataset.kernel(), dataset.kernel(readdirplus_auto=False)
    assert auto.read(READDIRPLUS, many + 1, 0, 4096) is not None
    assert always.read(READDIRPLUS, many + 1, 0, 4096) is None
    dataset.wanted[many] = 1  # the read-ahead's KernelKnowledge.want_attributes
    assert auto.read(READDIRPLUS, many + 1, 0, 4096) is None
    assert auto.read(READDIR, many + 1, 0, 4096) is not None
