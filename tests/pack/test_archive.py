"""Archives as they arrive, against what the real tools extract from them: every tar format GNU tar
and bsdtar write and Python's ``tarfile``'s, packed, indexed in place, read from standard input,
nested in another tar with ``--expand-tars``, and compressed; zips by Info-ZIP and Python, zip64
and zips with data before them. Bytes and metadata (type, permissions, owner, mtime, size, link
target, and which names share an inode, with its link count) must match; the same tree as a
directory, a tar, a zip or a stream mounts the same."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from archives import (
    COMPRESSORS,
    NARROW,
    TAR_WRITERS,
    Entry,
    archive_tree,
    extract,
    listing,
    narrow_tree,
    pack_and_compare,
    pack_and_mount_listing,
    tar_bytes,
    without_symlink_times,
    write_tar,
    write_zip,
)
from commands import TOOLS, dlfs, tool
from mounts import mounted
from trees import set_times

from dlfs.core import format as fmt

TAR_KINDS = [*TAR_WRITERS, "tarfile-pax", "tarfile-gnu"]
ZIP_KINDS = ["zip-0", "zip-6", "zip64", "zipfile"]


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tree each format is written from: the archive tree, the narrow one for ustar and v7,
    and a zip's (``zip_tree``)."""
    root = tmp_path_factory.mktemp("trees")
    return {
        "wide": archive_tree(root / "wide"),
        "narrow": narrow_tree(root / "narrow"),
        "zip": zip_tree(root / "zip"),
    }


def zip_tree(root: Path) -> Path:
    """The archive tree as a zip holds it: unzip drops control characters from names and renders
    undecodable ones by its locale, and restores no owners (it extracts as the user, root here)."""
    archive_tree(root)
    (root / "new\nline.txt").unlink()
    os.unlink(os.fsencode(root) + b"/non-utf8-\xff\xfe.bin")
    for path in [root, *root.rglob("*")]:
        os.chown(path, 0, 0, follow_symlinks=False)
    set_times(root)
    return root


def tar_of(kind: str, trees: dict[str, Path], out: Path, *extra: str) -> Path:
    return write_tar(kind, trees["narrow" if kind in NARROW else "wide"], out, *extra)


def extractor(kind: str) -> str:
    """The tool that extracts a tar of ``kind``: its writer (``archives.extract`` says why)."""
    return "bsdtar" if kind.startswith("bsdtar") else "tar"


@pytest.mark.parametrize("kind", TAR_KINDS)
def test_a_tar_packs_as_tar_x_extracts_it(trees: dict[str, Path], tmp_path: Path, kind: str) -> None:
    pack_and_compare(tmp_path, tar_of(kind, trees, tmp_path / "src.tar"), tar=extractor(kind))


@pytest.mark.parametrize("kind", TAR_KINDS)
def test_a_tar_served_in_place_mounts_as_tar_x_extracts_it(
    trees: dict[str, Path], tmp_path: Path, kind: str
) -> None:
    pack_and_compare(tmp_path, tar_of(kind, trees, tmp_path / "src.tar"), "--in-place", tar=extractor(kind))
    assert [path.name for path in (tmp_path / "dst").iterdir()] == [fmt.INDEX_NAME], "nothing but the index"


@pytest.mark.parametrize("kind", ["gnu", "pax", "bsdtar-pax"])
def test_a_tar_on_standard_input_packs_as_tar_x_extracts_it(
    trees: dict[str, Path], tmp_path: Path, kind: str
) -> None:
    pack_and_compare(tmp_path, tar_of(kind, trees, tmp_path / "src.tar"), stdin=True, tar=extractor(kind))


@pytest.mark.parametrize("suffix", list(COMPRESSORS))
def test_a_compressed_tar_packs_as_tar_x_extracts_it(
    trees: dict[str, Path], tmp_path: Path, suffix: str
) -> None:
    pack_and_compare(tmp_path, tar_of("gnu", trees, tmp_path / f"src.tar.{suffix}", COMPRESSORS[suffix]))


@pytest.mark.parametrize("kind", ["gnu", "pax", "ustar", "bsdtar-pax"])
@pytest.mark.parametrize("in_place", [False, True], ids=["packed", "in-place"])
def test_a_tar_inside_a_tar_becomes_its_folder_as_tar_x_extracts_it(
    trees: dict[str, Path], tmp_path: Path, kind: str, in_place: bool
) -> None:
    """With ``--expand-tars``: the folder ``inner`` holds what ``tar x`` of ``inner.tar`` does."""
    inner = tar_of(kind, trees, tmp_path / "inner.tar")
    outer = tmp_path / "outer.tar"
    outer.write_bytes(tar_bytes([("top.txt", b"top"), ("inner.tar", inner.read_bytes()), ("z", b"z")]))
    flags = ("--expand-tars", *(["--in-place"] if in_place else []))
    dst = tmp_path / "dst"
    dlfs("pack", outer, dst, *flags)
    with mounted(dst, tmp_path / "mnt") as mnt:
        got = listing(mnt / "inner")
        assert (mnt / "top.txt").read_bytes() == b"top" and (mnt / "z").read_bytes() == b"z"
    assert got == listing(extract(inner, tmp_path / "extracted", extractor(kind)))


