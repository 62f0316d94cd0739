"""``S3Store``: an S3 prefix as a flat namespace of immutable objects, read by ranged GETs and
written by uploads, assembled from this package's parts."""

from __future__ import annotations

import contextlib
import datetime
import logging
import threading
from collections.abc import Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlfs.core.errors import DatasetError, StoreError
from dlfs.core.store.interface import ShardWriter, StoreOptions
from dlfs.core.store.s3.hints import HintCache
from dlfs.core.store.s3.location import Location
from dlfs.core.store.s3.obstore_errors import explain, setup_error
from dlfs.core.store.s3.settings import Credentials, aws_settings, read_ca_bundle
from dlfs.core.store.s3.uploads import PART_CONCURRENCY, PART_SIZE, S3ShardWriter, file_parts

if TYPE_CHECKING:
    from obstore import Bytes  # the s3 extra: imported where a call needs it

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = datetime.timedelta(seconds=5)
#: Tries of a request that fails in a way a retry may fix (obstore's and the listing's).
MAX_RETRIES = 16
#: Keys a listing request returns at most (S3's own limit).
LISTING_PAGE = 1000


class ObjectChanged(StoreError):
    """An object was written again since its entity tag was taken (listed, or indexed)."""

    def __init__(self, message: str, url: str) -> None:
        super().__init__(message)
        #: The object's URL.
        self.url = url


@dataclass(frozen=True)
class StoredObject:
    """An object as a listing describes it."""

    #: Its key below the store's prefix (``a/b.jpg`` for ``s3://bucket/prefix/a/b.jpg``).
    key: str
    size: int
    #: The object's entity tag: it changes whenever the object is written again, which its size and
    #: time need not.
    etag: str
    mtime_ns: int


