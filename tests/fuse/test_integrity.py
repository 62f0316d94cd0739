"""Damaged datasets: wrong bytes become EIO (never wrong data), bad shards and indexes are refused."""

from __future__ import annotations

import errno
import struct
from pathlib import Path

import pytest
from conftest import assert_one_line_error, dlfs, flip_byte, payload_place

from dlfs.core import format as fmt


def test_corrupt_file_reads_fail_with_eio_and_others_keep_working(packed: Path, mount) -> None:
    shard, offset, length = payload_place(packed, "random.bin")
    flip_byte(shard, offset + length // 2)
    log_file = packed.parent / "corrupt.log"
    with mount(packed, log_file=log_file) as mnt:
        for _ in range(3):
            with pytest.raises(OSError) as info:
                (Path(mnt) / "random.bin").read_bytes()
            assert info.value.errno == errno.EIO
        assert (Path(mnt) / "plain.txt").read_bytes() == b"hello dlfs\n"
    errors = [line for line in log_file.read_text().splitlines() if "checksum mismatch" in line]
    assert len(errors) == 1, errors
    assert shard.name in errors[0] and f"offset {offset}" in errors[0] and "random.bin" in errors[0]


def test_verify_reports_each_bad_file_and_exits_non_zero(packed: Path) -> None:
    assert dlfs("verify", packed).returncode == 0
    for name in ("random.bin", "many/file-0007.dat"):
        shard, offset, length = payload_place(packed, name)
        flip_byte(shard, offset + length - 1)
    result = dlfs("verify", packed, check=False)
    assert result.returncode == 1
    bad = [line for line in result.stdout.splitlines() if line.startswith("BAD")]
    assert len(bad) == 2 and any("random.bin" in line for line in bad)
    assert "2 BAD" in result.stdout


def test_corrupt_lz4_payload_is_eio_not_garbage(odd_tree: Path, tmp_path: Path, mount) -> None:
    dst = tmp_path / "lz4"
    dlfs("pack", odd_tree, dst, "--compress", "lz4")
    shard, offset, _ = payload_place(dst, "compressible.txt")
    flip_byte(shard, offset + 1)
    with mount(dst) as mnt, pytest.raises(OSError) as info:
        (Path(mnt) / "compressible.txt").read_bytes()
    assert info.value.errno == errno.EIO


def test_missing_shard_is_named_and_the_mount_refused(packed: Path, tmp_path: Path) -> None:
    shard = sorted(packed.glob("*.shard"))[1]
    shard.unlink()
    (tmp_path / "mnt").mkdir()
    assert_one_line_error(dlfs("mount", packed, tmp_path / "mnt", check=False), shard.name, "missing")
    assert_one_line_error(dlfs("verify", packed, check=False), shard.name)


def test_truncated_shard_is_named_and_the_mount_refused(packed: Path, tmp_path: Path) -> None:
    shard = sorted(packed.glob("*.shard"))[0]
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 10)
    (tmp_path / "mnt").mkdir()
    assert_one_line_error(dlfs("mount", packed, tmp_path / "mnt", check=False), shard.name, "bytes")


def test_shard_from_another_pack_is_refused(packed: Path, odd_tree: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    dlfs("pack", odd_tree, other, "--shard-size", "64K")
    mine, theirs = sorted(packed.glob("*.shard"))[0], sorted(other.glob("*.shard"))[0]
    mine.write_bytes(theirs.read_bytes())
    (tmp_path / "mnt").mkdir()
    assert_one_line_error(dlfs("mount", packed, tmp_path / "mnt", check=False), "does not belong")


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda raw: raw[: len(raw) // 2], "truncated"),
        (lambda raw: raw[:40], "too short"),
        (lambda raw: b"PK\x03\x04" + raw[4:], "not a dlfs index"),
        (lambda raw: raw[:8] + struct.pack("<I", fmt.FORMAT_VERSION + 1) + raw[12:], "upgrade dlfs"),
        (lambda raw: raw[:100] + bytes([raw[100] ^ 1]) + raw[101:], "corrupt"),
    ],
    ids=["truncated", "tiny", "foreign", "newer-version", "bit-flip"],
)
def test_damaged_index_is_a_clear_error_at_mount(packed: Path, tmp_path: Path, damage, message: str) -> None:
    index = packed / fmt.INDEX_NAME
    index.write_bytes(damage(index.read_bytes()))
    (tmp_path / "mnt").mkdir()
    assert_one_line_error(dlfs("mount", packed, tmp_path / "mnt", check=False), message)
    assert_one_line_error(dlfs("ls", packed, check=False), message)
