"""An S3 prefix of objects, one per file, as a pack source, against a real S3 server (SeaweedFS):
the objects mount as the files of a tree, keys are refused by the archive rules, an object written
again after the listing stops the pack, and many GETs are in flight at once."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from commands import DLFS, assert_one_line_error, dlfs
from obstore import Bytes
from trees import SMALL_SHARD
from waits import HANG, bound, wait_for_files

from dlfs.core import format as fmt
from dlfs.core.errors import PackError
from dlfs.core.file_bytes import FileBytes
from dlfs.core.index import Index
from dlfs.core.ram_cache import RamCache
from dlfs.core.store.local import LocalStore
from dlfs.core.store.s3.store import S3Store, StoredObject
from dlfs.pack import PackOptions, objects, pack
from dlfs.pack.archive import archive_source

pytestmark = pytest.mark.timeout(120)

#: Objects of a small ImageNet-like tree: nested keys, UTF-8 beyond ASCII, an empty object, a folder
#: marker beside the objects below it and one for a folder with nothing in it.
TREE = {
    "n01/": b"",
    "n01/x.JPEG": os.urandom(3000),
    "n01/y.JPEG": os.urandom(10),
    "n02/deep/z.bin": b"z" * 70_000,
    "café/naïve-ü.txt": "déjà vu".encode(),
    "empty.txt": b"",
    "marked-empty/": b"",
    "top.txt": b"top",
}


def split(url: str) -> tuple[str, str]:
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    return bucket, prefix


def put(s3_server, url: str, objects: dict[str, bytes]) -> None:
    """Upload ``objects`` below ``url``, several at once."""
    bucket, prefix = split(url)
    client = s3_server.client()
    with ThreadPoolExecutor(16) as pool:
        for done in [
            pool.submit(client.put_object, Bucket=bucket, Key=f"{prefix}/{key}", Body=body)
            for key, body in objects.items()
        ]:
            done.result()


def listed_mtimes(s3_server, url: str) -> dict[str, int]:
    """Each key's LastModified as S3 lists it, in ns."""
    bucket, prefix = split(url)
    pages = s3_server.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
    return {
        item["Key"].removeprefix(prefix + "/"): int(item["LastModified"].timestamp()) * 10**9
        + item["LastModified"].microsecond * 1000
        for page in pages
        for item in page.get("Contents", [])
    }


def packed_files(dataset: Path) -> dict[bytes, bytes]:
    """Every regular file of a packed dataset with its bytes, read through the index."""
    store = LocalStore(dataset)
    try:
        index = Index.load(store)
        file_bytes = FileBytes(index, store, RamCache(1 << 20))
        return {index.path(int(row)): bytes(file_bytes.load(int(row))) for row in index.file_rows()}
    finally:
        store.close()


def test_objects_below_a_prefix_mount_as_files_with_their_bytes_sizes_and_times(
    s3_server, s3: str, tmp_path: Path, mount
) -> None:
    put(s3_server, s3, TREE)
    times = listed_mtimes(s3_server, s3)
    dst = tmp_path / "dst"
    out = dlfs("pack", f"{s3}/", dst, "--shard-size", str(SMALL_SHARD)).stdout
    assert "packed 6 files, 6 directories" in out  # root, n01, n02, n02/deep, café, marked-empty
    files = {key: body for key, body in TREE.items() if not key.endswith("/")}
    with mount(dst) as mnt:
        found = {str(path.relative_to(mnt)) + ("/" if path.is_dir() else ""): path for path in mnt.rglob("*")}
        assert set(found) == set(files) | {"n01/", "n02/", "n02/deep/", "café/", "marked-empty/"}
        for key, body in files.items():
            st = found[key].stat()
            assert found[key].read_bytes() == body
            assert (stat.S_IMODE(st.st_mode), st.st_size, st.st_uid) == (0o644, len(body), os.geteuid())
            assert st.st_mtime_ns == times[key]
        for key in ("n01/", "marked-empty/", "n02/"):
            st = found[key].stat()
            assert stat.S_ISDIR(st.st_mode)
            assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o755, os.geteuid())
        assert found["marked-empty/"].stat().st_mtime_ns == times["marked-empty/"]
        assert not list(found["marked-empty/"].iterdir())


def test_a_prefix_of_objects_packs_into_a_dataset_in_a_bucket(s3_server, s3: str, tmp_path: Path) -> None:
    put(s3_server, f"{s3}/objects", TREE)
    dlfs("pack", f"{s3}/objects/", f"{s3}/dataset", "--shard-size", str(SMALL_SHARD))
    local = tmp_path / "local"
    dlfs("pack", f"{s3}/objects/", local)
    assert "OK: checked" in dlfs("verify", f"{s3}/dataset").stdout
    assert dlfs("ls", "-R", f"{s3}/dataset").stdout == dlfs("ls", "-R", local).stdout
    assert packed_files(local) == {key.encode(): body for key, body in TREE.items() if not key.endswith("/")}