class S3Store:
    """An S3 prefix as a flat namespace of immutable objects, read by ranged GETs."""

    #: ``will_read``'s GETs land in this process's memory.
    hints_in_memory = True

    def __init__(self, url: str, options: StoreOptions | None = None) -> None:
        try:
            import boto3  # noqa: F401 - only to say what is missing before anything else
            import obstore.exceptions
            import obstore.store
        except ImportError as exc:
            raise StoreError(
                f"s3:// locations need {exc.name}: install dlfs with its s3 extra "
                "(pip install 'dlfs-data[s3]')"
            ) from None
        options = options or StoreOptions()
        self.location = Location.parse(url)
        self.url = str(self.location)
        self._lock = threading.Lock()
        #: Shard uploads under way, which ``abort_uploads`` aborts first.
        self._writers: set[S3ShardWriter] = set()
        self.hints = HintCache(self._get)
        settings = aws_settings(options, self.url)
        self.endpoint, self._session = settings.endpoint, settings.session
        self._region, self._timeout = settings.region, options.timeout
        config: dict[str, Any] = {"region": settings.region}
        if not settings.is_aws():
            config["endpoint"] = self.endpoint
        timeout = datetime.timedelta(seconds=options.timeout)
        client_options: dict[str, Any] = {
            "allow_http": self.endpoint.startswith("http://"),
            "connect_timeout": CONNECT_TIMEOUT,
            "timeout": timeout,  # a stalled connection never holds a read longer than this
        }
        if settings.ca_bundle:
            client_options["root_certificate"] = read_ca_bundle(settings.ca_bundle)
        try:
            self._store = obstore.store.S3Store(
                self.location.bucket,
                prefix=self.location.prefix or None,
                config=config,
                client_options=client_options,
                retry_config={
                    "max_retries": MAX_RETRIES,
                    "retry_timeout": timeout,
                    "backoff": {
                        "init_backoff": datetime.timedelta(milliseconds=100),
                        "max_backoff": datetime.timedelta(seconds=4),
                        "base": 2,
                    },
                },
                credential_provider=Credentials(settings.credentials),
            )
        except obstore.exceptions.BaseError as exc:  # the client refused its settings
            raise StoreError(setup_error(exc, self.url, settings.ca_bundle)) from None

    @property
    def requests(self) -> int:
        """GETs so far."""
        return self.hints.requests

    @property
    def received(self) -> int:
        """Bytes the GETs brought."""
        return self.hints.received

    def stats(self) -> dict[str, dict[str, int]]:
        return {"store": {"requests": self.requests, "bytes": self.received}}

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """obstore's errors (many lines, the whole HTTP exchange) as one line for the user."""
        import obstore.exceptions

        try:
            yield
        except (obstore.exceptions.BaseError, OSError) as exc:
            raise StoreError(explain(what, exc, self.endpoint, self.location.bucket)) from None

    def read(self, name: str, offset: int, length: int) -> bytes:
        return bytes(self.read_buffer(name, offset, length)) if length > 0 else b""

    def read_buffer(self, name: str, offset: int, length: int) -> memoryview:
        """The range in obstore's buffer, as the client received it (``hints.HintCache.read``)."""
        return self.hints.read(name, offset, length)

    def _get(self, name: str, offset: int, length: int) -> Bytes:
        """One ranged GET, returned in obstore's own buffer: ``read_into`` copies it once, where a
        ``bytes`` of it first would copy it twice (the daemon's CPU per GiB from the store is
        mostly copies; docs/design.md)."""
        return self.get_object(name, offset, length)

    def get_object(self, key: str, offset: int, length: int, etag: str | None = None) -> Bytes:
        """One ranged GET of ``key``; with ``etag``, only of that version of the object: one
        written since fails (``If-Match``, ``ObjectChanged``), never reads as other bytes."""
        import obstore
        import obstore.exceptions

        what = f"reading {self.url}/{key} at {offset}"
        with self._errors(what):
            if etag is None:
                return obstore.get_range(self._store, key, start=offset, length=length)
            options: dict[str, Any] = {"range": (offset, offset + length), "if_match": etag}
            try:
                return obstore.get(self._store, key, options=options).bytes()  # type: ignore[arg-type]
            except obstore.exceptions.PreconditionError as exc:
                message = explain(what, exc, self.endpoint, self.location.bucket)
                raise ObjectChanged(message, f"{self.url}/{key}") from None

    def read_into(self, name: str, offset: int, buffer: memoryview, wait: bool = True) -> int | None:
        if not wait:
            return None  # nothing of an object store is in memory
        if not buffer:
            return 0
        data = self.read_buffer(name, offset, len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def will_read(self, name: str, offset: int, length: int) -> None:
        self.hints.hint(name, offset, length)

    def size(self, name: str) -> int | None:
        found = self.head(name)
        return None if found is None else found.size

    def head(self, name: str) -> StoredObject | None:
        """The object ``name`` as a HEAD describes it, or None where there is none."""
        import obstore

        with self._errors(f"looking up {self.url}/{name}"):
            try:
                return _stored(obstore.head(self._store, name))
            except FileNotFoundError:
                # A HEAD's 404 has no body to tell a missing object from a missing bucket.
                self.sizes()  # raises for a missing bucket
                return None

    def sizes(self) -> dict[str, int]:
        """Every object directly under the prefix, and each deeper "folder" as ``name/`` (size 0)."""
        import obstore

        with self._errors(f"listing {self.url}"):
            listing = obstore.list_with_delimiter(self._store)
        found = {meta["path"]: int(meta["size"]) for meta in listing["objects"]}
        found.update({folder.rstrip("/") + "/": 0 for folder in listing["common_prefixes"]})
        return found

    def names(self) -> list[str]:
        return sorted(self.sizes())

    def objects(self) -> Iterator[StoredObject]:
        """Every object below the prefix, at any depth, as the listing's pages arrive, in key order
        (S3 lists in UTF-8 binary order), the next page on its way meanwhile. Keys are as stored: a
        folder marker keeps its trailing ``/``. boto3 lists them: obstore parses each key as a path,
        which drops that ``/`` and fails the whole listing on a key with a control character."""
        import botocore.exceptions
        from botocore.config import Config

        config = Config(
            connect_timeout=CONNECT_TIMEOUT.total_seconds(),
            read_timeout=self._timeout,
            retries={"max_attempts": MAX_RETRIES, "mode": "standard"},
        )
        client = self._session.client(
            "s3", endpoint_url=self.endpoint, region_name=self._region, config=config
        )
        prefix = self.location.prefix + "/" if self.location.prefix else ""
        pages = client.get_paginator("list_objects_v2").paginate(
            Bucket=self.location.bucket, Prefix=prefix, PaginationConfig={"PageSize": LISTING_PAGE}
        )
        try:
            with ThreadPoolExecutor(1, thread_name_prefix="dlfs-list") as ahead:
                yield from self._listed(ahead, iter(pages), prefix)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise StoreError(
                explain(f"listing {self.url}", exc, self.endpoint, self.location.bucket)
            ) from None

    @staticmethod
    def _listed(ahead: Executor, pages: Iterator[dict[str, Any]], prefix: str) -> Iterator[StoredObject]:
        """The objects of ``pages``, the next page requested by ``ahead`` while these are used."""
        coming = ahead.submit(next, pages, None)
        while (page := coming.result()) is not None:
            coming = ahead.submit(next, pages, None)
            for meta in page.get("Contents", []):
                modified = meta["LastModified"]
                yield StoredObject(
                    key=meta["Key"][len(prefix) :],
                    size=int(meta["Size"]),
                    etag=meta.get("ETag", ""),
                    mtime_ns=int(modified.timestamp()) * 1_000_000_000 + modified.microsecond * 1000,
                )

    def map_index(self, name: str) -> memoryview:
        size = self.size(name)
        if size is None:
            raise DatasetError(f"{self.url} is not a dlfs dataset (no {name}); run dlfs pack first")
        return memoryview(self.read(name, 0, size))

    def put_file(self, name: str, path: Path) -> None:
        """One PUT, or past PART_SIZE a multipart upload; either way the object appears whole or
        not at all."""
        import obstore

        if path.stat().st_size > PART_SIZE:
            self.upload(name, file_parts(path))
            return
        with self._errors(f"writing {self.url}/{name}"):
            obstore.put(self._store, name, path.read_bytes(), use_multipart=False)

    def create(self, name: str) -> ShardWriter:
        writer = S3ShardWriter(name, self.upload, self._ended)
        with self._lock:
            self._writers.add(writer)
        writer.start()
        return writer

    def _ended(self, writer: S3ShardWriter) -> None:
        with self._lock:
            self._writers.discard(writer)

    def upload(self, name: str, parts: Iterator[bytes | memoryview]) -> None:
        """A multipart upload of everything ``parts`` yields; aborted when it raises."""
        import obstore

        with self._errors(f"uploading {self.url}/{name}"):
            obstore.put(
                self._store,
                name,
                parts,
                use_multipart=True,
                chunk_size=PART_SIZE,
                max_concurrency=PART_CONCURRENCY,
            )

    def abort_uploads(self) -> None:
        """Abort this store's shard uploads still under way, then the multipart uploads a killed
        pack left open under the prefix: their parts are stored (and billed) until aborted."""
        import botocore.exceptions

        with self._lock:
            writers = list(self._writers)
        for writer in writers:
            writer.abort()
        client = self._session.client("s3", endpoint_url=self.endpoint)
        try:
            for key, upload_id in self._open_uploads(client):
                log.info("aborting the upload of %s left by an interrupted pack", key)
                client.abort_multipart_upload(Bucket=self.location.bucket, Key=key, UploadId=upload_id)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            log.warning("cannot abort the uploads an interrupted pack left in %s: %s", self.url, exc)

    def unfinished_uploads(self) -> list[str]:
        import botocore.exceptions

        client = self._session.client("s3", endpoint_url=self.endpoint)
        start = len(self.location.prefix) + 1 if self.location.prefix else 0
        try:
            return sorted({key[start:] for key, _ in self._open_uploads(client)})
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise StoreError(f"cannot list the unfinished uploads in {self.url}: {exc}") from None

    def _open_uploads(self, client: Any) -> Iterator[tuple[str, str]]:
        """(key, upload id) of the multipart uploads open directly under the prefix. obstore
        cannot list them, so boto3's ``client`` does."""
        prefix = self.location.prefix + "/" if self.location.prefix else ""
        pages = client.get_paginator("list_multipart_uploads").paginate(
            Bucket=self.location.bucket, Prefix=prefix
        )
        for upload in (u for page in pages for u in page.get("Uploads", [])):
            if "/" not in upload["Key"][len(prefix) :]:  # deeper: not this dataset's
                yield upload["Key"], upload["UploadId"]

    def delete(self, name: str) -> None:
        import obstore

        with self._errors(f"deleting {self.url}/{name}"):
            obstore.delete(self._store, name)

    def close(self) -> None:
        self.hints.close()


def _stored(meta: Any) -> StoredObject:
    """obstore's description of an object (a listing's or a HEAD's)."""
    modified = meta["last_modified"]
    return StoredObject(
        key=meta["path"],
        size=int(meta["size"]),
        etag=meta["e_tag"] or "",
        mtime_ns=int(modified.timestamp()) * 1_000_000_000 + modified.microsecond * 1000,
    )
