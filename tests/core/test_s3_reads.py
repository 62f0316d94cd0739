"""Reads from a bucket: ranged reads into the caller's buffer, the disk tier fetching only the blocks
it lacks, hinted GETs used by the reads inside them, and listings of a prefix at any depth."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from s3env import split

from dlfs.core.store.disk_tier import BLOCK, DiskTier
from dlfs.core.store.s3.store import S3Store

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def one_shard(tmp_path: Path, s3: str) -> Iterator[tuple[S3Store, bytes]]:
    """A store holding one object ``data.shard`` of 3 blocks and a bit, and its bytes."""
    data = os.urandom(3 * BLOCK + 1000)
    (tmp_path / "data.shard").write_bytes(data)
    store = S3Store(f"{s3}/tier")
    try:
        store.put_file("data.shard", tmp_path / "data.shard")
        yield store, data
    finally:
        store.close()


def test_a_hinted_get_is_used_by_a_read_inside_it(tmp_path: Path, one_shard: tuple[S3Store, bytes]) -> None:
    """The read-ahead stages spans into the disk tier as ``FileBytes.stage`` does: every span hinted,
    then each filled. Two spans sharing a block hint overlapping runs; once the first has kept that
    block, the second fetches its run less that block, from its hint: no GET more, no hint left."""
    store, data = one_shard
    tier = DiskTier(store, tmp_path / "cache")
    try:
        requests = store.requests
        spans = [("data.shard", 10, BLOCK), ("data.shard", BLOCK + 20, BLOCK)]  # blocks 0-1, then 1-2
        for span in spans:
            tier.will_read(*span)
        for span in spans:
            tier.fill(*span)
        assert store.requests == requests + 2
        assert not store.hints.hinted() and store.hints.held == 0, "a hint nobody will read"
        assert tier.read("data.shard", 0, 3 * BLOCK) == data[: 3 * BLOCK]
        assert store.requests == requests + 2
    finally:
        tier.close()


def test_ranged_reads_and_the_disk_tier_give_the_stored_bytes_and_fetch_only_what_is_missing(
    tmp_path: Path, one_shard: tuple[S3Store, bytes]
) -> None:
    """``read_into`` copies a GET's buffer into the caller's; ``fill`` fetches the blocks the tier
    lacks, one GET per run of them, and nothing it holds; both give the object's bytes."""
    store, data = one_shard
    buffer = bytearray(100)
    assert store.read_into("data.shard", 7, memoryview(buffer)) == 100 and buffer == data[7:107]
    assert store.read_into("data.shard", len(data) - 10, memoryview(buffer)) == 10  # the object's end
    assert buffer[:10] == data[-10:]
    assert store.read("data.shard", BLOCK - 3, 6) == data[BLOCK - 3 : BLOCK + 3]
    tier = DiskTier(store, tmp_path / "cache")
    try:
        requests = store.requests
        tier.fill("data.shard", BLOCK + 10, 20)
        assert store.requests == requests + 1
        assert tier.local("data.shard", BLOCK, BLOCK) and not tier.local("data.shard", 0, 1)
        tier.fill("data.shard", 0, len(data))  # blocks 0, and 2 to 3: two runs
        assert store.requests == requests + 3 and tier.local("data.shard", 0, len(data))
        tier.fill("data.shard", 0, len(data))
        assert store.requests == requests + 3
        whole = bytearray(len(data))
        assert tier.read_into("data.shard", 0, memoryview(whole)) == len(data) and whole == data
        assert tier.read("data.shard", 5, 2 * BLOCK) == data[5 : 5 + 2 * BLOCK]
        descriptor = tier.local_descriptor("data.shard")
        assert descriptor is not None and os.pread(descriptor, len(data), 0) == data  # as the C loop reads
        assert store.requests == requests + 3
    finally:
        tier.close()


def test_a_listing_gives_every_object_at_any_depth_with_its_size_and_entity_tag(s3_server, s3: str) -> None:
    bucket, prefix = split(s3)
    client = s3_server.client()
    for key, body in (("a.jpg", b"x" * 3), ("class/b.jpg", b"yy"), ("class/deep/c.jpg", b"")):
        client.put_object(Bucket=bucket, Key=f"{prefix}/{key}", Body=body)
    client.put_object(Bucket=bucket, Key=f"{prefix}-beside/d.jpg", Body=b"not below the prefix")
    found = list(S3Store(s3).objects())
    assert [(o.key, o.size) for o in found] == [("a.jpg", 3), ("class/b.jpg", 2), ("class/deep/c.jpg", 0)]
    head = client.head_object(Bucket=bucket, Key=f"{prefix}/class/b.jpg")
    assert found[1].etag == head["ETag"]
    assert found[1].mtime_ns // 1_000_000_000 == int(head["LastModified"].timestamp())
