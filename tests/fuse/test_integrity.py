"""Damaged datasets, one table: each damage has one documented outcome, never wrong bytes.

Damage to a file's stored bytes makes that file, and only that file, fail with EIO through a real
mount (logged once, with shard and offset), while every other file reads back equal to the source;
``dlfs verify`` lists it and exits 1. Damage to a shard as a whole or to the index makes ``dlfs
mount``, ``dlfs verify`` and ``dlfs ls`` refuse at once with one line that says what is wrong.
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from commands import assert_one_line_error, dlfs
from damage import flip_byte, payload_place
from mounts import is_mounted
from trees import SMALL_SHARD, find_listing

from dlfs.core import format as fmt
from dlfs.pack import PackOptions, pack

PAGE = 4096


@dataclass(frozen=True)
class Damage:
    """``damage(dataset, scratch)`` breaks the dataset and returns the files it hit (``eio``) or
    further words the refusal must contain (``refused``)."""

    damage: Callable[[Path, Path], tuple[str, ...]]
    outcome: str  # "eio", "refused" (mount and verify) or "refused index" (ls too)
    words: tuple[str, ...] = ()
    lz4: bool = False


def flipped(*names: str) -> Callable[[Path, Path], tuple[str, ...]]:
    def damage(dataset: Path, scratch: Path) -> tuple[str, ...]:
        for name in names:
            shard, offset, length = payload_place(dataset, name)
            flip_byte(shard, offset + length // 2)
        return names

    return damage


def zeroed_page(dataset: Path, scratch: Path) -> tuple[str, ...]:
    """A 4 KiB page of zeros inside one file's bytes, as a lost write leaves it."""
    shard, offset, length = payload_place(dataset, "random.bin")
    page = -(-offset // PAGE) * PAGE
    assert page + PAGE <= offset + length
    with open(shard, "r+b") as f:
        os.pwrite(f.fileno(), bytes(PAGE), page)
    return ("random.bin",)


def shard_of(dataset: Path, number: int) -> Path:
    return sorted(dataset.glob("*.shard"))[number]


def truncated_shard(dataset: Path, scratch: Path) -> tuple[str, ...]:
    shard = shard_of(dataset, 0)
    os.truncate(shard, shard.stat().st_size - 10)
    return (shard.name,)


def deleted_shard(dataset: Path, scratch: Path) -> tuple[str, ...]:
    shard = shard_of(dataset, 1)
    shard.unlink()
    return (shard.name,)


def foreign_shard(dataset: Path, scratch: Path) -> tuple[str, ...]:
    other = scratch / "other"
    pack(dataset.parent / "src", other, PackOptions(shard_size=SMALL_SHARD, progress=False))
    shard_of(dataset, 0).write_bytes(shard_of(other, 0).read_bytes())
    return ()


def index_edit(change: Callable[[bytes], bytes]) -> Callable[[Path, Path], tuple[str, ...]]:
    def damage(dataset: Path, scratch: Path) -> tuple[str, ...]:
        index = dataset / fmt.INDEX_NAME
        index.write_bytes(change(index.read_bytes()))
        return ()

    return damage


def deleted_index(dataset: Path, scratch: Path) -> tuple[str, ...]:
    (dataset / fmt.INDEX_NAME).unlink()
    return ()


def crafted_name(raw: bytes) -> bytes:
    """A name with '/' in an index whose checksum holds: written by something other than pack."""
    decoded = fmt.decode_index(memoryview(raw), "valid")
    arrays = {name: np.array(column) for name, column in decoded.arrays.items()}
    arrays["names"][int(arrays["name_off"][1])] = ord("/")
    return fmt.encode_index(arrays, {k: v for k, v in decoded.meta.items() if k != "sections"})


CASES: dict[str, Damage] = {
    "flipped byte": Damage(flipped("random.bin"), "eio"),
    "flipped bytes in two files": Damage(flipped("random.bin", "many/file-0007.dat"), "eio"),
    "flipped byte in lz4": Damage(flipped("compressible.txt"), "eio", lz4=True),
    "zeroed page": Damage(zeroed_page, "eio"),
    "truncated shard": Damage(truncated_shard, "refused", ("bytes", "restore it")),
    "deleted shard": Damage(deleted_shard, "refused", ("missing",)),
    "shard of another pack": Damage(foreign_shard, "refused", ("does not belong",)),
    "index cut short": Damage(index_edit(lambda raw: raw[: len(raw) // 2]), "refused index", ("truncated",)),
    "index of 40 bytes": Damage(index_edit(lambda raw: raw[:40]), "refused index", ("too short",)),
    "newer index format": Damage(
        index_edit(lambda raw: raw[:8] + struct.pack("<I", fmt.FORMAT_VERSION + 1) + raw[12:]),
        "refused index",
        ("newer than this dlfs", "upgrade dlfs"),
    ),
    "flipped bit in the index": Damage(
        index_edit(lambda raw: raw[:100] + bytes([raw[100] ^ 1]) + raw[101:]), "refused index", ("corrupt",)
    ),
    "not an index": Damage(
        index_edit(lambda raw: b"PK\x03\x04" + raw[4:]), "refused index", ("not a dlfs index",)
    ),
    "crafted index": Damage(
        index_edit(crafted_name), "refused index", ("not a valid dlfs index", "'/' or NUL")
    ),
    "deleted index": Damage(deleted_index, "refused index", ("not a dlfs dataset",)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_damage_has_its_documented_outcome_and_never_wrong_bytes(
    case: str, odd_tree: Path, tmp_path: Path, mount
) -> None:
    damage = CASES[case]
    dataset = tmp_path / "dataset"
    pack(odd_tree, dataset, PackOptions(shard_size=SMALL_SHARD, progress=False, compress=damage.lz4))
    hit = damage.damage(dataset, tmp_path)
    if damage.outcome == "eio":
        assert_only_these_files_fail(dataset, odd_tree, hit, tmp_path, mount)
    else:
        assert_refused(dataset, tmp_path, (*damage.words, *hit), damage.outcome == "refused index")


def assert_only_these_files_fail(
    dataset: Path, source: Path, hit: tuple[str, ...], tmp_path: Path, mount
) -> None:
    """EIO, every time, for the files hit; the right bytes for every other file; one log line per
    bad file with its shard and offset; ``dlfs verify`` lists exactly the files hit."""
    log_file = tmp_path / "damaged.log"
    with mount(dataset, log_file=log_file) as mnt:
        for name in hit:
            for _ in range(3):
                with pytest.raises(OSError) as info:
                    (mnt / name).read_bytes()
                assert info.value.errno == errno.EIO
        good = 0
        for path in sorted(source.rglob("*")):
            name = str(path.relative_to(source))
            if path.is_file() and not path.is_symlink() and name not in hit:
                assert (mnt / name).read_bytes() == path.read_bytes(), name
                good += 1
        assert good > 300
    errors = [line for line in log_file.read_text().splitlines() if "ERROR" in line]
    for name in hit:
        shard, offset, _ = payload_place(dataset, name)
        lines = [line for line in errors if name in line]
        assert len(lines) == 1 and shard.name in lines[0] and f"offset {offset}" in lines[0], errors
    result = dlfs("verify", dataset, check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    bad = sorted(
        line.split()[1].rstrip(":") for line in result.stdout.splitlines() if line.startswith("BAD ")
    )
    assert bad == sorted(hit) and f"{len(hit)} BAD" in result.stdout


def assert_refused(dataset: Path, tmp_path: Path, words: tuple[str, ...], index: bool) -> None:
    """``dlfs mount`` refuses with one line and leaves nothing mounted; ``verify`` too, and for a
    damaged index ``ls`` (which reads no shard)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    assert_one_line_error(dlfs("mount", dataset, mnt, check=False), *words)
    assert not is_mounted(mnt)
    assert_one_line_error(dlfs("verify", dataset, check=False), *words)
    if index:
        assert_one_line_error(dlfs("ls", dataset, check=False), *words)


@pytest.mark.parametrize("change", ["overwritten", "truncated"])
def test_an_index_changed_under_a_live_mount_changes_nothing_it_serves(
    change: str, odd_tree: Path, packed: Path, mount
) -> None:
    """The mount serves the index it checked: bytes written over the file in place (as ``rsync
    --inplace`` of another version does) or a cut (which would kill a daemon reading a map of the
    file with SIGBUS) change no name, attribute or byte it serves, with the kernel's caches dropped
    so that every lookup and read reaches the daemon."""
    index = packed / fmt.INDEX_NAME
    with mount(packed) as mnt:
        before = find_listing(mnt)
        with open(index, "r+b") as f:
            if change == "truncated":
                f.truncate(100)
            else:
                size = os.fstat(f.fileno()).st_size
                os.pwrite(f.fileno(), np.random.default_rng(3).bytes(size - 2 * PAGE), PAGE)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        assert find_listing(mnt) == before
        for path in sorted(odd_tree.rglob("*")):
            if path.is_file() and not path.is_symlink():
                assert (mnt / path.relative_to(odd_tree)).read_bytes() == path.read_bytes(), path
