"""Archives that are damaged, cut short or lie, and failures that are not the archive's: each is one
line that says what is wrong and what to do, with nothing published and nothing left behind. A
damaged archive names the member or offset; a full disk says so; a bug says it is one."""

from __future__ import annotations

import gzip
import io
import os
import signal
import struct
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest
from archives import assert_refused, crafted_tar, seal, tar_bytes
from commands import DLFS, assert_one_line_error, dlfs
from page_cache import tmpfs
from waits import wait_for_files

from dlfs.core.errors import PackError
from dlfs.pack import PackOptions, pack
from dlfs.pack.archive import streams
from dlfs.pack.archive.streams import ArchiveStream

DLFS_PACK = [*DLFS, "-q", "pack"]


@pytest.mark.parametrize("cut", [512 + 3, 1024 + 1000, 1536 + 100, 4096])
def test_a_truncated_tar_is_refused(tmp_path: Path, cut: int) -> None:
    """Cut in a member's data, in a header, and just before the end-of-archive marker."""
    whole = tar_bytes([("a", b"a" * 700), ("b", b"b" * 2000)])
    archive = tmp_path / "cut.tar"
    archive.write_bytes(whole[:cut])
    assert_refused(tmp_path, archive, "cut short")


def test_a_damaged_header_is_refused_with_its_offset(tmp_path: Path) -> None:
    raw = bytearray(tar_bytes([("a", b"a" * 700), ("b", b"b")]))
    raw[1536 + 100 : 1536 + 108] = b"zzzzzzz\0"  # b's mode: not a number, under a checksum that holds
    seal(raw, 1536)
    archive = tmp_path / "bad.tar"
    archive.write_bytes(bytes(raw))
    assert_refused(tmp_path, archive, "damaged header at byte 1,536")


def test_a_pax_header_claiming_exabytes_is_refused_in_one_line(tmp_path: Path) -> None:
    """Its records are read piece by piece to the end of the file, never allocated up front."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as out:
        info = tarfile.TarInfo("p" * 200)  # a pax record holds the long path
        info.size = 3
        out.addfile(info, io.BytesIO(b"abc"))
    raw = bytearray(buffer.getvalue())
    assert raw[156:157] == tarfile.XHDTYPE
    raw[124:136] = b"\x80" + (2**62).to_bytes(11, "big")  # its size, in base-256
    seal(raw, 0)
    archive = tmp_path / "pax.tar"
    archive.write_bytes(bytes(raw))
    assert_refused(tmp_path, archive, "pax.tar")


def test_a_sparse_map_that_is_not_numbers_is_damage_not_a_bug(tmp_path: Path) -> None:
    """``tarfile`` raises a plain ValueError on such a pax record: the archive's fault all the same."""
    info = tarfile.TarInfo("s")
    info.pax_headers = {"GNU.sparse.map": "0,zz", "GNU.sparse.realsize": "10"}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as out:
        out.addfile(info, io.BytesIO(b""))
    archive = tmp_path / "s.tar"
    archive.write_bytes(buffer.getvalue())
    assert_refused(tmp_path, archive, "damaged header at byte 0")


