"""Packing archives: every kind mounts as ``tar x`` or ``unzip`` extracts it, nested class tars
become class folders, and untrusted members are refused in one line with nothing published."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import signal
import stat
import struct
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest
from conftest import (
    SMALL_SHARD,
    TOOLS,
    assert_one_line_error,
    dlfs,
    make_odd_tree,
    mounted,
    set_times,
    tmpfs,
    tool,
    wait_until,
)

from dlfs.core import format as fmt
from dlfs.core.cache import PayloadCache
from dlfs.core.errors import PackError
from dlfs.core.index import Index
from dlfs.core.reader import Reader
from dlfs.core.store import LocalStore
from dlfs.pack import PackOptions, pack
from dlfs.pack.archive import streams
from dlfs.pack.archive.members import Member
from dlfs.pack.archive.streams import ArchiveStream, Source
from dlfs.pack.archive.tar import tar_members

#: How each archive kind is written from a tree (``{src}``: the tree, ``{out}``: the archive).
WRITERS = {
    "gnu": ["tar", "--format=gnu", "--numeric-owner", "-cf", "{out}", "-C", "{src}", "."],
    "pax": ["tar", "--format=pax", "--numeric-owner", "-cf", "{out}", "-C", "{src}", "."],
    "tar.gz": ["tar", "--format=pax", "--numeric-owner", "-czf", "{out}", "-C", "{src}", "."],
    "tar.zst": ["tar", "--format=pax", "--numeric-owner", "--zstd", "-cf", "{out}", "-C", "{src}", "."],
    "tar.xz": ["tar", "--format=gnu", "--numeric-owner", "-cJf", "{out}", "-C", "{src}", "."],
    "tar.bz2": ["tar", "--format=gnu", "--numeric-owner", "-cjf", "{out}", "-C", "{src}", "."],
}


def listing(root: Path) -> dict[bytes, tuple[object, ...]]:
    """Every entry under ``root``: type, permissions, owner, mtime (ns), and a file's size and
    digest or a symlink's target (a folder's size is the file system's own)."""
    out: dict[bytes, tuple[object, ...]] = {}
    base = os.fsencode(root)
    for folder, dirs, files in os.walk(base):
        for name in dirs + files:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            what: object = None
            if stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    what = (st.st_size, hashlib.sha256(f.read()).hexdigest())
            elif stat.S_ISLNK(st.st_mode):
                what = os.readlink(path)
            key = os.path.relpath(path, base)
            out[key] = (
                stat.S_IFMT(st.st_mode),
                stat.S_IMODE(st.st_mode),
                st.st_uid,
                st.st_gid,
                st.st_mtime_ns,
                what,
            )
    return out


def safe_odd_tree(root: Path, hard_link: bool = True) -> Path:
    """The odd tree without the symlinks that leave it (``data_filter`` refuses those), with a hard
    link."""
    make_odd_tree(root)
    (root / "link-absolute-outside").unlink()
    (root / "many" / "link-escaping").unlink()
    if hard_link:
        os.link(root / "random.bin", root / "many" / "hard-link-to-random.bin")
    set_times(root)
    return root


def extract(archive: Path, out: Path) -> Path:
    out.mkdir()
    if archive.suffix == ".zip":
        subprocess.run(["unzip", "-q", archive, "-d", out], check=True, timeout=60)
    else:
        subprocess.run(["tar", "--numeric-owner", "-xpf", archive, "-C", out], check=True, timeout=60)
    return out


