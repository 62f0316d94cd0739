"""Crafted indexes whose checksum holds are refused at load, each with a one-line DatasetError.

Each case takes a real packed index, breaks one rule of the format the way a malicious or buggy
writer would, re-encodes it with a valid trailer and loads it.
"""

from __future__ import annotations

import stat
import struct
import tarfile
from collections.abc import Callable

import numpy as np
import pytest
from crafted_index import (
    HUGE,
    ROW_B,
    ROW_LINK,
    ROW_X,
    ROW_Y,
    ROW_Z,
    Arrays,
    Meta,
    both,
    decode,
    edit_sections,
    links_blob,
    lz4_huge,
    make_small_tree,
    past_shard,
    rename,
    same_bytes,
    set_meta,
    set_table,
    set_value,
    sparse_x,
    wrapping,
)
from index_bytes import load, reseal, with_meta

from dlfs.core import format as fmt
from dlfs.core.errors import DatasetError
from dlfs.pack import PackOptions, pack


@pytest.fixture(scope="module")
def valid(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The bytes of a real index packed from ``make_small_tree``."""
    work = tmp_path_factory.mktemp("bad-index")
    pack(make_small_tree(work / "src"), work / "dst", PackOptions(progress=False, shard_size=4096))
    return (work / "dst" / fmt.INDEX_NAME).read_bytes()


LONG = b"p" * 40
COLUMN_CASES: dict[str, tuple[Callable[[Arrays, Meta], None], str]] = {
    "a hard-link table of odd length": (set_table("hardlinks", ROW_X), "hardlinks table is not pairs"),
    "a hard link past the entries": (set_table("hardlinks", ROW_X, ROW_X, 1000, ROW_X), "past the entries"),
    "hard links out of order": (set_table("hardlinks", ROW_Y, ROW_X, ROW_X, ROW_X), "out of order"),
    "a hard-linked folder": (set_table("hardlinks", 1, 1, ROW_X, 1), "is a hard link but not a file"),
    "a hard link alone": (set_table("hardlinks", ROW_X, ROW_X), "alone in its group"),
    "a hard link's inode not its group's first": (
        both(same_bytes, set_table("hardlinks", ROW_X, ROW_Y, ROW_Y, ROW_Y)),
        "not its group's first",
    ),
    "hard links to other bytes": (set_table("hardlinks", ROW_X, ROW_X, ROW_Y, ROW_X), "differs"),
    "a sparse flag without a map": (set_value("flags", ROW_X, fmt.FLAG_SPARSE), "exactly its sparse files"),
    "a map without the sparse flag": (
        both(set_table("sparse", ROW_X, 1), set_table("sparse_runs", 0, 3000)),
        "exactly",
    ),
    "a sparse run past the file": (sparse_x(9000, 3000), "sparse run outside its size"),
    "sparse runs that overlap": (sparse_x(0, 2000, 1000, 1000), "out of order or overlapping"),
    "sparse runs short of the stored bytes": (sparse_x(0, 2000), "other than its sparse runs"),
    "an empty sparse run": (sparse_x(0, 3000, 5000, 0), "is empty"),
    "sparse and lz4": (
        both(sparse_x(0, 3000), set_value("flags", ROW_X, fmt.ENCODED)),
        "both lz4 and sparse",
    ),
    "slash in a name": (rename({ROW_B: b"b/txt"}), "containing '/' or NUL"),
    "NUL in a name": (rename({ROW_B: b"b\x00txt"}), "containing '/' or NUL"),
    "a name '.'": (rename({1: b"."}), "named '.'"),
    "a name '..'": (rename({1: b".."}), "named '..'"),
    "an empty name": (rename({1: b""}), "empty name"),
    "a name of 256 bytes": (rename({ROW_LINK: b"l" * 256}), "over 255 bytes"),
    "a named root": (rename({0: b"r"}), "the root has a name"),
    "two names alike": (rename({ROW_Y: b"x"}), "entry 6 has the same name"),
    "two long names alike": (rename({ROW_X: LONG, ROW_Y: LONG}), "entry 6 has the same name"),
    "names out of order": (rename({ROW_X: b"z"}), "entry 6 is out of name order"),
    "long names out of order": (rename({ROW_X: LONG + b"b", ROW_Y: LONG + b"a"}), "out of name order"),
    "name offsets past the blob": (set_value("name_off", 8, 10_000), "do not span"),
    "name offsets going back": (set_value("name_off", 3, 1), "out of place"),
    "a child of a file": (set_value("parent", ROW_Z, ROW_B), "not a directory"),
    "a parent out of range": (set_value("parent", ROW_Z, 1000), "before its parent"),
    "its own parent": (set_value("parent", ROW_Z, ROW_Z), "before its parent"),
    "a cycle": (set_value("parent", ROW_X, ROW_Y), "predecessor"),
    "a root with a parent": (set_value("parent", 0, 1), "no root"),
    "a root that is a file": (set_value("mode", 0, stat.S_IFREG | 0o644), "no root"),
    "a device": (set_value("mode", ROW_B, stat.S_IFCHR | 0o666), "neither a file"),
    "a shard past the list": (set_value("shard", ROW_B, 7), "past the shard list"),
    "an offset past the shard": (past_shard("offset"), "outside its shard"),
    "stored bytes past the shard": (past_shard("stored"), "outside its shard"),
    "an offset and length that wrap": (wrapping, "outside its shard"),
    "bytes in the shard header": (set_value("offset", ROW_B, 8), "outside its shard"),
    "a size unlike the stored bytes": (set_value("size", ROW_B, 1), "different number of bytes"),
    "a huge lz4 size": (lz4_huge, "impossible lz4 size"),
    "an unknown flag": (set_value("flags", ROW_B, 0x80), "flags"),
    "an owner past the table": (set_value("owner", ROW_B, 1), "past the owners table"),
    "an owners table of odd length": (
        lambda a, m: a.__setitem__("owners", np.zeros(3, np.uint32)),
        "not at most 65,536 (uid, gid) pairs",
    ),
    "an owners table of more pairs than an owner can number": (
        lambda a, m: a.__setitem__("owners", np.zeros(2 * fmt.OWNERS_MAX + 2, np.uint32)),
        "not at most 65,536 (uid, gid) pairs",
    ),
    "a link past its blob": (set_value("stored", ROW_LINK, 1000), "symlink target"),
    "a link with NUL": (links_blob, "contains NUL"),
    "a shard named outside": (set_meta("shards", [["../../etc/passwd", 4096]]), "is not named"),
    "a shard of impossible size": (lambda a, m: m["shards"][0].__setitem__(1, 1 << 70), "impossible size"),
    "a malformed dataset id": (set_meta("dataset_id", "../x"), "malformed dataset id"),
    "no shard list": (set_meta("shards", {"a": 1}), "no shard list"),
    "a malformed creation time": (set_meta("created_ns", "yesterday"), "created_ns"),
    "a malformed transform": (set_meta("transform", ["resize"]), "transform"),
}


@pytest.fixture(scope="module")
def valid_in_place(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The bytes of a real in-place index of a tar of ``make_small_tree``."""
    work = tmp_path_factory.mktemp("bad-in-place-index")
    tar = work / "src.tar"
    with tarfile.open(tar, "w") as out:
        out.add(make_small_tree(work / "src"), arcname=".")
    pack(tar, work / "dst", PackOptions(progress=False, in_place=True))
    return (work / "dst" / fmt.INDEX_NAME).read_bytes()


def _archive(key: str, value: object) -> Callable[[Arrays, Meta], None]:
    return lambda arrays, meta: meta["archives"][0].__setitem__(key, value)


def _base(field: int, value: object) -> Callable[[Arrays, Meta], None]:
    return lambda arrays, meta: meta["windows"][0].__setitem__(field, value)


def _shard_past_its_archive(arrays: Arrays, meta: Meta) -> None:
    meta["windows"][0][1] = meta["archives"][0]["size"] - meta["shards"][0][1] + 1


IN_PLACE_CASES: dict[str, tuple[Callable[[Arrays, Meta], None], str]] = {
    "a relative archive path": (_archive("path", "src.tar"), "names a path not allowed"),
    "an archive path through '..'": (_archive("path", "/tmp/../etc/passwd"), "names a path not allowed"),
    "an archive path with '.'": (_archive("path", "/tmp/./src.tar"), "names a path not allowed"),
    "an archive path with a doubled slash": (_archive("path", "/tmp//src.tar"), "names a path not allowed"),
    "an archive path starting with two slashes": (
        _archive("path", "//tmp/src.tar"),
        "names a path not allowed",
    ),
    "an archive path ending with a slash": (_archive("path", "/tmp/src.tar/"), "names a path not allowed"),
    "an archive path with NUL": (_archive("path", "/tmp/a\x00b.tar"), "names a path not allowed"),
    "an archive path of 4096 bytes": (_archive("path", "/" + "p" * 4095), "names a path not allowed"),
    "an archive path that is not text": (_archive("path", 7), "names a path not allowed"),
    "an archive of negative size": (_archive("size", -1), "malformed"),
    "an archive without an mtime": (lambda a, m: m["archives"][0].pop("mtime_ns"), "malformed"),
    "an archive with a field unknown": (_archive("etag", "x"), "malformed"),
    "an archive named twice": (
        lambda a, m: m["archives"].append(dict(m["archives"][0])),
        "names an archive twice",
    ),
    "a shard of no archive": (_base(0, 1), "names no archive"),
    "a shard before its archive": (_base(1, -1), "outside its archive"),
    "a shard past its archive's end": (_shard_past_its_archive, "outside its archive"),
    "a malformed shard base": (_base(1, "0"), "the base of shard 0 is malformed"),
    "shard bases fewer than shards": (lambda a, m: m["windows"].clear(), "do not match its shard list"),
    "no archive table": (lambda a, m: m.pop("archives"), "do not match its shard list"),
    "an in-place shard named as a shard file": (
        lambda a, m: m["shards"][0].__setitem__(0, fmt.shard_name(m["dataset_id"], 0)),
        "is not named",
    ),
}


@pytest.fixture(scope="module")
def valid_s3_in_place(valid_in_place: bytes) -> bytes:
    """``valid_in_place`` as if its tar were an object in S3: the index names it by URL and ETag."""
    arrays, meta = decode(valid_in_place)
    size = meta["archives"][0]["size"]
    meta["archives"] = [{"url": "s3://dlfs-tests/shards/src.tar", "size": size, "etag": '"9b2cf535f27731c9"'}]
    return fmt.encode_index(arrays, meta)


def _s3_url(url: object) -> Callable[[Arrays, Meta], None]:
    return _archive("url", url)


S3_IN_PLACE_CASES: dict[str, tuple[Callable[[Arrays, Meta], None], str]] = {
    "an S3 URL of another scheme": (_s3_url("https://dlfs-tests/shards/src.tar"), "not allowed"),
    "an S3 URL without a bucket": (_s3_url("s3:///shards/src.tar"), "not allowed"),
    "an S3 URL without a key": (_s3_url("s3://dlfs-tests"), "not allowed"),
    "an S3 URL ending with a slash": (_s3_url("s3://dlfs-tests/shards/"), "not allowed"),
    "an S3 bucket S3 does not allow": (_s3_url("s3://Dlfs_Tests/src.tar"), "not allowed"),
    "an S3 key through '..'": (_s3_url("s3://dlfs-tests/shards/../src.tar"), "not allowed"),
    "an S3 key with '.'": (_s3_url("s3://dlfs-tests/./src.tar"), "not allowed"),
    "an S3 key with a doubled slash": (_s3_url("s3://dlfs-tests/shards//src.tar"), "not allowed"),
    "an S3 key with NUL": (_s3_url("s3://dlfs-tests/a\x00b.tar"), "not allowed"),
    "an S3 key of 1025 bytes": (_s3_url("s3://dlfs-tests/" + "k" * 1025), "not allowed"),
    "an S3 URL that is not text": (_s3_url(7), "not allowed"),
    "an S3 archive without an ETag": (lambda a, m: m["archives"][0].pop("etag"), "malformed"),
    "an empty ETag": (_archive("etag", ""), "malformed"),
    "an ETag that is not text": (_archive("etag", 7), "malformed"),
    "an ETag with a line break": (_archive("etag", '"ab\ncd"'), "malformed"),
    "an S3 archive with a path too": (_archive("path", "/tmp/src.tar"), "malformed"),
    "an S3 archive of negative size": (_archive("size", -1), "malformed"),
    "an S3 archive named twice": (
        lambda a, m: m["archives"].append(dict(m["archives"][0])),
        "names an archive twice",
    ),
    "archives in two buckets": (
        lambda a, m: m["archives"].append({**m["archives"][0], "url": "s3://other-bucket/src.tar"}),
        "not all local files or all in one S3 bucket",
    ),
    "a local archive beside an S3 one": (
        lambda a, m: m["archives"].append({"path": "/tmp/src.tar", "size": 1, "mtime_ns": 0}),
        "not all local files or all in one S3 bucket",
    ),
    "an S3 shard past its object's end": (_shard_past_its_archive, "outside its archive"),
}


@pytest.mark.parametrize(
    ("packed", "case"),
    [("valid", case) for case in COLUMN_CASES]
    + [("valid_in_place", case) for case in IN_PLACE_CASES]
    + [("valid_s3_in_place", case) for case in S3_IN_PLACE_CASES],
)
def test_crafted_columns_and_metadata_are_refused(
    packed: str, case: str, request: pytest.FixtureRequest
) -> None:
    """In-place indexes name files the daemon opens: only absolute, normalised paths, and shards
    inside them."""
    valid = request.getfixturevalue(packed)
    load(valid)
    change, message = {**COLUMN_CASES, **IN_PLACE_CASES, **S3_IN_PLACE_CASES}[case]
    arrays, meta = decode(valid)
    change(arrays, meta)
    with pytest.raises(DatasetError) as info:
        load(fmt.encode_index(arrays, meta))
    text = str(info.value)
    assert message in text and "re-run dlfs pack" in text and "\n" not in text, text


def _sections(change: Callable[[dict[str, list[int]]], None]) -> Callable[[bytes], bytes]:
    return lambda raw: edit_sections(raw, change)


def _header(field: int, value: int) -> Callable[[bytes], bytes]:
    def change(raw: bytes) -> bytes:
        out = bytearray(raw)
        struct.pack_into("<Q", out, 16 + 8 * field, value)
        return reseal(out)

    return change


LAYOUT_CASES: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "a names section of 2^60 bytes": (_sections(lambda s: s["names"].__setitem__(1, HUGE)), "runs past"),
    "a negative count": (_sections(lambda s: s["mode"].__setitem__(1, -1)), "impossible place"),
    "an unaligned section": (
        _sections(lambda s: s["mode"].__setitem__(0, s["mode"][0] + 4)),
        "impossible place",
    ),
    "a section in the header": (_sections(lambda s: s["mode"].__setitem__(0, 0)), "impossible place"),
    "a missing section": (_sections(lambda s: s.pop("flags")), "exactly the known sections"),
    "an unknown section": (
        _sections(lambda s: s.__setitem__("extra", [64, 0])),
        "exactly the known sections",
    ),
    "columns of unlike lengths": (
        _sections(lambda s: s["owner"].__setitem__(1, 3)),
        "elements for 8 entries",
    ),
    "metadata that is not JSON": (lambda raw: with_meta(raw, b"{nope"), "not JSON"),
    "metadata nested too deep": (lambda raw: with_meta(raw, b"[" * 100_000), "not JSON"),
    "metadata that is a list": (lambda raw: with_meta(raw, b"[]"), "not an object"),
    "metadata past the file": (_header(0, HUGE), "outside the file"),
    "metadata of 2^60 bytes": (_header(1, HUGE), "outside the file"),
}


