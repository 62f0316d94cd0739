"""An archive's members as ``tar x`` reads them: what is refused (names that leave the tree, paths
through a symlink, names the tree cannot hold), what is kept as it is (symlinks of every kind),
duplicates (the last one wins, whatever its type), hard links (every link resolves, all share one
inode), and GNU tar's own members (incremental archives' directory dumps, volume labels, the
multi-volume continuation, and the name prefix bytes a GNU header uses for times)."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest
from archives import (
    assert_refused,
    crafted_tar,
    extract,
    folder,
    link,
    listing,
    pack_and_compare,
    pack_and_mount_listing,
    seal,
    tar_bytes,
)
from commands import dlfs
from mounts import mounted


@pytest.mark.parametrize(
    ("entries", "fragment"),
    [
        ([("ok.txt", b"ok"), ("../x", b"evil")], "'..'"),
        ([("a/../../x", b"evil")], "'..'"),
        ([("sub/f", b"f"), link("lnk", "sub"), ("lnk/passwd", b"evil")], "beyond the symlink lnk"),
        ([link("copy", "nowhere", tarfile.LNKTYPE)], "hard link copy points at nowhere"),
        ([link("copy", "later", tarfile.LNKTYPE), ("later", b"l")], "hard link copy points at later"),
        ([folder("d"), link("copy", "d", tarfile.LNKTYPE)], "hard link copy points at d"),
        ([("n" * 256, b"long")], "longer than 255 bytes"),
    ],
)
def test_an_untrusted_member_is_refused_in_one_line_with_nothing_published(
    tmp_path: Path, entries: list[object], fragment: str
) -> None:
    assert_refused(tmp_path, crafted_tar(tmp_path / "bad.tar", entries), fragment)  # type: ignore[arg-type]


def test_with_skip_errors_a_refused_member_is_left_out_and_the_rest_packed(tmp_path: Path) -> None:
    archive = crafted_tar(
        tmp_path / "bad.tar",
        [("ok.txt", b"ok"), ("../x", b"evil"), link("lnk", "sub"), ("lnk/passwd", b"evil")],
    )
    dst = tmp_path / "dst"
    result = dlfs("pack", archive, dst, "--skip-errors")
    assert "skipped 0 special files and 2 unreadable entries" in result.stdout
    with mounted(dst, tmp_path / "mnt") as mnt:
        assert sorted(p.name for p in mnt.iterdir()) == ["lnk", "ok.txt"]


def test_symlinks_are_kept_as_they_are_absolute_dangling_or_pointing_out(tmp_path: Path) -> None:
    """As ``tar x``, mksquashfs and ratarmount keep them: on a read-only mount a symlink is text."""
    archive = crafted_tar(
        tmp_path / "links.tar",
        [
            folder("links"),
            link("links/abs", "/etc/hostname"),
            link("links/up", "../../x"),
            link("links/dangling", "nothing-here"),
            link("links/dot", "."),
        ],
    )
    pack_and_compare(tmp_path, archive)
    dst = tmp_path / "dst"
    with mounted(dst, tmp_path / "mnt2") as mnt:
        assert os.readlink(mnt / "links" / "abs") == "/etc/hostname"
        assert (mnt / "links" / "abs").read_bytes() == Path("/etc/hostname").read_bytes()


def test_a_leading_slash_is_stripped_as_tar_x_strips_it(tmp_path: Path) -> None:
    archive = crafted_tar(tmp_path / "abs.tar", [("/abs/x", b"x")])
    dst = tmp_path / "dst"
    dlfs("pack", archive, dst)
    with mounted(dst, tmp_path / "mnt") as mnt:
        assert (mnt / "abs" / "x").read_bytes() == b"x"


@pytest.mark.parametrize(
    ("entries", "names", "wins"),
    [
        ([("f", b"first"), ("g", b"g"), ("f", b"second")], ["f", "g"], ("f", b"second")),
        ([("foo", b"file"), folder("foo"), ("foo/x", b"x")], ["foo", "foo/x"], ("foo/x", b"x")),
        ([("foo/x", b"x"), ("foo", b"the file wins")], ["foo"], ("foo", b"the file wins")),
        ([folder("foo"), link("foo", "elsewhere")], ["foo"], ("foo", None)),
        ([link("foo", "elsewhere"), folder("foo")], ["foo"], ("foo", "folder")),
    ],
    ids=["file-file", "file-folder", "folder-file", "folder-symlink", "symlink-folder"],
)
def test_of_members_at_one_path_the_last_wins_whatever_its_type(
    tmp_path: Path, entries: list[object], names: list[str], wins: tuple[str, object]
) -> None:
    """A folder arrives with the last member named at or below it; one that loses to a file or a
    symlink takes its subtree with it. The pack says how many it replaced."""
    archive = crafted_tar(tmp_path / "dup.tar", entries)  # type: ignore[arg-type]
    dst = tmp_path / "dst"
    result = dlfs("pack", archive, dst)
    assert "1 archive members replaced by a later one" in result.stdout
    path, content = wins
    with mounted(dst, tmp_path / "mnt") as mnt:
        if content is None:
            assert (mnt / path).is_symlink() and os.readlink(mnt / path) == "elsewhere"
        elif content == "folder":
            assert (mnt / path).is_dir() and not (mnt / path).is_symlink()
        else:
            assert (mnt / path).read_bytes() == content
        assert sorted(str(p.relative_to(mnt)) for p in mnt.rglob("*")) == names


def test_every_hard_link_resolves_and_shares_one_inode_with_the_right_link_count(tmp_path: Path) -> None:
    """GNU tar stores the first name as the file and the others as links to it, in any order;
    the mount's names share one inode, as ``tar x`` makes them."""
    src = tmp_path / "h"
    src.mkdir()
    (src / "b").write_bytes(b"A\n")
    os.link(src / "b", src / "a")
    os.link(src / "b", src / "c")
    archive = tmp_path / "h.tar"
    subprocess.run(["tar", "-cf", archive, "-C", src, "."], check=True, timeout=60)
    pack_and_compare(tmp_path, archive)
    with mounted(tmp_path / "dst", tmp_path / "mnt2") as mnt:
        inodes = {os.stat(mnt / name).st_ino for name in "abc"}
        assert len(inodes) == 1 and os.stat(mnt / "a").st_nlink == 3
        assert {entry.inode() for entry in os.scandir(mnt)} == inodes  # readdir says the same