def test_the_map_places_objects_as_it_places_archive_members(s3_server, s3: str, tmp_path: Path) -> None:
    put(s3_server, s3, {"val/a.JPEG": b"a", "val/b.JPEG": b"b"})
    (tmp_path / "val.csv").write_text("val/a.JPEG,n01/a.JPEG\nval/b.JPEG,n02/b.JPEG\n")
    dlfs("pack", f"{s3}/", tmp_path / "dst", "--map", tmp_path / "val.csv")
    assert packed_files(tmp_path / "dst") == {b"n01/a.JPEG": b"a", b"n02/b.JPEG": b"b"}


def test_a_large_object_is_fetched_in_ranged_gets_and_streamed_into_its_shard(
    s3_server, s3: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the whole-payload limit (lowered here) an object is never held whole."""
    monkeypatch.setattr(fmt, "WHOLE_PAYLOAD_LIMIT", 1000)
    monkeypatch.setattr(objects, "STREAM_CHUNK", 300)
    monkeypatch.setattr(archive_source, "STREAM_CHUNK", 300)
    big = os.urandom(2500)
    put(s3_server, s3, {"big.bin": big, "small.bin": b"s"})
    ranges: dict[str, list[tuple[int, int]]] = {}
    get_object = S3Store.get_object

    def spy(self: S3Store, key: str, offset: int, length: int, etag: str | None = None) -> Bytes:
        assert etag is not None
        ranges.setdefault(key, []).append((offset, length))
        return get_object(self, key, offset, length, etag)

    monkeypatch.setattr(S3Store, "get_object", spy)
    pack(s3, tmp_path / "dst", PackOptions(progress=False))
    assert packed_files(tmp_path / "dst") == {b"big.bin": big, b"small.bin": b"s"}
    assert ranges == {
        "big.bin": [(start, min(300, 2500 - start)) for start in range(0, 2500, 300)],
        "small.bin": [(0, 1)],
    }


@pytest.mark.parametrize("large", [False, True], ids=["whole", "ranged"])
def test_an_object_written_again_after_the_listing_stops_the_pack_and_publishes_nothing(
    s3_server, s3: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, large: bool
) -> None:
    if large:
        monkeypatch.setattr(fmt, "WHOLE_PAYLOAD_LIMIT", 100)
    put(s3_server, s3, {"a.bin": b"a" * 500, "b.bin": b"b" * 500})
    bucket, prefix = split(s3)
    listing = S3Store.objects

    def rewritten_after_listing(self: S3Store) -> Iterator[StoredObject]:
        listed = list(listing(self))
        s3_server.client().put_object(Bucket=bucket, Key=f"{prefix}/b.bin", Body=b"B" * 500)
        yield from listed

    monkeypatch.setattr(S3Store, "objects", rewritten_after_listing)
    with pytest.raises(PackError, match=r"b\.bin changed while it was packed; re-run dlfs pack"):
        pack(s3, tmp_path / "dst", PackOptions(progress=False))
    assert not (tmp_path / "dst").exists()


def test_keys_that_break_the_archive_rules_are_refused_or_skipped(
    s3_server, s3: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server stores some bad keys itself; the ones it refuses to store (``..``, ``.``, empty
    components, overlong names), which other S3 services hold, are added to its listing. A key
    that is a file and a folder too is the folder, which the listing gives later."""
    put(s3_server, s3, {"ok.txt": b"ok", "tab\tname": b"t", "both": b"file", "both/inner": b"i"})
    listing = S3Store.objects
    unstorable = ["a/../up", "./dot", "a//b", "/lead", "x" * 256, "full/", "nul\0x"]

    def with_unstorable(self: S3Store) -> Iterator[StoredObject]:
        for key in unstorable:  # refused before any GET: no object need exist
            yield StoredObject(key, 4 if key == "full/" else 1, '"0"', 0)
        yield from listing(self)

    monkeypatch.setattr(S3Store, "objects", with_unstorable)
    with pytest.raises(PackError, match=r"object a/\.\./up has a '\.\.' in its path.*--skip-errors"):
        pack(s3, tmp_path / "refused", PackOptions(progress=False))
    summary = pack(s3, tmp_path / "dst", PackOptions(progress=False, skip_errors=True))
    assert packed_files(tmp_path / "dst") == {b"ok.txt": b"ok", b"both/inner": b"i"}
    assert sorted(summary.skipped_paths) == sorted(["tab\tname", *unstorable])
    assert summary.duplicates == 1, "both: a file, then a folder (both/inner), which came later"


def test_the_cli_refuses_a_bad_key_in_one_line(s3_server, s3: str, tmp_path: Path) -> None:
    put(s3_server, s3, {"ok.txt": b"ok", "bell\aname": b"b"})
    result = dlfs("pack", s3, tmp_path / "dst", check=False)
    assert_one_line_error(result, "control character", "--skip-errors")


def test_many_small_objects_pack_with_many_gets_in_flight(
    s3_server, s3: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first 32 GETs meet at a barrier, which opens only when 32 are in flight at once."""
    tree = {f"n{i % 20:02d}/{i:05d}.JPEG": os.urandom(100 + i % 300) for i in range(2000)}
    put(s3_server, s3, tree)
    barrier = threading.Barrier(32, timeout=20)
    get_object = S3Store.get_object

    def meeting(self: S3Store, key: str, offset: int, length: int, etag: str | None = None) -> Bytes:
        if key < "n00/00640":  # the first 32 keys listed: n00/00000, n00/00020, ..., n00/00620
            barrier.wait()
        return get_object(self, key, offset, length, etag)

    monkeypatch.setattr(S3Store, "get_object", meeting)
    summary = pack(s3, tmp_path / "dst", PackOptions(progress=False, threads=objects.DEFAULT_THREADS))
    assert summary.files == 2000
    assert packed_files(tmp_path / "dst") == {key.encode(): body for key, body in tree.items()}


def test_gets_go_on_while_the_pass_is_busy_writing(
    s3_server, s3: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With 4 GETs in flight and the pass held at its first member, all 40 objects still arrive:
    fetched bytes wait for the pass, they do not stop the GETs."""
    tree = {f"c/{i:03d}.bin": os.urandom(1000) for i in range(40)}
    put(s3_server, s3, tree)
    fetched: list[str] = []
    all_fetched = threading.Event()
    get_object = S3Store.get_object

    def counted(self: S3Store, key: str, offset: int, length: int, etag: str | None = None) -> Bytes:
        data = get_object(self, key, offset, length, etag)
        fetched.append(key)
        if len(fetched) == len(tree):
            all_fetched.set()
        return data

    record_member = objects.record_member
    arrived: list[bool] = []

    def held_at_first(*args: object) -> None:
        if not arrived:
            arrived.append(all_fetched.wait(bound(HANG)))
        record_member(*args)

    monkeypatch.setattr(S3Store, "get_object", counted)
    monkeypatch.setattr(objects, "record_member", held_at_first)
    pack(s3, tmp_path / "dst", PackOptions(progress=False, threads=4))
    assert arrived == [True]
    assert packed_files(tmp_path / "dst") == {key.encode(): body for key, body in tree.items()}


@pytest.mark.parametrize(
    ("where", "words"),
    [
        ("empty", ["holds no objects", "check the bucket and the prefix"]),
        ("no-bucket", ["does not exist", "create it or fix the URL"]),
        ("bad-secret", ["access denied", "check the credentials"]),
    ],
)
def test_a_source_that_cannot_be_listed_is_one_line(
    s3: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, words: list[str]
) -> None:
    url = {"empty": f"{s3}/nothing-here/", "no-bucket": "s3://no-such-bucket-dlfs/p/"}.get(where, s3)
    if where == "bad-secret":
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    assert_one_line_error(dlfs("pack", url, tmp_path / "dst", check=False), *words)


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--expand-tars"], ["--expand-tars", "prefix of objects"]),
        (["--placement", "random"], ["--placement random"]),
    ],
)
def test_flags_an_object_source_cannot_take_are_refused_in_one_line(
    tmp_path: Path, flags: list[str], words: list[str]
) -> None:
    assert_one_line_error(dlfs("pack", "s3://bucket/prefix/", tmp_path / "dst", *flags, check=False), *words)


def test_an_interrupted_pack_from_a_prefix_leaves_nothing_behind(s3_server, s3: str, tmp_path: Path) -> None:
    put(s3_server, s3, {f"c/{i:04d}.bin": os.urandom(16 << 10) for i in range(600)})
    dst = tmp_path / "dst"
    # As from a terminal: a background job ignores SIGINT unless told otherwise.
    proc = subprocess.Popen(
        [*DLFS, "-q", "pack", s3, dst, "--shard-size", "64K", "--threads", "1"],
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        wait_for_files(dst, "*.shard", proc.pid, "the pack's third shard", more_than=2)
        proc.send_signal(signal.SIGINT)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == 130
    assert not dst.exists()
