"""An in-place dataset's shards as windows of the archives it was indexed from: what every store of
them answers alike, local tars (``archives``) or objects in S3 (``s3.archives``)."""

from __future__ import annotations

from pathlib import Path

from dlfs.core.errors import StoreError
from dlfs.core.store.interface import ShardWriter


class Windows:
    """Sizes and names from the index's windows, and a refusal of every write; mixed in before the
    store that reads the archives."""

    #: (archive number, base, size) of each window, by shard name.
    _windows: dict[str, tuple[int, int, int]]

    def size(self, name: str) -> int | None:
        window = self._windows.get(name)
        return None if window is None else window[2]

    def sizes(self) -> dict[str, int]:
        return {name: size for name, (_, _, size) in self._windows.items()}

    def names(self) -> list[str]:
        return sorted(self._windows)

    def map_index(self, name: str) -> memoryview:
        raise StoreError("an in-place dataset's archives hold no index")

    def put_file(self, name: str, path: Path) -> None:
        raise StoreError("an in-place dataset's archives are read-only")

    def create(self, name: str) -> ShardWriter:
        raise StoreError("an in-place dataset's archives are read-only")

    def delete(self, name: str) -> None:
        raise StoreError("an in-place dataset's archives are read-only")
