"""The store layer: the interface (``interface``), its backends (``local``, ``s3``) and the disk tier
in front of a remote one (``cached``), chosen by location.

Only the interface is imported here: the backends load numpy, lz4 and the S3 client, which the
command line must not pay for before a command runs (``tests/core/test_layers.py``). Import a
backend from its module.
"""

from __future__ import annotations

import os
from pathlib import Path

from dlfs.core.store.interface import (
    Descriptors,
    Forgets,
    InPlaceWriter,
    PartlyLocal,
    ShardWriter,
    Store,
    StoreOptions,
    WritesInPlace,
)
from dlfs.core.store.s3.location import is_s3

__all__ = [
    "Descriptors",
    "Forgets",
    "InPlaceWriter",
    "PartlyLocal",
    "ShardWriter",
    "Store",
    "StoreOptions",
    "WritesInPlace",
    "index_copies",
    "is_s3",
    "open_store",
]


def open_store(
    location: str | os.PathLike[str], random_access: bool = False, options: StoreOptions | None = None
) -> Store:
    """The backend for a dataset location: ``s3://bucket/prefix`` (with the disk tier when
    ``options.disk_tier`` is set) or a local directory.

    ``random_access``: reads will not follow storage order (a mount), so reading ahead of each
    read in storage order only wastes bandwidth.
    """
    from dlfs.core.store.disk_tier import DiskTier
    from dlfs.core.store.local import LocalStore

    options = options or StoreOptions()
    if is_s3(location):
        from dlfs.core.store.s3.store import S3Store

        store: Store = S3Store(str(location), options)
        if options.disk_tier:
            return DiskTier(store, options.disk_tier, options.disk_tier_size or None)
        return store
    # A local directory's shards need no disk tier (``shard_store.shard_store`` refuses --disk-tier for
    # them), but its in-place index may name tars in object storage, which do.
    return LocalStore(location, random_access)


def index_copies(options: StoreOptions) -> Path:
    """Where local copies of remote indexes live: beside the disk tier, else in the user's cache."""
    if options.disk_tier:
        return Path(options.disk_tier) / "indexes"
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dlfs" / "indexes"