def pack_and_compare(
    tmp_path: Path, archive: Path, *flags: str, stdin: bool = False, unzip_symlink_times: bool = False
) -> None:
    """Pack ``archive`` (from standard input with ``stdin``), mount it, and compare with what
    ``tar x`` or ``unzip`` make of it (``unzip_symlink_times``: but for symlinks' mtimes, which
    ``unzip`` does not restore)."""
    dst = tmp_path / "dst"
    if stdin:
        with open(archive, "rb") as f:
            result = subprocess.run(
                [*DLFS_PACK, "-", dst, *flags],
                stdin=f,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
        assert result.returncode == 0, result.stderr
    else:
        dlfs("pack", archive, dst, "--shard-size", str(SMALL_SHARD), *flags)
    expected = listing(extract(archive, tmp_path / "extracted"))
    with mounted(dst, tmp_path / "mnt") as mnt:
        got = listing(mnt)
    if unzip_symlink_times:
        for entries in (got, expected):
            for path, entry in entries.items():
                if entry[0] == stat.S_IFLNK:
                    entries[path] = (*entry[:4], None, entry[5])
    assert got == expected


DLFS_PACK = [*__import__("conftest").DLFS, "-q", "pack"]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return safe_odd_tree(tmp_path_factory.mktemp("archive") / "src")


@pytest.mark.parametrize("kind", list(WRITERS))
def test_a_tar_written_by_gnu_tar_mounts_as_tar_x_extracts_it(tree: Path, tmp_path: Path, kind: str) -> None:
    archive = tmp_path / f"src.{kind}"
    subprocess.run([arg.format(src=tree, out=archive) for arg in WRITERS[kind]], check=True, timeout=60)
    pack_and_compare(tmp_path, archive)


def test_a_ustar_archive_mounts_as_tar_x_extracts_it(tree: Path, tmp_path: Path) -> None:
    """ustar holds neither long names nor large ids: the parts of the tree it can."""
    archive = tmp_path / "src.tar"
    names = ["classes", "many", "plain.txt", "empty-dir-0700", "link-to-dir"]
    subprocess.run(["tar", "--format=ustar", "-cf", archive, "-C", tree, *names], check=True, timeout=60)
    pack_and_compare(tmp_path, archive)


def test_a_tar_written_by_python_tarfile_with_nanosecond_mtimes_mounts_as_tar_x_extracts_it(
    tree: Path, tmp_path: Path
) -> None:
    archive = tmp_path / "src.tar"
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as out:
        out.add(tree, arcname=".")
    pack_and_compare(tmp_path, archive)


def test_a_tar_on_standard_input_packs_as_from_a_file(tree: Path, tmp_path: Path) -> None:
    archive = tmp_path / "src.tar.gz"
    subprocess.run([arg.format(src=tree, out=archive) for arg in WRITERS["tar.gz"]], check=True, timeout=60)
    pack_and_compare(tmp_path, archive, stdin=True)


@pytest.mark.parametrize("method", ["-0", "-6"])
def test_a_zip_written_by_info_zip_mounts_as_unzip_extracts_it(tmp_path: Path, method: str) -> None:
    """Stored and deflated; Info-ZIP names no owners, so unzip's files are the extracting
    user's, as pack's are the archive's owner's (both root here)."""
    src = safe_odd_tree(tmp_path / "src", hard_link=False)
    # unzip drops control characters from names, and renders undecodable ones by its locale.
    (src / "new\nline.txt").unlink()
    os.unlink(os.fsencode(src) + b"/non-utf8-\xff\xfe.bin")
    for path in [src, *src.rglob("*")]:
        os.chown(path, 0, 0, follow_symlinks=False)
    set_times(src)
    archive = tmp_path / "src.zip"
    subprocess.run(["zip", "-q", "-r", "-y", method, archive, "."], cwd=src, check=True, timeout=60)
    pack_and_compare(tmp_path, archive, unzip_symlink_times=True)


def test_a_zip64_archive_packs(tmp_path: Path) -> None:
    """zip64 records (forced here by ``zip -fz``) are read like plain ones."""
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "one.bin").write_bytes(os.urandom(5000))
    archive = tmp_path / "src.zip"
    subprocess.run(["zip", "-q", "-r", "-fz", archive, "."], cwd=src, check=True, timeout=60)
    pack_and_compare(tmp_path, archive)


