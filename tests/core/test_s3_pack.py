"""Packing into a bucket of a real S3 server (SeaweedFS): a dataset that lists, verifies and
describes as a local one does, a prefix pack refuses, a failed pack that leaves no object and no
open upload, and the index's local copy."""

from __future__ import annotations

from pathlib import Path

import pytest
from commands import assert_one_line_error, dlfs
from s3env import objects, open_uploads, split
from trees import SMALL_SHARD

from dlfs.core import format as fmt
from dlfs.core.errors import DatasetError, PackError
from dlfs.core.index import Index
from dlfs.core.shard_store import shard_store
from dlfs.core.store import StoreOptions, index_copies, open_store
from dlfs.core.store.s3.store import S3Store
from dlfs.pack import PackOptions, pack
from dlfs.pack.writers import InOrderShards

pytestmark = pytest.mark.timeout(120)


def test_a_tree_packed_into_a_bucket_lists_verifies_and_describes_as_a_local_pack(
    odd_tree: Path, tmp_path: Path, s3: str
) -> None:
    url = f"{s3}/imagenet/train"
    local = tmp_path / "local"
    for dst in (str(local), url):
        dlfs("pack", odd_tree, dst, "--shard-size", str(SMALL_SHARD))
    assert dlfs("ls", "-lR", url).stdout == dlfs("ls", "-lR", local).stdout
    assert "OK: checked" in dlfs("verify", url).stdout
    info = dlfs("info", url).stdout
    assert "shards:" in info and "dataset_id:" in info
    index = Index.load(open_store(url), index_copies(StoreOptions()))
    assert index.count == Index.load(open_store(local)).count
    assert len(index.shard_names) > 3  # several shards, each a multipart upload of its own


def test_pack_refuses_a_dataset_without_force_and_replaces_it_with(
    odd_tree: Path, s3_server, s3: str
) -> None:
    url = f"{s3}/ds"
    dlfs("pack", odd_tree, url, "--shard-size", str(SMALL_SHARD))
    first = set(objects(s3_server, url))
    assert_one_line_error(dlfs("pack", odd_tree, url, check=False), "already holds a dlfs dataset", "--force")
    dlfs("pack", odd_tree, url, "--shard-size", str(SMALL_SHARD), "--force")
    second = set(objects(s3_server, url))
    assert first & second == {fmt.INDEX_NAME}  # the old shards are gone, the index replaced
    assert "OK" in dlfs("verify", url).stdout


def test_pack_refuses_a_prefix_holding_other_objects(odd_tree: Path, s3_server, s3: str) -> None:
    bucket, prefix = split(s3)
    s3_server.client().put_object(Bucket=bucket, Key=f"{prefix}/mine/notes.txt", Body=b"keep me")
    result = dlfs("pack", odd_tree, f"{s3}/mine", check=False)
    assert_one_line_error(result, "not empty and is not a dlfs dataset", "notes.txt")
    assert objects(s3_server, f"{s3}/mine") == ["notes.txt"]


@pytest.mark.parametrize("after", [2, 200])
def test_a_failed_pack_leaves_no_object_and_no_open_upload(
    odd_tree: Path, s3_server, s3: str, monkeypatch: pytest.MonkeyPatch, after: int
) -> None:
    """The source fails mid-pack (a shard being uploaded, others complete): every shard and every
    multipart upload goes, and nothing mountable was ever published."""
    put = InOrderShards.put
    calls = iter(range(10**6))

    def failing_put(self, *args, **kwargs):
        if next(calls) == after:
            raise OSError(5, "Input/output error")
        return put(self, *args, **kwargs)

    monkeypatch.setattr(InOrderShards, "put", failing_put)
    url = f"{s3}/failed"
    with pytest.raises(PackError, match="Input/output error"):
        pack(odd_tree, url, PackOptions(shard_size=SMALL_SHARD, progress=False))
    assert objects(s3_server, url) == []
    assert open_uploads(s3_server, url) == []


def test_a_pack_aborts_the_uploads_a_killed_pack_left(odd_tree: Path, s3_server, s3: str) -> None:
    url = f"{s3}/killed"
    bucket, prefix = split(url)
    client = s3_server.client()
    started = client.create_multipart_upload(Bucket=bucket, Key=f"{prefix}/0123abcd.00000.shard")
    client.upload_part(
        Bucket=bucket,
        Key=f"{prefix}/0123abcd.00000.shard",
        UploadId=started["UploadId"],
        PartNumber=1,
        Body=b"x",
    )
    assert open_uploads(s3_server, url)
    dlfs("pack", odd_tree, url, "--shard-size", str(SMALL_SHARD))
    assert open_uploads(s3_server, url) == []


def test_the_index_is_copied_once_per_dataset_id_and_refetched_when_damaged(
    odd_tree: Path, tmp_path: Path, s3: str
) -> None:
    url = f"{s3}/copied"
    pack(odd_tree, url, PackOptions(shard_size=SMALL_SHARD, progress=False))
    copies = tmp_path / "copies"
    first = S3Store(url)
    index = Index.load(first, copies)
    copy = copies / f"{index.dataset_id}.index.dlfs"
    assert copy.read_bytes() == bytes(first.map_index(fmt.INDEX_NAME))
    again = S3Store(url)
    Index.load(again, copies)
    assert again.requests == 2 and again.received < 4096  # the header and the meta, not the index
    data = bytearray(copy.read_bytes())
    data[len(data) // 2] ^= 0xFF
    copy.write_bytes(bytes(data))
    damaged = S3Store(url)
    assert Index.load(damaged, copies).count == index.count
    assert damaged.received > len(data)  # fetched whole again


def test_a_local_dataset_takes_no_cache_dir(packed: Path, tmp_path: Path) -> None:
    """Refused once the index says where the bytes are: an in-place index in a directory may
    name tars in S3, which the disk tier does keep."""
    options = StoreOptions(disk_tier=str(tmp_path / "cache"))
    store = open_store(packed, options=options)
    try:
        with pytest.raises(DatasetError, match="object storage"):
            shard_store(Index.load(store), store, options=options)
    finally:
        store.close()
