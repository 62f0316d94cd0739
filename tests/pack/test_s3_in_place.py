"""``dlfs pack --in-place`` of tars in S3 (a real SeaweedFS server): one tar object, a prefix of
WebDataset shards, nested tars; each object checked at mount by its ETag and read by GETs of that
version only; the disk tier and the read-ahead as for any dataset in S3."""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path

import pytest
from archives import COMPRESSORS, archive_tree, extract, listing, write_tar
from commands import assert_one_line_error, dlfs
from mounts import counters_of, mounted
from s3env import TEST_BUCKET
from seaweed import SeaweedServer
from waits import wait_for

from dlfs.core.index import Index
from dlfs.core.protocol import order_path, parse_order
from dlfs.core.store.local import LocalStore

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return archive_tree(tmp_path_factory.mktemp("s3-in-place") / "src")


def upload(server: SeaweedServer, url: str, path: Path) -> None:
    """Put the file ``path`` at ``url`` (``s3://bucket/key``)."""
    bucket, _, key = url.removeprefix("s3://").partition("/")
    server.client().upload_file(str(path), bucket, key)


def gnu_tar(out: Path, folder: Path, *names: str) -> Path:
    command = ["tar", "--format=gnu", "-cf", out, "-C", folder, *(names or ["."])]
    subprocess.run(command, check=True, timeout=60)
    return out


def write_shards(folder: Path, shards: int, samples: int) -> dict[str, bytes]:
    """WebDataset-style shards written by GNU tar (``shard-NNNNNN.tar`` of ``KEY.jpg`` and
    ``KEY.cls``); the bytes each member should be served as, by its path in the mount."""
    expected = {}
    for s in range(shards):
        samples_dir = folder / f"samples-{s}"
        samples_dir.mkdir(parents=True)
        for k in range(samples):
            for suffix, data in (("jpg", os.urandom(3000 + 997 * k)), ("cls", str(k % 5).encode())):
                name = f"{s:03d}{k:05d}.{suffix}"
                (samples_dir / name).write_bytes(data)
                expected[f"shard-{s:06d}/{name}"] = data
        gnu_tar(folder / f"shard-{s:06d}.tar", samples_dir)
    return expected


def files_of(mnt: Path) -> dict[str, bytes]:
    return {str(p.relative_to(mnt)): p.read_bytes() for p in mnt.rglob("*") if p.is_file()}


def stats(mnt: Path) -> dict:
    return json.loads((mnt / ".dlfs" / "stats").read_text())


@pytest.fixture
def shards(s3_server: SeaweedServer, s3: str, tmp_path: Path) -> tuple[str, dict[str, bytes]]:
    """A prefix of three WebDataset shards in S3, and what the mount should serve."""
    expected = write_shards(tmp_path / "shards", shards=3, samples=12)
    for tar in sorted((tmp_path / "shards").glob("*.tar")):
        upload(s3_server, f"{s3}/shards/{tar.name}", tar)
    return f"{s3}/shards/", expected


@pytest.mark.parametrize("index_in", ["directory", "bucket"])
def test_a_tar_in_s3_is_served_in_place_as_tar_x_extracts_it(
    tree: Path, tmp_path: Path, s3_server: SeaweedServer, s3: str, index_in: str
) -> None:
    tar = gnu_tar(tmp_path / "src.tar", tree)
    upload(s3_server, f"{s3}/src.tar", tar)
    dst = str(tmp_path / "dst") if index_in == "directory" else f"{s3}/dataset"
    dlfs("pack", "--in-place", f"{s3}/src.tar", dst)
    with mounted(dst, tmp_path / "mnt") as mnt:
        got = listing(mnt)
    assert got == listing(extract(tar, tmp_path / "extracted"))


def test_a_prefix_of_webdataset_shards_becomes_a_folder_per_shard_read_in_blocks(
    shards: tuple[str, dict[str, bytes]], tmp_path: Path, mount
) -> None:
    prefix, expected = shards
    result = dlfs("pack", "-v", "--in-place", prefix, tmp_path / "dst")
    index = Index.load(LocalStore(tmp_path / "dst"))
    assert [archive["url"] for archive in index.archives] == [f"{prefix}shard-{s:06d}.tar" for s in range(3)]
    assert all(archive["etag"] and archive["size"] for archive in index.archives)
    assert "tar(s)" in result.stdout
    with mount(tmp_path / "dst") as mnt:
        assert sorted(p.name for p in Path(mnt).iterdir()) == [f"shard-{s:06d}" for s in range(3)]
        assert files_of(Path(mnt)) == expected


