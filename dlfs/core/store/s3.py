"""A dataset in an S3-compatible bucket (AWS, Ceph RGW, SeaweedFS, MinIO): ``s3://bucket/prefix``.

The client is obstore (Rust's ``object_store``): its blocking calls release the GIL, so the mount's
storage threads and the read-ahead's batches each keep a ranged GET in flight at once, and it
retries transient failures (5xx, resets, timeouts) with jittered exponential backoff. Endpoint,
region, credentials and a private CA's certificates (``AWS_CA_BUNDLE``, ``ca_bundle``) are found
the standard AWS way by boto3's session (environment, profiles, ``~/.aws/config`` and
``credentials``, SSO, instance roles); obstore asks it for credentials again
every ``CREDENTIALS_TTL``, and botocore renews temporary ones before they expire, so a job outlives
its first session token. Credentials never reach a log line or an error message.

Shards are uploaded as they are written: a multipart upload fed through a bounded pipe, so a
shard is never whole in memory; a failed or interrupted upload is aborted, and nothing is visible
under its name until it completes. ``put_file`` is one PUT, or a multipart upload past a part's
size: atomic either way on every S3 implementation.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import re
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlparse

from dlfs.core.errors import DatasetError, StoreError
from dlfs.core.store.interface import ShardWriter, StoreOptions

if TYPE_CHECKING:
    from obstore import Bytes  # the s3 extra: imported where a call needs it

log = logging.getLogger(__name__)

SCHEME = "s3://"
#: Multipart upload part size: S3 takes 5 MiB to 5 GiB; 16 MiB keeps a 1 GiB shard at 64 parts.
PART_SIZE = 16 << 20
#: Parts of one shard uploading at once; with the pipe, what a shard upload holds in memory.
PART_CONCURRENCY = 4
#: Bytes written to a shard that wait for its upload before ``write`` blocks the packer.
PIPE_BYTES = 2 * PART_SIZE
#: How long obstore keeps the credentials it was given before asking boto3 again (boto3 renews
#: temporary credentials some minutes before they expire).
CREDENTIALS_TTL = datetime.timedelta(seconds=60)
CONNECT_TIMEOUT = datetime.timedelta(seconds=5)
#: GETs that ``will_read`` keeps in flight at once, and the bytes hinted but not yet read.
AHEAD_THREADS = 64
AHEAD_BYTES = 256 << 20
#: Seconds after which a hint whose GET is done but that nobody read counts as abandoned (two
#: batches in flight at once may both hint a block that only one of them fetches): its bytes are
#: let go when a new hint needs the room. The read-ahead reads its hints within its batch.
HINT_TTL = 30.0
AWS_HOST = re.compile(r"(^|\.)amazonaws\.com(\.cn)?$")


def is_s3(location: object) -> bool:
    return isinstance(location, str) and location.startswith(SCHEME)


@dataclass(frozen=True)
class Location:
    bucket: str
    prefix: str

    @classmethod
    def parse(cls, url: str) -> Location:
        parsed = urlparse(url)
        bucket, prefix = parsed.netloc, parsed.path.strip("/")
        if parsed.scheme != "s3" or not bucket or parsed.query or parsed.fragment:
            raise DatasetError(f"{url} is not an S3 location; write s3://BUCKET or s3://BUCKET/PREFIX")
        return cls(bucket, prefix)

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}" if self.prefix else f"{SCHEME}{self.bucket}"


class _Credentials:
    """boto3's credentials, handed to obstore on request (an ``S3CredentialProvider``)."""

    def __init__(self, credentials: Any) -> None:
        self._credentials = credentials

    def __call__(self) -> dict[str, Any]:
        frozen = self._credentials.get_frozen_credentials()  # renewed by botocore when near expiry
        return {
            "access_key_id": frozen.access_key,
            "secret_access_key": frozen.secret_key,
            "token": frozen.token,
            "expires_at": datetime.datetime.now(datetime.UTC) + CREDENTIALS_TTL,
        }


_CODE = re.compile(r"<Code>([A-Za-z]+)</Code>")
#: rustls's reason for refusing the server's certificate, in obstore's error (UnknownIssuer, ...).
_UNTRUSTED = re.compile(r"InvalidCertificate\(\s*(\w+)")
_DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken"}