@pytest.mark.parametrize("case", list(LAYOUT_CASES))
def test_crafted_layouts_are_refused_before_anything_is_allocated(valid: bytes, case: str) -> None:
    change, message = LAYOUT_CASES[case]
    with pytest.raises(DatasetError, match=message):
        load(change(valid))


def test_the_valid_index_loads_and_encodes_back_the_same(valid: bytes) -> None:
    index = load(valid)
    assert index.count == 8 and index.resolve(b"a/y") == ROW_Y and index.readlink(ROW_LINK) == b"a/x"
    arrays, meta = decode(valid)
    assert load(fmt.encode_index(arrays, meta)).count == 8


def test_a_hard_link_table_and_a_sparse_map_that_keep_the_rules_load(valid: bytes) -> None:
    """a/x and a/y as one file of two names, a/x also as 3,000 bytes at 100 of 10,000: the rows
    answer as one inode of link count 2, and the map gives where the bytes lie."""
    arrays, meta = decode(valid)
    both(same_bytes, set_table("hardlinks", ROW_X, ROW_X, ROW_Y, ROW_X))(arrays, meta)
    index = load(fmt.encode_index(arrays, meta))
    assert index.hard_links.inode_row(ROW_Y) == ROW_X and index.attrs(ROW_Y).nlink == 2
    arrays, meta = decode(valid)
    sparse_x(100, 3000)(arrays, meta)
    index = load(fmt.encode_index(arrays, meta))
    assert index.sparse.runs(ROW_X).tolist() == [[100, 3000]] and index.attrs(ROW_X).size == 10_000