def test_the_pass_reads_each_tar_in_a_few_large_gets(
    shards: tuple[str, dict[str, bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """36 members a tar, and one GET each for the tar's few blocks, none per member."""
    from dlfs.core.store.s3.store import S3Store
    from dlfs.pack import PackOptions, pack

    gets: list[tuple[str, int, int]] = []
    get_object = S3Store.get_object

    def counted(self: S3Store, key: str, offset: int, length: int, etag: str | None = None):
        gets.append((key, offset, length))
        return get_object(self, key, offset, length, etag)

    monkeypatch.setattr(S3Store, "get_object", counted)
    monkeypatch.setattr("dlfs.pack.archive.positional.BLOCK", 16 << 10)
    prefix, expected = shards
    pack(prefix, tmp_path / "dst", PackOptions(progress=False, in_place=True))
    sizes = {archive["url"]: archive["size"] for archive in Index.load(LocalStore(tmp_path / "dst")).archives}
    blocks = sum(-(-size // (16 << 10)) for size in sizes.values())
    assert len(gets) <= blocks < len(expected), (len(gets), blocks)


def test_nested_tars_in_an_s3_tar_are_served_in_place_with_expand_tars(
    tmp_path: Path, s3_server: SeaweedServer, s3: str
) -> None:
    classes = tmp_path / "classes"
    for c in range(3):
        for k in range(5):
            path = classes / f"n{c:08d}" / f"n{c:08d}_{k}.JPEG"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(os.urandom(2000 + 311 * k))
    tars = tmp_path / "tars"
    tars.mkdir()
    for folder in sorted(classes.iterdir()):
        gnu_tar(tars / f"{folder.name}.tar", folder)
    upload(s3_server, f"{s3}/train.tar", gnu_tar(tmp_path / "train.tar", tars))
    dlfs("pack", "--in-place", "--expand-tars", f"{s3}/train.tar", tmp_path / "dst")
    with mounted(tmp_path / "dst", tmp_path / "mnt") as mnt:
        got = files_of(mnt)
    assert got == {str(p.relative_to(classes)): p.read_bytes() for p in classes.rglob("*") if p.is_file()}


def test_an_object_rewritten_since_it_was_indexed_is_refused_at_mount_in_one_line(
    shards: tuple[str, dict[str, bytes]], tmp_path: Path, s3_server: SeaweedServer
) -> None:
    prefix, _ = shards
    dlfs("pack", "--in-place", prefix, tmp_path / "dst")
    same_size = tmp_path / "again.tar"
    same_size.write_bytes(b"\0" * Index.load(LocalStore(tmp_path / "dst")).archives[1]["size"])
    upload(s3_server, f"{prefix}shard-000001.tar", same_size)
    result = dlfs("mount", tmp_path / "dst", tmp_path / "mnt", check=False)
    changed = f"archive {prefix}shard-000001.tar has changed since it was indexed"
    assert_one_line_error(result, changed, "re-run dlfs pack --in-place")
    assert not os.path.ismount(tmp_path / "mnt")


def test_an_object_rewritten_after_the_mount_reads_as_eio(
    shards: tuple[str, dict[str, bytes]], tmp_path: Path, s3_server: SeaweedServer, mount
) -> None:
    prefix, expected = shards
    dlfs("pack", "--in-place", prefix, tmp_path / "dst")
    with mount(tmp_path / "dst", "--readahead-budget", "0") as mnt:
        first = "shard-000000/00000000.jpg"
        assert (Path(mnt) / first).read_bytes() == expected[first]
        # The file read keeps its bytes: only the tar's end-of-archive padding changes, and its ETag.
        tar = tmp_path / "shards" / "shard-000002.tar"
        tar.write_bytes(tar.read_bytes()[:-1] + b"\1")
        upload(s3_server, f"{prefix}shard-000002.tar", tar)
        with pytest.raises(OSError) as info:
            (Path(mnt) / "shard-000002" / "00200003.jpg").read_bytes()
        assert info.value.errno == errno.EIO


@pytest.mark.parametrize("index_in", ["directory", "bucket"])
def test_the_disk_tier_serves_a_second_read_without_gets(
    shards: tuple[str, dict[str, bytes]], tmp_path: Path, mount, index_in: str
) -> None:
    """Also where the index is in the bucket, read through the same disk tier."""
    prefix, expected = shards
    dst = tmp_path / "dst" if index_in == "directory" else prefix.removesuffix("shards/") + "dataset"
    dlfs("pack", "--in-place", prefix, dst)
    cache = ("--disk-tier", str(tmp_path / "cache"), "--disk-tier-size", "64M")
    with mount(dst, *cache) as mnt:
        assert files_of(Path(mnt)) == expected
        assert stats(Path(mnt))["disk_tier"]["misses"] > 0
    assert list((tmp_path / "cache" / "shards").glob("*.window"))
    with mount(dst, *cache) as mnt:
        before = stats(Path(mnt))["store"]
        assert files_of(Path(mnt)) == expected
        after = stats(Path(mnt))
    assert after["store"] == before  # every byte from the disk tier
    assert after["disk_tier"]["hits"] > 0 and after["disk_tier"]["misses"] == 0


@pytest.mark.parametrize("tier", ["without", "with"])
def test_the_read_ahead_fetches_the_published_order_from_s3(
    shards: tuple[str, dict[str, bytes]], tmp_path: Path, mount, tier: str
) -> None:
    """Through the disk tier the C loop reads the tier's file, which holds each shard at its own
    offsets, not the object's."""
    prefix, expected = shards
    dlfs("pack", "--in-place", prefix, tmp_path / "dst")
    cache = ("--disk-tier", str(tmp_path / "cache"), "--disk-tier-size", "64M") if tier == "with" else ()
    with mount(tmp_path / "dst", "--readahead-budget", "64M", *cache) as mnt:
        mnt = Path(mnt)
        for path in mnt.rglob("*"):  # the kernel must know an inode before pages can be pushed to it
            path.stat()
        paths = [mnt / path for path in parse_order((mnt / ".dlfs" / "order" / "epoch-0").read_bytes())]

        def fetched() -> bool:
            readahead = stats(mnt)["readahead"]
            return readahead["readings"]["epoch-0.rank-0-of-1"]["fetched"] == len(paths)

        wait_for(fetched, "the read-ahead to fetch the epoch", counters_of(mnt))
        data = [path.read_bytes() for path in paths]
        readahead = stats(mnt)["readahead"]
    assert data == [expected[str(path.relative_to(mnt))] for path in paths]
    # Every file but the sentinels the read-ahead leaves to the reader (one in sentinel_every).
    assert readahead["pushed_files"] >= len(paths) * 0.8, readahead


def test_two_nodes_each_fetch_about_half_of_the_tars(
    tmp_path: Path, s3_server: SeaweedServer, s3: str, mount
) -> None:
    """As for a packed dataset in S3 (``test_s3_mount``): two mounts stand for ranks 0 and 1 of 2,
    and each one's read-ahead fetches its rank's files, about half of the tars' bytes."""
    expected = write_shards(tmp_path / "shards", shards=4, samples=60)
    tars = sorted((tmp_path / "shards").glob("*.tar"))
    for tar in tars:
        upload(s3_server, f"{s3}/shards/{tar.name}", tar)
    dlfs("pack", "--in-place", f"{s3}/shards/", tmp_path / "dst")
    total = sum(tar.stat().st_size for tar in tars)
    flags = ("--order", "block", "--block", "32", "--window", "64", "--readahead-budget", "8M")
    fetched = []
    with mount(tmp_path / "dst", *flags) as node0, mount(tmp_path / "dst", *flags) as node1:
        for rank, mnt in enumerate((Path(node0), Path(node1))):
            paths = parse_order(order_path(mnt, 0, 2, rank).read_bytes())
            for path in paths:
                assert (mnt / path).read_bytes() == expected[path]
            fetched.append(stats(mnt)["store"]["bytes"])
    shares = [part / total for part in fetched]
    assert all(0.35 < share < 0.75 for share in shares), shares
    assert sum(shares) < 1.3, shares


def test_info_ls_and_verify_name_the_s3_tars(shards: tuple[str, dict[str, bytes]], tmp_path: Path) -> None:
    prefix, _ = shards
    dst = tmp_path / "dst"
    dlfs("pack", "--in-place", prefix, dst)
    tars = [f"{prefix}shard-{s:06d}.tar" for s in range(3)]
    assert json.loads(dlfs("info", dst, "--json").stdout)["archives"] == tars
    for output in (dlfs("info", dst).stdout, dlfs("ls", "-l", dst).stdout, dlfs("verify", dst).stdout):
        assert "served in place from 3 tar(s)" in output and all(tar in output for tar in tars), output


@pytest.mark.parametrize("kind", ["tar.gz", "tar.zst"])
def test_a_compressed_tar_in_s3_is_refused_with_in_place(
    tree: Path, tmp_path: Path, s3_server: SeaweedServer, s3: str, kind: str
) -> None:
    archive = write_tar("pax", tree, tmp_path / f"src.{kind}", COMPRESSORS[kind.removeprefix("tar.")])
    upload(s3_server, f"{s3}/src.{kind}", archive)
    result = dlfs("pack", "--in-place", f"{s3}/src.{kind}", tmp_path / "dst", check=False)
    assert_one_line_error(result, f"{s3}/src.{kind}", kind, "pack without --in-place")


def test_a_prefix_with_other_objects_than_tars_is_refused(
    shards: tuple[str, dict[str, bytes]], tmp_path: Path, s3_server: SeaweedServer
) -> None:
    prefix, _ = shards
    bucket_key = prefix.removeprefix(f"s3://{TEST_BUCKET}/")
    s3_server.client().put_object(Bucket=TEST_BUCKET, Key=f"{bucket_key}README", Body=b"hello")
    result = dlfs("pack", "--in-place", prefix, tmp_path / "dst", check=False)
    assert_one_line_error(result, "README", "not a .tar")
