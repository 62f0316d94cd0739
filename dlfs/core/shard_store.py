"""The store a dataset's file bytes are read from, checked to hold this dataset's before a mount or
a verify reads a byte: a dataset half present is almost always a copy that went wrong, and its
user should hear so at once, not file by file later."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dlfs.core import format as fmt
from dlfs.core.errors import DatasetError, ShardError
from dlfs.core.index import Index
from dlfs.core.store import Store, StoreOptions
from dlfs.core.store.disk_tier import DiskTier
from dlfs.core.store.local import LocalStore

#: Shard headers checked at once (each a round trip on an object store).
HEADER_READERS = 16


def shard_store(
    index: Index, store: Store, random_access: bool = False, options: StoreOptions | None = None
) -> Store:
    """The store ``index``'s files are read from: ``store``, with its shards checked
    (``check_shards``); or, for an in-place dataset, a store of its archives, each checked to be
    the file or object indexed (``store.archives``, ``store.s3.archives``; objects in S3 behind
    the disk tier of ``options.disk_tier``), which the caller closes as well as ``store``, unless
    it is ``store`` itself: a disk tier that the index was read through stands in front of the
    objects instead."""
    options = options or StoreOptions()
    if options.disk_tier and isinstance(store, LocalStore) and not index.archives_in_s3:
        raise DatasetError(
            f"--disk-tier keeps blocks of datasets in object storage; {store.url} is a local "
            "directory, which the page cache already keeps"
        )
    if not index.archives:
        check_shards(index, store)
        return store
    places = [
        (name, int(number), int(base), size)
        for name, number, base, size in zip(
            index.shard_names, index.shard_archive, index.shard_base, index.shard_sizes, strict=True
        )
    ]
    if index.archives_in_s3:
        from dlfs.core.store.s3.archives import S3ArchiveStore

        objects: Store = S3ArchiveStore(index.archives, places, options)
        if isinstance(store, DiskTier):  # the index came through the tier: it serves the objects now
            store.front(objects)
            return store
        if options.disk_tier:
            return DiskTier(objects, options.disk_tier, options.disk_tier_size or None)
        return objects
    from dlfs.core.store.archives import ArchiveStore

    root = getattr(store, "root", None)
    if root is None:
        raise ShardError(
            f"{store.url} holds an in-place index of local tars, which only a local directory may hold"
        )
    owner = os.stat(Path(root) / fmt.INDEX_NAME).st_uid
    return ArchiveStore(index.archives, places, owner, random_access)


def check_shards(index: Index, store: Store) -> None:
    """Refuse a dataset whose shards are missing, truncated or from another pack run."""
    sizes = store.sizes()  # one listing: an object store answers each lookup in a round trip
    for name, expected in zip(index.shard_names, index.shard_sizes, strict=True):
        actual = sizes.get(name)
        if actual is None:
            raise ShardError(f"shard {name} is missing from {store.url}; restore it or re-run dlfs pack")
        if actual != expected:
            raise ShardError(
                f"shard {name} in {store.url} has {actual} bytes, the index expects {expected}; "
                "restore it or re-run dlfs pack"
            )

    def check_header(number: int) -> None:
        name = index.shard_names[number]
        fmt.check_shard_header(store.read(name, 0, fmt.HEADER_SIZE), index.dataset_id, number, name)

    with ThreadPoolExecutor(HEADER_READERS) as pool:  # each read a round trip on an object store
        list(pool.map(check_header, range(len(index.shard_names))))