@pytest.mark.parametrize("kind", ZIP_KINDS)
def test_a_zip_packs_as_unzip_extracts_it(trees: dict[str, Path], tmp_path: Path, kind: str) -> None:
    pack_and_compare(tmp_path, write_zip(kind, trees["zip"], tmp_path / "src.zip"))


@pytest.mark.parametrize("before", ["script", "self-extractor"])
def test_a_zip_with_data_before_it_packs_as_unzip_extracts_it(
    trees: dict[str, Path], tmp_path: Path, before: str
) -> None:
    """Found by its end-of-central-directory record, as unzip and ``zipfile`` find it: a zip
    appended to a shell script, or behind a self-extractor's stub with its offsets adjusted (``zip
    -A``)."""
    plain = write_zip("zip-6", trees["zip"], tmp_path / "plain.zip")
    archive = tmp_path / "prefixed.zip"
    archive.write_bytes(b"#!/bin/sh\necho 'a zip follows'\nexit 0\n" + os.urandom(3000) + plain.read_bytes())
    if before == "self-extractor":
        subprocess.run(["zip", "-q", "-A", archive], check=True, timeout=60)
    got = pack_and_mount_listing(tmp_path, archive)
    expected = tmp_path / "extracted"
    expected.mkdir()
    # unzip warns of the bytes before the zip (exit status 1) and extracts it all the same.
    done = subprocess.run(["unzip", "-q", archive, "-d", expected], capture_output=True, timeout=60)
    assert done.returncode in (0, 1), done.stderr
    assert without_symlink_times(got) == without_symlink_times(listing(expected))


def test_the_same_tree_as_a_directory_a_tar_a_zip_or_a_stream_mounts_the_same(
    trees: dict[str, Path], tmp_path: Path
) -> None:
    """One listing for the tree packed as it is, as a tar (pax: nanosecond mtimes), from a tar on
    standard input, and (but for what a zip does not hold: hard links, symlinks' mtimes, times
    finer than a second) as a zip."""
    tree = trees["zip"]
    listings = {}
    for name, source, stdin in (
        ("directory", tree, False),
        ("tar", write_tar("pax", tree, tmp_path / "t.tar"), False),
        ("stream", tmp_path / "t.tar", True),
    ):
        (tmp_path / name).mkdir()
        listings[name] = pack_and_mount_listing(tmp_path / name, source, stdin=stdin)
    assert listings["directory"] == listings["tar"] == listings["stream"]
    (tmp_path / "zip").mkdir()
    zipped = pack_and_mount_listing(tmp_path / "zip", write_zip("zip-6", tree, tmp_path / "t.zip"))
    unlinked = {path: (*entry[:6], (path,)) for path, entry in listings["directory"].items()}
    assert without_symlink_times(zipped) == without_symlink_times(seconds(unlinked))


def seconds(entries: dict[bytes, Entry]) -> dict[bytes, Entry]:
    """``entries`` with mtimes in whole seconds, as a zip keeps them (Info-ZIP's UTC time field)."""
    return {path: (*entry[:4], entry[4] // 10**9 * 10**9, *entry[5:]) for path, entry in entries.items()}


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
    archive = tmp_path / "a.tar"
    archive.write_bytes(tar_bytes([("inner.tar", inner)]))
    dst = tmp_path / "dst"
    dlfs("pack", archive, dst)
    with mounted(dst, tmp_path / "mnt") as mnt:
        assert (mnt / "inner.tar").read_bytes() == inner


def test_a_member_named_only_dot_tar_stays_a_file_with_expand_tars(tmp_path: Path) -> None:
    """``.tar`` alone names no folder: expanding it would give a folder with an empty name."""
    inner = tar_bytes([("x.txt", b"x")])
    archive = tmp_path / "a.tar"
    archive.write_bytes(tar_bytes([("d/.tar", inner), (".tar", inner)]))
    dst = tmp_path / "dst"
    dlfs("pack", archive, dst, "--expand-tars")
    with mounted(dst, tmp_path / "mnt") as mnt:
        assert (mnt / "d" / ".tar").read_bytes() == inner and (mnt / ".tar").read_bytes() == inner