def test_nested_class_tars_become_class_folders_with_expand_tars(tmp_path: Path) -> None:
    """ImageNet's train tar: one tar of class tars, each of flat JPEGs."""
    tree, train = tmp_path / "tree", tmp_path / "train.tar"
    make = [TOOLS / "make_imagenet_like.py", tree, "--files", "60", "--classes", "4", "--payload", "tiny"]
    tool(*make, "--train-tar", train)
    dst = tmp_path / "dst"
    dlfs("pack", train, dst, "--expand-tars")
    with mounted(dst, tmp_path / "mnt") as mnt:
        got = {p.relative_to(mnt): p.read_bytes() for p in mnt.rglob("*") if p.is_file()}
        folders = sorted(p.name for p in mnt.iterdir())
    expected = {p.relative_to(tree): p.read_bytes() for p in tree.rglob("*") if p.is_file()}
    assert got == expected
    assert folders == sorted(p.name for p in tree.iterdir())


def test_without_expand_tars_a_member_tar_stays_a_file(tmp_path: Path) -> None:
    inner = tar_bytes([("x.txt", b"x")])
    archive = write_tar(tmp_path / "a.tar", [("inner.tar", inner)])
    dst = tmp_path / "dst"
    dlfs("pack", archive, dst)
    with mounted(dst, tmp_path / "mnt") as mnt:
        assert (mnt / "inner.tar").read_bytes() == inner


def test_a_member_named_only_dot_tar_stays_a_file_with_expand_tars(tmp_path: Path) -> None:
    """``.tar`` alone names no folder: expanding it would give a folder with an empty name."""
    inner = tar_bytes([("x.txt", b"x")])
    archive = write_tar(tmp_path / "a.tar", [("d/.tar", inner), (".tar", inner)])
    dst = tmp_path / "dst"
    dlfs("pack", archive, dst, "--expand-tars")
    with mounted(dst, tmp_path / "mnt") as mnt:
        assert (mnt / "d" / ".tar").read_bytes() == inner and (mnt / ".tar").read_bytes() == inner


# Bad input ------------------------------------------------------------------------------------


Entry = tuple[str, bytes] | tarfile.TarInfo


