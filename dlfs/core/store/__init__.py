"""The store layer: the interface (``interface``) and its backends (``local``), chosen by location."""

from __future__ import annotations

import os

from dlfs.core.store.interface import Descriptors, ShardWriter, Store
from dlfs.core.store.local import LocalStore

__all__ = ["Descriptors", "LocalStore", "ShardWriter", "Store", "open_store"]


def open_store(location: str | os.PathLike[str], random_access: bool = False) -> Store:
    """The backend for a dataset location: a local directory (the one backend there is).

    ``random_access``: reads will not follow storage order (a mount), so reading ahead of each
    read in storage order only wastes bandwidth.
    """
    return LocalStore(location, random_access)