class S3Store:
    """An S3 prefix as a flat namespace of immutable objects, read by ranged GETs.

    ``requests`` and ``received`` count GETs and their bytes (the mount's store statistics).
    """

    def __init__(self, url: str, options: StoreOptions | None = None) -> None:
        try:
            import boto3  # noqa: F401 - only to say what is missing before anything else
            import obstore.exceptions
            import obstore.store
        except ImportError as exc:
            raise StoreError(
                f"s3:// locations need {exc.name}: install dlfs with its s3 extra (pip install 'dlfs[s3]')"
            ) from None
        options = options or StoreOptions()
        self.location = Location.parse(url)
        self.url = str(self.location)
        self.writes_in_place = False
        self.requests = 0
        self.received = 0
        self._lock = threading.Lock()
        #: Shard uploads under way, which ``abort_uploads`` aborts first.
        self._writers: set[_S3Writer] = set()
        #: GETs started by ``will_read``, by (name, offset, length), and the bytes they hold.
        self._ahead: dict[tuple[str, int, int], tuple[Future[Bytes], float]] = {}  # and when hinted
        self._ahead_bytes = 0
        self._pool = ThreadPoolExecutor(AHEAD_THREADS, thread_name_prefix="dlfs-s3-ahead")
        settings = _aws_settings(options, self.url)
        self.endpoint, self._session = settings.endpoint, settings.session
        config: dict[str, Any] = {"region": settings.region}
        if not AWS_HOST.search(urlparse(self.endpoint).hostname or ""):
            config["endpoint"] = self.endpoint  # AWS itself: obstore builds the regional endpoint
        timeout = datetime.timedelta(seconds=options.timeout)
        client_options: dict[str, Any] = {
            "allow_http": self.endpoint.startswith("http://"),
            "connect_timeout": CONNECT_TIMEOUT,
            "timeout": timeout,  # a stalled connection never holds a read longer than this
        }
        if settings.ca_bundle:
            # Trusted beside the system's roots, as botocore trusts it for boto3's own calls.
            client_options["root_certificate"] = _read_ca_bundle(settings.ca_bundle)
        try:
            self._store = obstore.store.S3Store(
                self.location.bucket,
                prefix=self.location.prefix or None,
                config=config,
                client_options=client_options,
                retry_config={
                    "max_retries": 16,
                    "retry_timeout": timeout,
                    "backoff": {
                        "init_backoff": datetime.timedelta(milliseconds=100),
                        "max_backoff": datetime.timedelta(seconds=4),
                        "base": 2,
                    },
                },
                credential_provider=_Credentials(settings.credentials),
            )
        except obstore.exceptions.BaseError as exc:  # the client refused its settings
            raise StoreError(_setup_error(exc, self.url, settings.ca_bundle)) from None

    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """obstore's errors (many lines, the whole HTTP exchange) as one line for the user."""
        import obstore.exceptions as obe

        try:
            yield
        except FileNotFoundError as exc:
            if "NoSuchBucket" in str(exc):
                raise StoreError(self._no_bucket()) from None
            raise StoreError(f"{what}: no such object") from None
        except (obe.BaseError, OSError) as exc:
            raise StoreError(self._explain(what, exc)) from None

    def _no_bucket(self) -> str:
        return f"bucket {self.location.bucket} does not exist at {self.endpoint}; create it or fix the URL"

    def _explain(self, what: str, exc: Exception) -> str:
        import obstore.exceptions as obe

        text = str(exc)
        match = _CODE.search(text)
        code = match.group(1) if match else None
        if code == "NoSuchBucket":
            return self._no_bucket()
        untrusted = _UNTRUSTED.search(text)
        if untrusted:
            return (
                f"{what}: the TLS certificate of {self.endpoint} is not trusted ({untrusted.group(1)}); "
                "name the certificate of the CA that signed it in AWS_CA_BUNDLE or ca_bundle in ~/.aws/config"
            )
        if code in _DENIED or isinstance(exc, obe.PermissionDeniedError | obe.UnauthenticatedError):
            return (
                f"{what}: access denied by {self.endpoint} ({code or 'HTTP 403'}); check the credentials "
                "(AWS_PROFILE, AWS_ACCESS_KEY_ID, ~/.aws/credentials) and the bucket's permissions"
            )
        if "error sending request" in text or "timed out" in text:
            return (
                f"{what}: no answer from {self.endpoint} (after retries); "
                "check --endpoint-url and the network"
            )
        first = text.splitlines()[0] if text else type(exc).__name__
        return f"{what}: {first[:300]}"

    def read(self, name: str, offset: int, length: int) -> bytes:
        return bytes(self.read_buffer(name, offset, length)) if length > 0 else b""

    def read_buffer(self, name: str, offset: int, length: int) -> memoryview:
        """The range in obstore's buffer, as the client received it: from a GET ``will_read``
        started for it, or for a range holding it, or a new GET.

        A hint is used up by the first read inside it: the disk tier hints each run of blocks it
        lacks, and when two runs shared a block that the first one's read then kept, the second
        read asks for its run less that block. Matched exactly only, that hint would never be read
        and would hold its bytes, and its share of ``AHEAD_BYTES``, for the life of the mount."""
        with self._lock:
            key = (name, offset, length)
            if key not in self._ahead:
                key = next(
                    (
                        (hinted, start, size)
                        for hinted, start, size in self._ahead
                        if hinted == name and start <= offset and offset + length <= start + size
                    ),
                    key,
                )
            ahead = self._ahead.pop(key, None)
        if ahead is None:
            return memoryview(self._get(name, offset, length))
        try:
            data = memoryview(ahead[0].result())
        finally:
            with self._lock:
                self._ahead_bytes -= key[2]
        return data if key[1:] == (offset, length) else data[offset - key[1] : offset - key[1] + length]

    def _get(self, name: str, offset: int, length: int) -> Bytes:
        """One ranged GET, returned in obstore's own buffer: ``read_into`` copies it once, where a
        ``bytes`` of it first would copy it twice (the daemon's CPU per GiB from the store is
        mostly copies; docs/design.md)."""
        import obstore

        with self._errors(f"reading {self.url}/{name} at {offset}"):
            data = obstore.get_range(self._store, name, start=offset, length=length)
        self.requests += 1
        self.received += len(data)
        return data

    def read_into(self, name: str, offset: int, buffer: memoryview, wait: bool = True) -> int | None:
        if not wait:
            return None  # nothing of an object store is in memory
        if not buffer:
            return 0
        data = self.read_buffer(name, offset, len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def will_read(self, name: str, offset: int, length: int) -> None:
        """Start the GET of this range now, for the ``read`` of this range, or of a part of it,
        that follows.

        The read-ahead hints every read of a batch before it reads them one by one, so a batch's
        GETs are all in flight at once: a batch of files scattered over the shards (a uniform
        order) waits one round trip, not one per file. Hinted bytes not yet read are capped at
        ``AHEAD_BYTES``; past it, hints abandoned for ``HINT_TTL`` are let go, and if the room is
        still short, this hint is dropped and its read fetches in its turn.
        """
        key = (name, offset, length)
        with self._lock:
            if key in self._ahead:
                return
            if self._ahead_bytes + length > AHEAD_BYTES:
                self._let_go_abandoned()
                if self._ahead_bytes + length > AHEAD_BYTES:
                    return
            self._ahead_bytes += length
            self._ahead[key] = (self._pool.submit(self._get, name, offset, length), time.monotonic())

    def _let_go_abandoned(self) -> None:
        """Forget the hints whose GETs are done and unread for ``HINT_TTL``; under ``_lock``."""
        before = time.monotonic() - HINT_TTL
        for key, (ahead, hinted) in list(self._ahead.items()):
            if hinted < before and ahead.done():
                del self._ahead[key]
                self._ahead_bytes -= key[2]

    def size(self, name: str) -> int | None:
        import obstore

        with self._errors(f"looking up {self.url}/{name}"):
            try:
                return int(obstore.head(self._store, name)["size"])
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
            self.upload(name, _file_parts(path))
            return
        with self._errors(f"writing {self.url}/{name}"):
            obstore.put(self._store, name, path.read_bytes(), use_multipart=False)

    def create(self, name: str) -> ShardWriter:
        writer = _S3Writer(self, name)
        with self._lock:
            self._writers.add(writer)
        writer.start()
        return writer

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
        pack left open under the prefix: their parts are stored (and billed) until aborted.
        obstore cannot list them, so boto3 does."""
        import botocore.exceptions

        with self._lock:
            writers, self._writers = self._writers, set()
        for writer in writers:
            writer.abort()
        prefix = self.location.prefix + "/" if self.location.prefix else ""
        client = self._session.client("s3", endpoint_url=self.endpoint)
        try:
            pages = client.get_paginator("list_multipart_uploads").paginate(
                Bucket=self.location.bucket, Prefix=prefix
            )
            for upload in (u for page in pages for u in page.get("Uploads", [])):
                if "/" in upload["Key"][len(prefix) :]:
                    continue  # deeper than this dataset
                log.info("aborting the upload of %s left by an interrupted pack", upload["Key"])
                client.abort_multipart_upload(
                    Bucket=self.location.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                )
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            log.warning("cannot abort the uploads an interrupted pack left in %s: %s", self.url, exc)

    def delete(self, name: str) -> None:
        import obstore

        with self._errors(f"deleting {self.url}/{name}"):
            obstore.delete(self._store, name)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _file_parts(path: Path) -> Iterator[bytes]:
    """A file's bytes, PART_SIZE at a time."""
    with open(path, "rb") as f:
        while part := f.read(PART_SIZE):
            yield part


class _AwsSettings(NamedTuple):
    endpoint: str
    region: str
    session: Any  # a boto3 Session, whose type is made at runtime
    credentials: Any  # botocore's, which renew themselves
    #: A PEM file of CA certificates to trust beside the system's (None: the system's alone).
    ca_bundle: str | None


def _aws_settings(options: StoreOptions, url: str) -> _AwsSettings:
    """What the AWS CLI would use to reach ``url``, ``--endpoint-url`` first."""
    import boto3
    import botocore.exceptions
    import botocore.session

    try:
        core = botocore.session.get_session()
        session = boto3.Session(botocore_session=core)
        credentials = session.get_credentials()
        region = session.region_name or "us-east-1"
        endpoint = options.endpoint_url or session.client("s3", region_name=region).meta.endpoint_url
        ca_bundle = core.get_config_variable("ca_bundle")  # AWS_CA_BUNDLE, else the profile's
    except botocore.exceptions.BotoCoreError as exc:
        raise StoreError(f"cannot set up access to {url}: {exc}") from None
    if credentials is None:
        raise StoreError(
            f"no AWS credentials for {url}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            "or AWS_PROFILE with ~/.aws/credentials"
        )
    return _AwsSettings(endpoint.rstrip("/"), region, session, credentials, ca_bundle)


def _setup_error(exc: Exception, url: str, ca_bundle: str | None) -> str:
    """obstore's refusal of the client's settings as one line: of those, the CA bundle is the one a
    user gives whose content can be wrong (a certificate that does not decode)."""
    unusable = _UNTRUSTED.search(str(exc))
    if unusable and ca_bundle:
        return (
            f"the CA bundle {ca_bundle} (AWS_CA_BUNDLE or ca_bundle in ~/.aws/config) holds a "
            f"certificate that cannot be used ({unusable.group(1)})"
        )
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"cannot set up access to {url}: {first[:300]}"


def _read_ca_bundle(path: str) -> bytes:
    try:
        pem = Path(path).expanduser().read_bytes()
    except OSError as exc:
        raise StoreError(
            f"cannot read the CA bundle {path} (AWS_CA_BUNDLE or ca_bundle in ~/.aws/config): {exc.strerror}"
        ) from None
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        raise StoreError(
            f"the CA bundle {path} (AWS_CA_BUNDLE or ca_bundle in ~/.aws/config) holds no PEM certificate"
        )
    return pem


class _UploadPipe:
    """Bytes handed from the packer's thread to an upload's, at most ``limit`` waiting.

    Iterating yields what was put until ``close``; after ``close(failed=True)`` it raises, which
    makes obstore abort the multipart upload.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._held = 0
        self._items: list[bytes | memoryview] = []
        self._closed = False
        self._failed = False
        self._cond = threading.Condition()

    def put(self, data: bytes | memoryview, alive: threading.Thread) -> None:
        with self._cond:
            while self._held and self._held + len(data) > self._limit and alive.is_alive():
                self._cond.wait(0.5)
            self._items.append(data)
            self._held += len(data)
            self._cond.notify_all()

    def close(self, failed: bool = False) -> None:
        with self._cond:
            self._closed = True
            self._failed = failed
            self._cond.notify_all()

    def __iter__(self) -> Iterator[bytes | memoryview]:
        while True:
            with self._cond:
                while not self._items and not self._closed:
                    self._cond.wait()
                if self._failed:
                    raise StoreError("upload aborted")
                if not self._items:
                    return
                items, self._items = self._items, []
                self._held = 0
                self._cond.notify_all()
            yield from items


class _S3Writer:
    """One shard's multipart upload, running in its own thread while the packer writes."""

    def __init__(self, store: S3Store, name: str) -> None:
        self._store = store
        self._name = name
        self._pipe = _UploadPipe(PIPE_BYTES)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._upload, name=f"dlfs-upload-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _upload(self) -> None:
        # SIGINT and SIGTERM go to the main thread, which knows what to undo.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            self._store.upload(self._name, iter(self._pipe))
        except BaseException as exc:
            self._error = exc

    def _raise_failure(self) -> None:
        if self._error is not None:
            raise self._error

    def write(self, data: bytes | memoryview) -> None:
        self._raise_failure()
        self._pipe.put(data, self._thread)
        self._raise_failure()

    def write_at(self, offset: int, *data: bytes | memoryview) -> None:
        raise NotImplementedError("an S3 object is written in order")

    def written_through(self, end: int) -> None:
        """Nothing: every written byte is on its way already."""

    def commit(self, size: int | None = None) -> None:
        self._pipe.close()
        self._thread.join()
        self._raise_failure()

    def abort(self) -> None:
        self._pipe.close(failed=True)
        if self._thread.is_alive():
            self._thread.join()