def tar_bytes(entries: list[Entry]) -> bytes:
    """A tar of ``(name, bytes)`` files and crafted ``TarInfo`` members (symlinks, hard links)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as out:
        for entry in entries:
            if isinstance(entry, tarfile.TarInfo):
                out.addfile(entry)
                continue
            name, data = entry
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 1_600_000_000, 0o644
            out.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def write_tar(path: Path, entries: list[Entry]) -> Path:
    path.write_bytes(tar_bytes(entries))
    return path


def link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def seal(raw: bytearray, at: int) -> None:
    """Give the tar header at ``at`` the checksum of its bytes as they are."""
    raw[at + 148 : at + 156] = b" " * 8
    raw[at + 148 : at + 156] = f"{sum(raw[at : at + 512]):06o}\0 ".encode()


def assert_refused(tmp_path: Path, archive: Path, *fragments: str, flags: tuple[str, ...] = ()) -> None:
    """One line, and no dataset published, nothing written beside it."""
    before = set(tmp_path.iterdir())
    dst = tmp_path / "dst"
    assert_one_line_error(dlfs("pack", archive, dst, *flags, check=False), *fragments)
    assert not (dst / fmt.INDEX_NAME).exists()
    assert list(dst.iterdir()) == [] if dst.exists() else True
    assert set(tmp_path.iterdir()) - before <= {dst}


@pytest.mark.parametrize(
    ("entries", "fragment"),
    [
        ([("ok.txt", b"ok"), ("../x", b"evil")], "'..'"),
        ([("a/../../x", b"evil")], "'..'"),
        ([link("lnk", "/etc")], "absolute path /etc"),
        ([link("lnk", "../../etc")], "points out of the tree"),
        ([("sub/f", b"f"), link("lnk", "sub"), ("lnk/passwd", b"evil")], "beyond the symlink lnk"),
        ([link("copy", "nowhere", tarfile.LNKTYPE)], "hard link copy points at nowhere"),
        ([link("copy", "later", tarfile.LNKTYPE), ("later", b"l")], "hard link copy points at later"),
        ([("a", b"file"), ("a/b", b"under a file")], "a is both a folder and a file"),
    ],
)
def test_an_untrusted_member_is_refused_in_one_line_with_nothing_published(
    tmp_path: Path, entries: list[Entry], fragment: str
) -> None:
    assert_refused(tmp_path, write_tar(tmp_path / "bad.tar", entries), fragment)


def test_with_skip_errors_a_refused_member_is_left_out_and_the_rest_packed(tmp_path: Path) -> None:
    archive = write_tar(
        tmp_path / "bad.tar",
        [("ok.txt", b"ok"), ("../x", b"evil"), link("lnk", "/etc"), ("lnk/passwd", b"evil")],
    )
    dst = tmp_path / "dst"
    result = dlfs("pack", archive, dst, "--skip-errors")
    assert "skipped 0 special files and 3 unreadable entries" in result.stdout
    with mounted(dst, tmp_path / "mnt") as mnt:
        assert sorted(p.name for p in mnt.iterdir()) == ["ok.txt"]


def test_a_leading_slash_is_stripped_as_tar_x_strips_it(tmp_path: Path) -> None:
    archive = write_tar(tmp_path / "abs.tar", [("/abs/x", b"x")])
    dst = tmp_path / "dst"
    dlfs("pack", archive, dst)
    with mounted(dst, tmp_path / "mnt") as mnt:
        assert (mnt / "abs" / "x").read_bytes() == b"x"


def test_of_duplicate_paths_the_last_member_wins_as_with_tar_x(tmp_path: Path) -> None:
    archive = write_tar(tmp_path / "dup.tar", [("f", b"first"), ("g", b"g"), ("f", b"second")])
    dst = tmp_path / "dst"
    result = dlfs("pack", archive, dst)
    assert "1 archive members replaced by a later one" in result.stdout
    out = extract(archive, tmp_path / "extracted")
    with mounted(dst, tmp_path / "mnt") as mnt:
        assert (mnt / "f").read_bytes() == (out / "f").read_bytes() == b"second"


def test_a_hard_link_takes_the_bytes_its_target_had_when_it_was_linked(tmp_path: Path) -> None:
    archive = write_tar(tmp_path / "h.tar", [("f", b"old"), link("h", "f", tarfile.LNKTYPE), ("f", b"new")])
    dst = tmp_path / "dst"
    dlfs("pack", archive, dst)
    out = extract(archive, tmp_path / "extracted")
    with mounted(dst, tmp_path / "mnt") as mnt:
        assert (mnt / "h").read_bytes() == (out / "h").read_bytes() == b"old"
        assert (mnt / "f").read_bytes() == b"new"


def test_setuid_and_setgid_bits_are_dropped(tmp_path: Path) -> None:
    info = tarfile.TarInfo("suid")
    info.mode = 0o6755
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as out:
        out.addfile(info, io.BytesIO(b""))
    archive = tmp_path / "s.tar"
    archive.write_bytes(buffer.getvalue())
    dst = tmp_path / "dst"
    dlfs("pack", archive, dst)
    with mounted(dst, tmp_path / "mnt") as mnt:
        assert stat.S_IMODE((mnt / "suid").lstat().st_mode) == 0o755


@pytest.mark.parametrize("cut", [512 + 3, 1024 + 1000, 1536 + 100, 4096])
def test_a_truncated_tar_is_refused(tmp_path: Path, cut: int) -> None:
    """Cut in a member's data, in a header, and just before the end-of-archive marker."""
    whole = tar_bytes([("a", b"a" * 700), ("b", b"b" * 2000)])
    archive = tmp_path / "cut.tar"
    archive.write_bytes(whole[:cut])
    assert_refused(tmp_path, archive, "cut short")


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


