"""An in-place dataset's shards, which lie in the archives it was indexed from: what every store of
them answers alike, local tars (``archives``) or objects in S3 (``s3.archives``)."""

from __future__ import annotations

from pathlib import Path

from dlfs.core.errors import StoreError
from dlfs.core.store.interface import ShardWriter


class ArchiveShards:
    """Sizes and names from the index's shard list and bases, and a refusal of every write; mixed
    in before the store that reads the archives."""

    #: (archive number, base, size) of each shard, by shard name.
    _places: dict[str, tuple[int, int, int]]

    def size(self, name: str) -> int | None:
        place = self._places.get(name)
        return None if place is None else place[2]

    def sizes(self) -> dict[str, int]:
        return {name: size for name, (_, _, size) in self._places.items()}

    def names(self) -> list[str]:
        return sorted(self._places)

    def map_index(self, name: str) -> memoryview:
        raise StoreError("an in-place dataset's archives hold no index")

    def put_file(self, name: str, path: Path) -> None:
        raise StoreError("an in-place dataset's archives are read-only")

    def create(self, name: str) -> ShardWriter:
        raise StoreError("an in-place dataset's archives are read-only")

    def delete(self, name: str) -> None:
        raise StoreError("an in-place dataset's archives are read-only")
