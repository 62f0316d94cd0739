"""``dlfs pack --in-place``: only an index is written, and the mount serves every member from the tar
itself: as ``tar x`` extracts it, from a folder of WebDataset shards and from nested class tars;
a tar changed since it was indexed is refused at mount, a byte changed inside a member is EIO, and
what cannot be served in place is refused in one line."""

from __future__ import annotations

import errno
import io
import json
import os
import random
import shutil
import stat
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from archives import COMPRESSORS, archive_tree, write_tar
from commands import TOOLS, assert_one_line_error, dlfs, tool
from hypothesis import given
from hypothesis import strategies as st
from index_checks import assert_sound
from mounts import mounted
from mutations import FUZZ, OUTCOMES, Seeds, mutate

from dlfs.core import format as fmt
from dlfs.core.errors import PackError
from dlfs.core.file_bytes import FileBytes
from dlfs.core.index import Index
from dlfs.core.ram_cache import RamCache
from dlfs.core.shard_store import shard_store
from dlfs.core.store.local import LocalStore
from dlfs.pack import PackOptions, pack


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return archive_tree(tmp_path_factory.mktemp("in-place") / "src")


def index_of(dataset: Path) -> Index:
    return Index.load(LocalStore(dataset))


def place_in_tar(dataset: Path, path: str) -> tuple[Path, int, int]:
    """(tar, offset, size) of a member's bytes, from the index."""
    index = index_of(dataset)
    row = index.resolve(path.encode())
    assert row is not None and index.is_file(row)
    shard = int(index.shard[row])
    tar = index.archives[int(index.shard_archive[shard])]["path"]
    return Path(tar), int(index.shard_base[shard]) + int(index.offset[row]), int(index.size[row])


def write_shards(folder: Path, shards: int, samples: int) -> dict[str, bytes]:
    """WebDataset-style shards (``shard-NNNNNN.tar`` of ``KEY.jpg`` and ``KEY.cls``); the bytes
    each member should be served as, by its path in the mount."""
    folder.mkdir(parents=True)
    expected = {}
    for s in range(shards):
        with tarfile.open(folder / f"shard-{s:06d}.tar", "w", format=tarfile.USTAR_FORMAT) as out:
            for k in range(samples):
                for suffix, data in (("jpg", os.urandom(1000 + 37 * k)), ("cls", str(k % 5).encode())):
                    info = tarfile.TarInfo(f"{s:03d}{k:05d}.{suffix}")
                    info.size = len(data)
                    out.addfile(info, io.BytesIO(data))
                    expected[f"shard-{s:06d}/{info.name}"] = data
    return expected


def test_a_folder_of_webdataset_shards_becomes_a_folder_per_shard(tmp_path: Path) -> None:
    expected = write_shards(tmp_path / "shards", shards=3, samples=20)
    dst = tmp_path / "dst"
    dlfs("pack", "--in-place", tmp_path / "shards", dst)
    with mounted(dst, tmp_path / "mnt") as mnt:
        got = {str(p.relative_to(mnt)): p.read_bytes() for p in mnt.rglob("*") if p.is_file()}
        folders = sorted(p.name for p in mnt.iterdir())
    assert got == expected
    assert folders == [f"shard-{s:06d}" for s in range(3)]
    assert len(index_of(dst).archives) == 3


def imagenet_like(tmp_path: Path, files: int = 60, classes: int = 4) -> tuple[Path, Path]:
    """The tree ``tools/make_imagenet_like.py`` makes, and ImageNet's train tar of it (a tar of
    one tar per class folder)."""
    tree, train = tmp_path / "tree", tmp_path / "train.tar"
    make = [TOOLS / "make_imagenet_like.py", tree, "--files", str(files), "--classes", str(classes)]
    tool(*make, "--payload", "tiny", "--train-tar", train)
    return tree, train


def test_nested_class_tars_are_served_in_place_with_expand_tars(tmp_path: Path) -> None:
    tree, train = imagenet_like(tmp_path)
    dst = tmp_path / "dst"
    dlfs("pack", "--in-place", "--expand-tars", train, dst)
    with mounted(dst, tmp_path / "mnt") as mnt:
        got = {p.relative_to(mnt): p.read_bytes() for p in mnt.rglob("*") if p.is_file()}
    assert got == {p.relative_to(tree): p.read_bytes() for p in tree.rglob("*") if p.is_file()}
    assert [a["path"] for a in index_of(dst).archives] == [str(train)]


