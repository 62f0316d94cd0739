"""A local tar read where its bytes lie (``positional.LocalTar``): bytes the page cache lacks are read
directly (``O_DIRECT``), around any offset and length, and come back as the file holds them; bytes
it holds are read through it. A pack of a cold tar, read so, indexes what a warm one does."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from archives import tar_bytes
from commands import dlfs
from mounts import mounted
from page_cache import drop_from_memory

from dlfs.core import libc
from dlfs.pack.archive.positional import LocalTar


@pytest.fixture
def cold_file(on_disk: Path) -> Path:
    """Random bytes on a disk (``/var/tmp``), not in the page cache."""
    path = on_disk / "bytes.bin"
    path.write_bytes(random.Random(5).randbytes(3 << 20))
    drop_from_memory(path)
    return path


@pytest.mark.parametrize(
    ("offset", "length"),
    [(0, 4096), (512, 1 << 20), (4096 + 512, 100_000), ((3 << 20) - 700, 4096), (123 * 512, 1)],
    ids=["aligned", "512-aligned", "odd-length", "past-the-end", "one-byte"],
)
def test_bytes_the_page_cache_lacks_are_read_directly_and_exactly(
    cold_file: Path, offset: int, length: int
) -> None:
    expected = cold_file.read_bytes()[offset : offset + length]
    drop_from_memory(cold_file)
    with open(cold_file, "rb") as f:
        tar = LocalTar(str(cold_file), f.fileno())
        try:
            assert tar.direct is not None, "ext4 reads directly"
            view = memoryview(bytearray(length))
            got = tar.read_into(view, offset)
            assert bytes(view[:got]) == expected
            assert libc.in_memory(f.fileno(), offset, len(expected)) is False, "read past the page cache"
        finally:
            tar.close()


def test_bytes_the_page_cache_holds_are_read_through_it(cold_file: Path) -> None:
    expected = cold_file.read_bytes()  # now cached
    with open(cold_file, "rb") as f:
        tar = LocalTar(str(cold_file), f.fileno())
        try:
            view = memoryview(bytearray(len(expected)))
            assert tar.read_into(view, 0) == len(expected) and bytes(view) == expected
        finally:
            tar.close()


@pytest.mark.parametrize("in_place", [False, True], ids=["packed", "in-place"])
def test_a_cold_tar_packs_as_a_warm_one(on_disk: Path, in_place: bool) -> None:
    rng = random.Random(9)
    members = [(f"cls/{k:03d}.jpg", rng.randbytes(rng.randint(0, 300_000))) for k in range(40)]
    tar = on_disk / "t.tar"
    tar.write_bytes(tar_bytes(members))
    flags = ["--in-place"] if in_place else []
    dlfs("pack", tar, on_disk / "warm", *flags)
    drop_from_memory(tar)
    dlfs("pack", tar, on_disk / "cold", *flags)
    with mounted(on_disk / "cold", on_disk / "mnt") as mnt:
        assert {name: (mnt / name).read_bytes() for name, _ in members} == dict(members)
    assert dlfs("verify", on_disk / "warm").returncode == 0
    warm = os.stat(on_disk / "warm" / "index.dlfs").st_size
    assert os.stat(on_disk / "cold" / "index.dlfs").st_size == warm