def test_hard_links_in_a_packed_tree_share_one_inode_and_their_bytes_are_stored_once(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "big").write_bytes(os.urandom(200_000))
    os.link(src / "big", src / "d" / "again")
    (src / "alone").write_bytes(b"alone")
    got = pack_and_mount_listing(tmp_path, src)
    assert got == listing(src)
    shards = sum(p.stat().st_size for p in (tmp_path / "dst").glob("*.shard"))
    assert shards < 250_000, "the linked file's bytes are stored once"


def test_a_hard_link_takes_the_bytes_its_target_had_when_it_was_linked(tmp_path: Path) -> None:
    archive = crafted_tar(tmp_path / "h.tar", [("f", b"old"), link("h", "f", tarfile.LNKTYPE), ("f", b"new")])
    pack_and_compare(tmp_path, archive)


def test_a_hard_link_to_a_symlink_is_a_symlink(tmp_path: Path) -> None:
    archive = crafted_tar(tmp_path / "h.tar", [link("s", "target"), link("h", "s", tarfile.LNKTYPE)])
    pack_and_compare(tmp_path, archive)


def test_setuid_and_setgid_bits_are_dropped(tmp_path: Path) -> None:
    info = tarfile.TarInfo("suid")
    info.mode = 0o6755
    archive = tmp_path / "s.tar"
    archive.write_bytes(tar_bytes([info]))
    dst = tmp_path / "dst"
    dlfs("pack", archive, dst)
    with mounted(dst, tmp_path / "mnt") as mnt:
        assert stat.S_IMODE((mnt / "suid").lstat().st_mode) == 0o755


