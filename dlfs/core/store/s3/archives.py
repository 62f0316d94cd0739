"""An in-place dataset's bytes in S3: shards lying in the tar objects it was indexed from
(``dlfs pack --in-place s3://…``).

Each shard of such a dataset lies in an object, ``base`` bytes into it (``dlfs.core.format``),
so a read of shard ``k`` at ``offset`` is a ranged GET of its object at ``base + offset``. Everything
else is ``S3Store``'s: the GETs hinted ahead (``will_read``), read into the caller's buffer
(``read_into``), retried, counted; the disk tier goes in front as for any dataset in S3.

An object is identified by its ETag, which changes whenever it is written again. Each is checked
once at mount (a HEAD: the recorded size and ETag, else the mount is refused), and every GET asks
for that version only (``If-Match``), so an object rewritten after the mount reads as an error,
never as other bytes (its checksum would catch those too). Nothing here is trusted beyond what the
mounting user could read: the daemon reads with that user's own credentials.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from dlfs.core.errors import ShardError
from dlfs.core.store.archive_shards import ArchiveShards
from dlfs.core.store.archives import AGAIN
from dlfs.core.store.interface import StoreOptions
from dlfs.core.store.s3.location import Location
from dlfs.core.store.s3.store import S3Store

if TYPE_CHECKING:
    from obstore import Bytes

#: HEADs in flight at once when a mount checks its objects (a folder of shards may hold thousands).
CHECKERS = 16


class S3ArchiveStore(ArchiveShards, S3Store):
    """The shards of an in-place dataset's tar objects, all in one bucket (``archive_meta`` checks it),
    read like a prefix's shards. Read-only."""

    def __init__(
        self,
        archives: list[dict[str, Any]],
        places: list[tuple[str, int, int, int]],
        options: StoreOptions | None = None,
    ) -> None:
        """``places``: (shard name, archive number, base, size) of each shard. Every object is
        checked here to be the one indexed."""
        locations = [Location.parse(archive["url"]) for archive in archives]
        super().__init__(f"s3://{locations[0].bucket}", options)
        #: (key, ETag) of each archive.
        self._objects = [
            (location.prefix, archive["etag"]) for location, archive in zip(locations, archives, strict=True)
        ]
        self._places = {name: (number, base, size) for name, number, base, size in places}
        try:
            with ThreadPoolExecutor(CHECKERS, thread_name_prefix="dlfs-s3-check") as pool:
                list(pool.map(self._check, archives))
        except BaseException:
            self.close()
            raise

    def _check(self, archive: dict[str, Any]) -> None:
        """``ShardError`` in one line unless the object is there with the recorded size and ETag."""
        url = archive["url"]
        found = self.head(Location.parse(url).prefix)
        if found is None:
            raise ShardError(f"archive {url} is missing; restore it or {AGAIN}")
        if (found.size, found.etag) != (archive["size"], archive["etag"]):
            raise ShardError(
                f"archive {url} has changed since it was indexed ({found.size} bytes, ETag {found.etag}; "
                f"indexed: {archive['size']} bytes, ETag {archive['etag']}); {AGAIN}"
            )

    def _get(self, name: str, offset: int, length: int) -> Bytes:
        """The GET of a shard's bytes: of its object, at its base, of the version indexed."""
        number, base, _ = self._places[name]
        key, etag = self._objects[number]
        return self.get_object(key, base + offset, length, etag)

    def abort_uploads(self) -> None:
        """Nothing is uploaded to an in-place dataset's archives."""

    def unfinished_uploads(self) -> list[str]:
        return []