@pytest.mark.parametrize("compress", ["gz", "zst"])
def test_a_corrupt_compressed_stream_is_refused(tmp_path: Path, compress: str) -> None:
    plain = write_tar(tmp_path / "x.tar", [(f"f{k}", os.urandom(3000)) for k in range(20)])
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
    assert not (tmp_path / "dst" / fmt.INDEX_NAME).exists()


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
            [*DLFS_PACK, "-", tmp_path / "dst"],
            stdin=f,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert_one_line_error(result, "standard input", "save it to a file")


def test_expand_tars_on_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    assert_one_line_error(
        dlfs("pack", tmp_path / "src", tmp_path / "dst", "--expand-tars", check=False), "archives"
    )


# The reader: offsets, contiguity, large sizes -------------------------------------------------


def read_members(raw: bytes, expand: bool = False) -> list[tuple[Member, bytes | None]]:
    """Every member ``tar_members`` yields for ``raw``, with its bytes."""
    stream = Source(io.BytesIO(raw))  # type: ignore[arg-type]
    return [(m, data.read() if data else None) for m, data in tar_members(stream, "test.tar", expand)]


def test_every_member_records_where_its_bytes_lie_in_the_archive_nested_or_not(tmp_path: Path) -> None:
    inner = tar_bytes([("a.JPEG", b"A" * 700), ("b.JPEG", b"B" * 3)])
    raw = tar_bytes([("x" * 150 + ".txt", b"long name"), ("n01.tar", inner)])
    got = read_members(raw, expand=True)
    files = [(m.path, data) for m, data in got if m.kind == stat.S_IFREG]
    assert files == [
        (b"x" * 150 + b".txt", b"long name"),
        (b"n01/a.JPEG", b"A" * 700),
        (b"n01/b.JPEG", b"B" * 3),
    ]
    for member, data in got:
        if member.kind == stat.S_IFREG:
            assert member.contiguous and raw[member.offset : member.offset + member.size] == data


def test_a_gnu_sparse_member_is_read_whole_and_marked_not_contiguous(tmp_path: Path) -> None:
    sparse = tmp_path / "src" / "sparse.bin"
    sparse.parent.mkdir()
    with open(sparse, "wb") as f:
        f.seek(1 << 20)
        f.write(b"end")
    archive = tmp_path / "sparse.tar"
    subprocess.run(
        ["tar", "--format=gnu", "-S", "-cf", archive, "-C", sparse.parent, "."], check=True, timeout=60
    )
    [(member, data)] = [(m, d) for m, d in read_members(archive.read_bytes()) if m.kind == stat.S_IFREG]
    assert data == sparse.read_bytes() and not member.contiguous
    pack_and_compare(tmp_path, archive)


def sparse_bomb(tmp_path: Path) -> Path:
    """A tar written by GNU tar of a 100 GiB file of holes (a few blocks), then a file after it."""
    src = tmp_path / "src"
    src.mkdir()
    subprocess.run(["truncate", "-s", "100G", src / "holes.bin"], check=True, timeout=60)
    (src / "after.txt").write_bytes(b"after")
    archive = tmp_path / "bomb.tar"
    subprocess.run(
        ["tar", "--sparse", "--format=gnu", "-cf", archive, "-C", src, "holes.bin", "after.txt"],
        check=True,
        timeout=60,
    )
    return archive


def test_a_sparse_member_expanding_past_the_bound_is_refused_in_one_line(tmp_path: Path) -> None:
    archive = sparse_bomb(tmp_path)
    assert archive.stat().st_size < 1 << 20
    assert_refused(tmp_path, archive, "holes.bin", "archive bomb")