# GNU tar's own members -------------------------------------------------------------------------


@pytest.mark.parametrize("in_place", [False, True], ids=["packed", "in-place"])
def test_an_incremental_archive_and_its_next_level_pack_as_tar_x_extracts_them(
    tmp_path: Path, in_place: bool
) -> None:
    """``tar -g``: level 0, then level 1 of what changed. GNU headers there carry atime and ctime
    where ustar keeps a name prefix, and folders are directory dumps (type ``D``)."""
    src, snapshot = tmp_path / "g", tmp_path / "snapshot"
    (src / "d" / "sub").mkdir(parents=True)
    (src / "d" / "foo").write_bytes(b"hi\n")
    (src / "d" / "sub" / "bar").write_bytes(b"bar\n")
    levels = []
    for level in range(2):
        archive = tmp_path / f"level{level}.tar"
        subprocess.run(["tar", "-C", src, "-g", snapshot, "-cf", archive, "d"], check=True, timeout=60)
        levels.append(archive)
        if level == 0:
            (src / "d" / "new").write_bytes(b"new\n")
            (src / "d" / "foo").unlink()
    flags = ("--in-place",) if in_place else ()
    for archive in levels:
        raw = archive.read_bytes()
        assert raw[257:265] == b"ustar  \0" and raw[345:357].strip(b"\0"), "a GNU header with its atime"
        work = tmp_path / archive.stem
        work.mkdir()
        pack_and_compare(work, archive, *flags)


def test_a_volume_label_makes_nothing_as_with_tar_x(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"f")
    archive = tmp_path / "v.tar"
    subprocess.run(["tar", "-V", "my volume", "-cf", archive, "-C", src, "f"], check=True, timeout=60)
    pack_and_compare(tmp_path, archive)


def test_a_file_continued_from_another_volume_is_refused_in_one_line(tmp_path: Path) -> None:
    """The second volume of ``tar -M`` starts inside a file (type ``M``)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "big").write_bytes(os.urandom(60_000))
    first, second = tmp_path / "one.tar", tmp_path / "two.tar"
    command = ["tar", "-c", "-M", "-L", "40", "-f", first, "-f", second, "-C", src, "big"]
    subprocess.run(command, check=True, timeout=60, capture_output=True)
    assert_refused(tmp_path, second, "multi-volume")


def test_junk_in_a_gnu_header_s_prefix_bytes_is_never_part_of_a_name(tmp_path: Path) -> None:
    """Whatever a GNU header holds in bytes 345-500, the C loop and ``tarfile``'s path agree with
    GNU tar: the name is the name field alone."""
    raw = bytearray(tar_bytes([folder("dir"), ("dir/file", b"data"), ("other", b"o")]))
    for at in (512, 1536):  # the files' headers
        raw[at + 345 : at + 357] = b"14130613451\0"  # an atime, as tar -G writes it
        seal(raw, at)
    archive = tmp_path / "gnu.tar"
    archive.write_bytes(bytes(raw))
    pack_and_compare(tmp_path, archive)
    assert listing(extract(archive, tmp_path / "again")).keys() == {b"dir", b"dir/file", b"other"}


def test_pax_path_and_linkpath_records_name_members_past_100_bytes(tmp_path: Path) -> None:
    long_dir = "d" * 120
    info = tarfile.TarInfo(f"{long_dir}/target-is-long")
    info.type, info.linkname = tarfile.SYMTYPE, "x" * 300
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as out:
        out.addfile(folder(long_dir))
        out.addfile(info)
        data = tarfile.TarInfo(f"{long_dir}/{'f' * 200}")
        data.size = 4
        out.addfile(data, io.BytesIO(b"long"))
    archive = tmp_path / "pax.tar"
    archive.write_bytes(buffer.getvalue())
    pack_and_compare(tmp_path, archive)
