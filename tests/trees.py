"""Source trees for the tests to pack: the odd tree, with every case a real dataset throws at pack,
packed in-process for the tests whose subject is not pack; and how a tree looks to ``find`` (what
a mount of it must show)."""

from __future__ import annotations

import os
import random
import subprocess
from pathlib import Path

from dlfs.pack import PackOptions, pack

#: Small shards so every odd tree spans several of them and has a file larger than one shard.
SMALL_SHARD = 64 * 1024
FIXED_NS = 1_600_000_000_123_456_789
#: (uid, gid) of entries of the odd tree that root does not own: numbers that need 32 bits, and
#: one pair shared by two entries.
OWNERS = {
    "plain.txt": (1234, 5678),
    "exec.sh": (4_000_000_000, 4_000_000_001),
    "many/file-0001.dat": (1234, 5678),
    "empty-dir": (70_000, 0),
    "link-to-file": (0, 65_536),
}


def write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """A file of ``data`` and ``mode`` at ``path``, its folders made as needed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode)


def make_odd_tree(root: Path) -> Path:
    """Every case a real dataset throws at pack: odd names, links, empties, depth, sizes, modes,
    owners (uids and gids past 16 bits, a directory and a symlink of their own)."""
    rng = random.Random(7)
    write(root / "plain.txt", b"hello dlfs\n")
    write(root / "empty.bin", b"")
    write(root / "with space.txt", b"spaces\n")
    write(root / "new\nline.txt", b"newline in name\n")
    write(root / "ünïcødé-名前.txt", b"unicode\n")
    write(root / "exec.sh", b"#!/bin/sh\necho hi\n", 0o755)
    write(root / "private", b"secret\n", 0o600)
    write(root / "readonly", b"ro\n", 0o444)
    write(root / "compressible.txt", b"the same line again\n" * 5000)
    write(root / "random.bin", rng.randbytes(100_000))
    write(root / "larger-than-a-shard.bin", rng.randbytes(5 * SMALL_SHARD + 123))
    (root / "empty-dir").mkdir()
    (root / "empty-dir-0700").mkdir(mode=0o700)
    deep = root / "deep"
    for level in range(40):
        deep = deep / f"d{level}"
    write(deep / "leaf.txt", b"deep leaf\n")
    for k in range(300):
        write(root / "many" / f"file-{k:04d}.dat", rng.randbytes(rng.randint(0, 3000)))
    for k in range(3):
        for j in range(20):
            write(
                root / "classes" / f"n0000000{k}" / f"n0000000{k}_{j}.JPEG",
                rng.randbytes(rng.randint(500, 20_000)),
            )
    raw = os.fsencode(root) + b"/non-utf8-\xff\xfe.bin"
    with open(raw, "wb") as f:
        f.write(b"latin junk name\n")
    os.symlink("plain.txt", root / "link-to-file")
    os.symlink("classes", root / "link-to-dir")
    os.symlink("/etc/hostname", root / "link-absolute-outside")
    os.symlink("../../../outside/of/src", root / "many" / "link-escaping")
    os.symlink("does-not-exist", root / "link-dangling")
    for path, (uid, gid) in OWNERS.items():
        os.chown(root / path, uid, gid, follow_symlinks=False)
    set_times(root)
    return root


def set_times(root: Path) -> None:
    """Distinct nanosecond mtimes, set bottom-up so directory times survive their children."""
    entries = sorted(Path(root).rglob("*"), key=lambda p: len(p.parts), reverse=True)
    for k, path in enumerate([*entries, Path(root)]):
        ns = FIXED_NS + k * 1_000_003
        os.utime(path, ns=(ns, ns), follow_symlinks=False)


def find_listing(root: Path) -> bytes:
    """Names, types, sizes, modes, owners, mtimes and link targets of every entry, as find prints
    them."""
    out = subprocess.run(
        ["find", ".", "-printf", r"%P %y %s %m %U %G %T@ %l\0"],
        cwd=root,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    return b"\0".join(sorted(out.split(b"\0")))


def pack_odd_tree(odd_tree: Path, dst: Path) -> Path:
    """The odd tree packed in this process, into small shards, at ``dst``."""
    pack(odd_tree, dst, PackOptions(shard_size=SMALL_SHARD, progress=False))
    return dst