def test_with_skip_errors_a_sparse_bomb_is_left_out_unread_and_the_rest_packed(tmp_path: Path) -> None:
    """Reading the holes would write 100 GiB of zeros: the pack would run out of disk and time."""
    dst = tmp_path / "dst"
    result = dlfs("pack", sparse_bomb(tmp_path), dst, "--skip-errors", timeout=60)
    assert "1 unreadable entries" in result.stdout and "archive bomb" in result.stderr
    with mounted(dst, tmp_path / "mnt") as mnt:
        assert [p.name for p in mnt.iterdir()] == ["after.txt"]
        assert (mnt / "after.txt").read_bytes() == b"after"


@pytest.mark.parametrize("form", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_a_member_past_8_gib_is_read_with_its_size(form: int) -> None:
    """GNU tar writes such a size in base-256, pax in a record; the header alone, cut short."""
    info = tarfile.TarInfo("big.bin")
    info.size = 9 << 30
    stream = Source(io.BytesIO(info.tobuf(form)))  # type: ignore[arg-type]
    member, data = next(tar_members(stream, "big.tar", False))
    assert member.size == 9 << 30 and data is not None
    assert data.read(100) == b""


def test_pax_mtimes_are_kept_to_the_nanosecond() -> None:
    info = tarfile.TarInfo("f")
    info.pax_headers = {"mtime": "1600000000.123456789"}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as out:
        out.addfile(info, io.BytesIO(b""))
    [(member, _)] = read_members(buffer.getvalue())
    assert member.mtime_ns == 1_600_000_000_123_456_789


def test_random_placement_of_an_archive_is_refused(tmp_path: Path) -> None:
    """An archive is read once, in its own order: its members cannot be laid out at random."""
    archive = write_tar(tmp_path / "a.tar", [("a", b"a")])
    assert_refused(
        tmp_path, archive, "--placement random needs a directory tree", flags=("--placement", "random")
    )


def test_a_pack_from_standard_input_interrupted_while_it_waits_for_bytes_leaves_nothing(
    tmp_path: Path,
) -> None:
    """Ctrl-C while the stream stalls (a download that hangs): the pack stops at once, its shards
    removed, though the thread reading standard input is still waiting in a read."""
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
        assert wait_until(lambda: len(list(dst.glob("*.shard"))) > 0, 60)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.stdin.close()
    assert proc.returncode == 130
    assert "Traceback" not in proc.stderr.read().decode()
    assert list(dst.iterdir()) == []


def test_a_member_past_the_whole_payload_limit_is_streamed_into_its_shard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Members larger than ``fmt.WHOLE_PAYLOAD_LIMIT`` go to their shard chunk by chunk; cut short,
    they are refused like any other."""
    monkeypatch.setattr(fmt, "WHOLE_PAYLOAD_LIMIT", 64 << 10)
    big = os.urandom(300_000)
    raw = tar_bytes([("small", b"s"), ("big.bin", big), ("after", b"a")])
    archive = tmp_path / "big.tar"
    archive.write_bytes(raw)
    pack(archive, tmp_path / "dst", PackOptions(progress=False))
    store = LocalStore(tmp_path / "dst")
    try:
        index = Index.load(store)
        reader = Reader(index, store, PayloadCache(1 << 20))
        assert bytes(reader.load(index.resolve(b"big.bin"))) == big
        assert bytes(reader.load(index.resolve(b"after"))) == b"a"
    finally:
        store.close()
    archive.write_bytes(raw[:200_000])
    with pytest.raises(PackError, match="cut short"):
        pack(archive, tmp_path / "dst2", PackOptions(progress=False))


def test_a_full_destination_is_reported_as_such_not_as_a_damaged_archive(tmp_path: Path) -> None:
    archive = write_tar(tmp_path / "a.tar", [(f"f{k}", os.urandom(500_000)) for k in range(6)])
    with tmpfs(tmp_path / "small", "1m") as small:
        result = dlfs("pack", archive, small / "dst", check=False)
        assert_one_line_error(result, "free space")
        assert "damaged" not in result.stderr
        assert not (small / "dst" / fmt.INDEX_NAME).exists()