def test_a_tar_larger_than_a_shard_is_cut_into_shards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Offsets are 32-bit within a shard: a tar past ``IN_PLACE_SHARD_MAX`` (4 GiB) takes several, each
    starting at a member (here with the limit lowered to 64 KiB, in process)."""
    from dlfs.pack.archive import in_place

    monkeypatch.setattr(in_place, "IN_PLACE_SHARD_MAX", 64 << 10)
    expected = write_shards(tmp_path / "shards", shards=1, samples=80)
    dst = tmp_path / "dst"
    pack(tmp_path / "shards" / "shard-000000.tar", dst, PackOptions(progress=False, in_place=True))
    monkeypatch.undo()
    index = index_of(dst)
    assert len(index.shard_names) > 1 and all(size <= 64 << 10 for size in index.shard_sizes)
    with mounted(dst, tmp_path / "mnt") as mnt:
        got = {p.name: p.read_bytes() for p in mnt.rglob("*") if p.is_file()}
    assert got == {path.split("/")[1]: data for path, data in expected.items()}


@pytest.mark.parametrize("change", ["mtime", "size"])
def test_a_tar_changed_since_it_was_indexed_is_refused_at_mount(tmp_path: Path, change: str) -> None:
    write_shards(tmp_path / "shards", shards=1, samples=5)
    tar = tmp_path / "shards" / "shard-000000.tar"
    dst = tmp_path / "dst"
    dlfs("pack", "--in-place", tar, dst)
    if change == "mtime":
        os.utime(tar, ns=(tar.stat().st_atime_ns, tar.stat().st_mtime_ns + 1_000_000_000))
    else:
        with open(tar, "ab") as f:
            f.write(bytes(512))
    (tmp_path / "mnt").mkdir()
    result = dlfs("mount", dst, tmp_path / "mnt", check=False)
    assert_one_line_error(result, str(tar), "changed since it was indexed", "re-run dlfs pack --in-place")
    assert_one_line_error(dlfs("verify", dst, check=False), "re-run dlfs pack --in-place")


def test_a_missing_tar_is_refused_at_mount(tmp_path: Path) -> None:
    write_shards(tmp_path / "shards", shards=1, samples=5)
    tar = tmp_path / "shards" / "shard-000000.tar"
    dlfs("pack", "--in-place", tar, tmp_path / "dst")
    tar.rename(tmp_path / "elsewhere.tar")
    (tmp_path / "mnt").mkdir()
    result = dlfs("mount", tmp_path / "dst", tmp_path / "mnt", check=False)
    assert_one_line_error(result, str(tar), "missing")


def flip_in_place(path: Path, offset: int) -> None:
    """Change one byte of a file, leaving its size and mtime as they were."""
    before = path.stat()
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


@pytest.mark.parametrize("threads", ["4", "0"])
def test_a_byte_changed_inside_a_member_is_eio(tmp_path: Path, threads: str) -> None:
    """Through the C threads and through Python alike."""
    expected = write_shards(tmp_path / "shards", shards=1, samples=10)
    dst = tmp_path / "dst"
    dlfs("pack", "--in-place", tmp_path / "shards", dst)
    victim = "shard-000000/00000003.jpg"
    tar, offset, size = place_in_tar(dst, victim)
    flip_in_place(tar, offset + size // 2)
    with mounted(dst, tmp_path / "mnt", "--native-threads", threads) as mnt:
        with pytest.raises(OSError) as caught:
            (mnt / victim).read_bytes()
        assert caught.value.errno == errno.EIO
        assert (mnt / "shard-000000/00000004.jpg").read_bytes() == expected["shard-000000/00000004.jpg"]
    bad = json.loads(dlfs("verify", dst, "--json", check=False).stdout)["bad"]
    assert [entry["path"].split(" ")[0] for entry in bad] == [victim]


@pytest.mark.parametrize("kind", ["tar.gz", "tar.zst"])
def test_a_compressed_tar_is_refused_with_in_place(tree: Path, tmp_path: Path, kind: str) -> None:
    archive = write_tar("pax", tree, tmp_path / f"src.{kind}", COMPRESSORS[kind.removeprefix("tar.")])
    result = dlfs("pack", "--in-place", archive, tmp_path / "dst", check=False)
    assert_one_line_error(result, str(archive), kind, "pack without --in-place")


def test_a_folder_with_other_files_than_tars_is_refused_with_in_place(tmp_path: Path) -> None:
    write_shards(tmp_path / "shards", shards=1, samples=2)
    (tmp_path / "shards" / "README").write_text("hello")
    result = dlfs("pack", "--in-place", tmp_path / "shards", tmp_path / "dst", check=False)
    assert_one_line_error(result, "README", "not a .tar")


def test_info_ls_and_verify_name_the_tars(tmp_path: Path) -> None:
    write_shards(tmp_path / "shards", shards=2, samples=3)
    dst = tmp_path / "dst"
    dlfs("pack", "--in-place", tmp_path / "shards", dst)
    tars = [str(tmp_path / "shards" / f"shard-{s:06d}.tar") for s in range(2)]
    info = json.loads(dlfs("info", dst, "--json").stdout)
    assert info["archives"] == tars
    for output in (dlfs("info", dst).stdout, dlfs("ls", "-l", dst).stdout, dlfs("verify", dst).stdout):
        assert "served in place from 2 tar(s)" in output and all(tar in output for tar in tars), output


def test_shuffled_readers_get_every_byte_from_the_c_threads(tmp_path: Path) -> None:
    _, train = imagenet_like(tmp_path, files=200, classes=5)
    dst = tmp_path / "dst"
    dlfs("pack", "--in-place", "--expand-tars", train, dst)
    tree = tmp_path / "tree"
    expected = {p.relative_to(tree): p.read_bytes() for p in tree.rglob("*") if p.is_file()}
    paths = list(expected)
    random.Random(7).shuffle(paths)
    with mounted(dst, tmp_path / "mnt", "--native-threads", "4") as mnt:

        def read(share: list[Path]) -> list[bool]:
            return [(mnt / path).read_bytes() == expected[path] for path in share]

        with ThreadPoolExecutor(8) as pool:
            outcomes = [ok for share in pool.map(read, [paths[k::8] for k in range(8)]) for ok in share]
        native = json.loads((mnt / ".dlfs" / "stats").read_bytes())["native"]
    assert all(outcomes) and len(outcomes) == len(paths)
    assert native["answered"]["read"] >= len(paths) // 2, native


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_an_archive_path_that_is_not_a_regular_file_is_refused_at_mount(tmp_path: Path, kind: str) -> None:
    """The index names files the daemon opens: one that is not a regular file is refused (a FIFO
    without hanging the mount)."""
    write_shards(tmp_path / "shards", shards=1, samples=2)
    tar = tmp_path / "shards" / "shard-000000.tar"
    dlfs("pack", "--in-place", tar, tmp_path / "dst")
    tar.unlink()
    if kind == "fifo":
        os.mkfifo(tar)
    elif kind == "device":  # a device's open is an action (a watchdog arms): it is never opened
        os.mknod(tar, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    else:
        tar.mkdir()
    (tmp_path / "mnt").mkdir()
    result = dlfs("mount", tmp_path / "dst", tmp_path / "mnt", check=False, timeout=60)
    assert_one_line_error(result, str(tar), "not a regular file")


def test_an_archive_the_index_owner_could_not_read_is_refused_at_mount(tmp_path: Path) -> None:
    """Checksums are no secret: an index naming a file of another user's would learn it byte by
    byte from which rows read. The archive must be the index owner's, or readable by every user."""
    write_shards(tmp_path / "shards", shards=1, samples=2)
    tar = tmp_path / "shards" / "shard-000000.tar"
    tar.chmod(0o640)
    dlfs("pack", "--in-place", tar, tmp_path / "dst")
    indexed = tar.stat()
    os.chown(tar, 4321, indexed.st_gid)
    os.utime(tar, ns=(indexed.st_atime_ns, indexed.st_mtime_ns))  # the file indexed, but another's
    (tmp_path / "mnt").mkdir()
    result = dlfs("mount", tmp_path / "dst", tmp_path / "mnt", check=False, timeout=60)
    assert_one_line_error(result, str(tar), "belongs to uid 4321", "re-run dlfs pack --in-place")
    tar.chmod(0o644)
    with mounted(tmp_path / "dst", tmp_path / "mnt2") as mnt:  # readable by every user: served
        assert sum(1 for p in mnt.rglob("*") if p.is_file()) == 4