@pytest.mark.parametrize("compress", ["gz", "zst"])
def test_a_corrupt_compressed_stream_is_refused(tmp_path: Path, compress: str) -> None:
    plain = crafted_tar(tmp_path / "x.tar", [(f"f{k}", os.urandom(3000)) for k in range(20)])
    if compress == "gz":
        data = bytearray(gzip.compress(plain.read_bytes()))
    else:
        subprocess.run(["zstd", "-q", plain, "-o", tmp_path / "x.tar.zst"], check=True, timeout=60)
        data = bytearray((tmp_path / "x.tar.zst").read_bytes())
    plain.unlink()
    (tmp_path / "x.tar.zst").unlink(missing_ok=True)
    data[len(data) // 2] ^= 0xFF
    archive = tmp_path / f"x.tar.{compress}"
    archive.write_bytes(bytes(data))
    assert_refused(tmp_path, archive, f"as tar.{compress}")


@pytest.fixture(params=["isal", "zlib"])
def inflater(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each gzip reader ``streams`` may use: ISA-L's (the gzip extra), or the standard library's."""
    if request.param == "isal":
        monkeypatch.setattr(streams, "igzip", pytest.importorskip("isal.igzip"))
    else:
        monkeypatch.setattr(streams, "igzip", None)
    return request.param


def test_a_tar_gz_is_inflated_by_the_reader_chosen(tmp_path: Path, inflater: str) -> None:
    """ISA-L's where the gzip extra is installed, else the standard library's."""
    archive = tmp_path / "x.tar.gz"
    archive.write_bytes(gzip.compress(tar_bytes([("a", b"a" * 700)])))
    opened = ArchiveStream(str(archive))
    try:
        assert type(opened.ahead.inner).__module__ == {"isal": "isal.igzip", "zlib": "gzip"}[inflater]
    finally:
        opened.close()


@pytest.mark.parametrize("damage", ["block header", "data", "checksum", "cut", "cut trailer"])
def test_a_damaged_gzip_stream_is_refused_in_one_line_by_either_reader(
    tmp_path: Path, inflater: str, damage: str
) -> None:
    """A flipped byte in the first deflate block's header (the decompressor's own error), in the
    data or in the CRC (the CRC check's), a cut mid-stream or in the 8-byte trailer."""
    data = bytearray(gzip.compress(tar_bytes([(f"f{k}", os.urandom(3000)) for k in range(20)])))
    flips = {"block header": 12, "data": len(data) // 2, "checksum": len(data) - 8}
    if damage in flips:
        data[flips[damage]] ^= 0xFF
    archive = tmp_path / "x.tar.gz"
    archive.write_bytes({"cut": data[: len(data) // 2], "cut trailer": data[:-3]}.get(damage, data))
    with pytest.raises(PackError, match=r"as tar\.gz") as refused:
        pack(archive, tmp_path / "dst", PackOptions(progress=False))
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "dst").exists()


def test_a_file_that_is_neither_a_tree_nor_an_archive_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("just text\n" * 100)
    assert_refused(tmp_path, tmp_path / "notes.txt", "neither a directory nor an archive")


def write_zip(path: Path, members: dict[str, bytes], method: int = zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", method) as out:
        for name, data in members.items():
            out.writestr(name, data)
    return path


def patch_sizes(path: Path, file_size: int) -> None:
    """Make every central directory entry claim ``file_size`` uncompressed bytes."""
    data = bytearray(path.read_bytes())
    at = data.find(b"PK\x01\x02")
    while at >= 0:
        struct.pack_into("<I", data, at + 24, file_size)
        at = data.find(b"PK\x01\x02", at + 4)
    path.write_bytes(bytes(data))


def test_a_zip_whose_declared_sizes_lie_is_refused(tmp_path: Path) -> None:
    archive = write_zip(tmp_path / "lie.zip", {"a.txt": b"a" * 1000, "b.txt": b"b" * 1000})
    patch_sizes(archive, 900)
    assert_refused(tmp_path, archive, "lie.zip")


def test_a_zip_that_expands_past_any_sane_ratio_is_refused(tmp_path: Path) -> None:
    archive = write_zip(tmp_path / "bomb.zip", {"a.txt": b"a" * 1000})
    patch_sizes(archive, 4_000_000_000)
    assert_refused(tmp_path, archive, "zip bomb")


def test_a_zip_whose_members_overlap_is_refused(tmp_path: Path) -> None:
    """Fifield's construction: many directory entries pointing at one member's data."""
    archive = write_zip(
        tmp_path / "overlap.zip", {"a.txt": b"a" * 100, "b.txt": b"b" * 100}, zipfile.ZIP_STORED
    )
    data = bytearray(archive.read_bytes())
    second = data.find(b"PK\x01\x02", data.find(b"PK\x01\x02") + 4)
    struct.pack_into("<I", data, second + 42, 0)  # b.txt's local header offset: a.txt's
    archive.write_bytes(bytes(data))
    assert_refused(tmp_path, archive, "overlaps")


def test_a_zip_on_standard_input_is_refused(tmp_path: Path) -> None:
    archive = write_zip(tmp_path / "a.zip", {"a": b"a"})
    with open(archive, "rb") as f:
        result = subprocess.run(
            [*DLFS_PACK, "-", tmp_path / "dst"], stdin=f, capture_output=True, text=True, timeout=60
        )
    assert_one_line_error(result, "standard input", "save it to a file")


def test_expand_tars_on_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    assert_one_line_error(
        dlfs("pack", tmp_path / "src", tmp_path / "dst", "--expand-tars", check=False), "archives"
    )


def test_random_placement_of_an_archive_is_refused(tmp_path: Path) -> None:
    """An archive is read once, in its own order: its members cannot be laid out at random."""
    archive = crafted_tar(tmp_path / "a.tar", [("a", b"a")])
    assert_refused(
        tmp_path, archive, "--placement random needs a directory tree", flags=("--placement", "random")
    )


# Failures that are not the archive's ------------------------------------------------------------


def test_a_bug_while_reading_is_reported_as_one_never_as_damage(tmp_path: Path) -> None:
    """A fault planted in the C loop's buffer (a ``ValueError``, as a numpy shape mismatch was): one
    line that says it is an internal error, where, and to report it; the traceback comes with
    ``--debug``. Nothing blames the archive, nothing is published."""
    archive = crafted_tar(tmp_path / "a.tar", [(f"f{k}", os.urandom(3000)) for k in range(5)])
    plant = (
        "import sys; from dlfs.pack.archive import tarscan; from dlfs.cli import main\n"
        "def broken(self, *args): raise ValueError('a planted fault')\n"
        "tarscan.TarScanner._scan_held = broken\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    command = [DLFS[0], "-P", "-c", plant]
    plain = subprocess.run(
        [*command, "-q", "pack", archive, tmp_path / "dst"], capture_output=True, text=True
    )
    assert_one_line_error(plain, "internal error while reading", "a.tar", "please report it", "--debug")
    assert plain.returncode == 70 and "damaged" not in plain.stderr and "download" not in plain.stderr
    assert not (tmp_path / "dst").exists()
    debug = subprocess.run(
        [*command, "--debug", "-q", "pack", archive, tmp_path / "dst"], capture_output=True, text=True
    )
    assert "Traceback" in debug.stderr and "a planted fault" in debug.stderr


@pytest.mark.parametrize("where", ["shards", "spill columns", "index"])
def test_a_full_disk_is_one_line_that_says_so_not_damage(tmp_path: Path, where: str) -> None:
    """Wherever the disk fills: the shards, the pack's column files (many small members), or the
    index (names long enough that it alone does not fit)."""
    if where == "shards":
        entries = [(f"f{k}", os.urandom(500_000)) for k in range(6)]
    elif where == "spill columns":
        entries = [(f"f{k:06d}", b"") for k in range(30_000)]
    else:
        entries = [(f"{k:03d}" + "n" * 250, b"") for k in range(2000)]
    archive = crafted_tar(tmp_path / "a.tar", entries)  # type: ignore[arg-type]
    with tmpfs(tmp_path / "small", "1m") as small:
        result = dlfs("pack", archive, small / "dst", check=False)
        assert_one_line_error(result, "free space")
        assert "damaged" not in result.stderr and "internal error" not in result.stderr
        assert not (small / "dst").exists()


def test_a_pack_from_standard_input_interrupted_while_it_waits_for_bytes_leaves_nothing(
    tmp_path: Path,
) -> None:
    """Ctrl-C while the stream stalls (a download that hangs): the pack stops at once, its shards
    and the destination it made removed, though the thread reading standard input still waits."""
    whole = tar_bytes([(f"f{k:04d}", os.urandom(2000)) for k in range(1200)])  # half: past the window
    dst = tmp_path / "dst"
    proc = subprocess.Popen(
        [*DLFS_PACK, "-", dst, "--shard-size", "256K"],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdin is not None and proc.stderr is not None
    try:
        proc.stdin.write(whole[: len(whole) // 2])
        proc.stdin.flush()
        wait_for_files(dst, "*.shard", proc.pid, "the pack's first shard from the stream")
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.stdin.close()
    assert proc.returncode == 130
    assert "Traceback" not in proc.stderr.read().decode()
    assert not dst.exists()


def test_an_interrupt_while_the_command_line_imports_its_commands_is_one_line(tmp_path: Path) -> None:
    """SIGINT while ``dlfs`` imports what its commands need (the first ~0.2 s of a run): ``dlfs:
    interrupted`` and status 130, never a traceback. The signal is sent by an import hook, at the
    import of the command modules."""
    archive = crafted_tar(tmp_path / "a.tar", [("a", b"a")])
    plant = (
        "import builtins, os, signal, sys\n"
        "from dlfs.cli import main\n"
        "real = builtins.__import__\n"
        "def hooked(name, *args, **kwargs):\n"
        "    if name == 'dlfs.cli' and args[2] and 'pack' in args[2]:\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "    return real(name, *args, **kwargs)\n"
        "builtins.__import__ = hooked\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    done = subprocess.run(
        [DLFS[0], "-P", "-c", plant, "pack", archive, tmp_path / "dst"], capture_output=True, text=True
    )
    assert done.returncode == 130 and done.stderr.strip() == "dlfs: interrupted", done.stderr
    assert not (tmp_path / "dst").exists()