@pytest.mark.parametrize("name", ["gnu.tar", "tarfile.tar"])
@FUZZ
@given(data=st.data())
def test_a_mutated_tar_indexes_in_place_soundly_or_is_refused_in_one_line(
    archives: Seeds,
    tmp_path: Path,
    report: None,
    name: str,
    data: st.DataObject,
) -> None:
    """The archive fuzz (``test_archive_fuzz``) for the in-place pass, which seeks past members'
    bytes where an ordinary pack reads them: a sound dataset whose every file reads back from the
    tar, or one ``PackError`` and no index."""
    work = tmp_path / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    src, dst = work / name, work / "dst"
    src.write_bytes(mutate(archives[name], data))
    options = PackOptions(progress=False, in_place=True, expand_tars=data.draw(st.booleans()))
    try:
        pack(src, dst, options)
    except PackError as exc:
        assert "\n" not in str(exc)
        assert not (dst / fmt.INDEX_NAME).exists()
        OUTCOMES["refused"] += 1
        return
    index = index_of(dst)
    store = shard_store(index, LocalStore(dst))
    try:
        assert_sound(index)
        file_bytes = FileBytes(index, store, RamCache(1 << 20))
        for row in index.regular_rows().tolist():
            assert len(file_bytes.load(row)) == int(index.size[row])
    finally:
        store.close()
    OUTCOMES["packed"] += 1


def test_a_folder_of_more_tars_than_the_open_files_limit_mounts(tmp_path: Path) -> None:
    """Thousands of WebDataset shards are common where 1,024 open files is the default soft limit:
    pack opens one tar at a time, and the mount raises its soft limit to the hard one."""
    expected = write_shards(tmp_path / "shards", shards=80, samples=2)
    dst = tmp_path / "dst"
    low = ["prlimit", "--nofile=64:4096"]
    dlfs("pack", "--in-place", tmp_path / "shards", dst, launcher=low)
    with mounted(dst, tmp_path / "mnt", launcher=low) as mnt:
        got = {str(p.relative_to(mnt)): p.read_bytes() for p in mnt.rglob("*") if p.is_file()}
    assert got == expected
