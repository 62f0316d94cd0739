"""The S3 backend against a real S3 server (SeaweedFS): pack, verify, ls, info, the index's local
copy, failed packs that leave nothing behind, and one-line errors for wrong settings."""

from __future__ import annotations

import datetime
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from subprocess import Popen

import pytest
from conftest import DLFS, SMALL_SHARD, TEST_BUCKET, assert_one_line_error, dlfs, wait_until
from seaweed import SeaweedServer

from dlfs.core import format as fmt
from dlfs.core.errors import DatasetError, PackError
from dlfs.core.index import Index
from dlfs.core.shard_store import shard_store
from dlfs.core.store import StoreOptions, index_copies, open_store
from dlfs.core.store.cached import BLOCK, CachedStore
from dlfs.core.store.s3 import obstore_errors
from dlfs.core.store.s3 import settings as s3_settings
from dlfs.core.store.s3.store import S3Store
from dlfs.pack import PackOptions, pack
from dlfs.pack.writers import InOrderShards

pytestmark = pytest.mark.timeout(120)


def split(url: str) -> tuple[str, str]:
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    return bucket, prefix


def objects(server: SeaweedServer, url: str) -> list[str]:
    """Keys under ``url``, relative to it."""
    bucket, prefix = split(url)
    listing = server.client().list_objects_v2(Bucket=bucket, Prefix=prefix + "/")
    return sorted(item["Key"].removeprefix(prefix + "/") for item in listing.get("Contents", []))


def open_uploads(server: SeaweedServer, url: str) -> list[str]:
    bucket, prefix = split(url)
    uploads = server.client().list_multipart_uploads(Bucket=bucket, Prefix=prefix + "/").get("Uploads", [])
    return [upload["Key"] for upload in uploads]


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
    """The read-ahead stages spans into the disk tier as ``Reader.stage`` does: every span hinted,
    then each filled. Two spans sharing a block hint overlapping runs; once the first has kept that
    block, the second fetches its run less that block, from its hint: no GET more, no hint left."""
    store, data = one_shard
    tier = CachedStore(store, tmp_path / "cache")
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
    tier = CachedStore(store, tmp_path / "cache")
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


def test_wrong_bucket_credentials_or_endpoint_are_one_line_errors(
    packed: Path, s3: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert_one_line_error(
        dlfs("info", "s3://no-such-bucket-here/x", check=False), "bucket no-such-bucket-here"
    )
    assert_one_line_error(dlfs("ls", f"{s3}/nothing", check=False), "not a dlfs dataset", "dlfs pack")
    assert_one_line_error(dlfs("info", "s3:///x", check=False), "s3://BUCKET")
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    started = time.monotonic()
    result = dlfs(
        "info", f"{s3}/x", "--endpoint-url", f"http://127.0.0.1:{port}", "--store-timeout", "2", check=False
    )
    assert_one_line_error(result, "no answer from", f"127.0.0.1:{port}")
    assert time.monotonic() - started < 30
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    result = dlfs("info", f"{s3}/x", check=False)
    assert_one_line_error(result, "access denied", "credentials")
    assert "not-the-secret" not in result.stderr
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    assert_one_line_error(dlfs("info", f"{s3}/x", check=False), "no AWS credentials")


def test_without_credentials_no_request_goes_to_the_instance_metadata_service(
    s3: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """botocore's chain asks 169.254.169.254 for an instance role when no credentials are set: right
    on EC2, a packet off the machine in a test. Every connect() the command makes is traced."""
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    trace = tmp_path / "connects"
    command = ["strace", "-f", "-qq", "-e", "trace=connect", "-o", str(trace), *DLFS, "-q", "info", f"{s3}/x"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert_one_line_error(result, "no AWS credentials")
    assert "169.254.169.254" not in trace.read_text()


@contextmanager
def stalling_server(answer: bytes = b"") -> Iterator[int]:
    """A loopback port whose server takes every connection and every request, sends ``answer``
    (the start of a reply, or nothing) and then nothing more: a stalled store."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    server.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn = server.accept()[0]
            except TimeoutError:
                continue
            held.append(conn)
            if answer:
                conn.recv(65536)
                conn.sendall(answer)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=10)
        for conn in held:
            conn.close()
        server.close()


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port that accepts connections and never answers."""
    with stalling_server() as port:
        yield port


def test_a_store_that_never_answers_fails_after_the_timeout_not_never(s3: str, silent_server: int) -> None:
    started = time.monotonic()
    result = dlfs(
        "ls",
        f"{s3}/x",
        "--endpoint-url",
        f"http://127.0.0.1:{silent_server}",
        "--store-timeout",
        "2",
        check=False,
    )
    assert_one_line_error(result, "no answer from")
    assert time.monotonic() - started < 20


def test_a_local_dataset_takes_no_cache_dir(packed: Path, tmp_path: Path) -> None:
    """Refused once the index says where the bytes are: an in-place index in a directory may
    name tars in S3, which the disk tier does keep."""
    options = StoreOptions(cache_dir=str(tmp_path / "cache"))
    store = open_store(packed, options=options)
    try:
        with pytest.raises(DatasetError, match="object storage"):
            shard_store(Index.load(store), store, options=options)
    finally:
        store.close()


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


def _without_key_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)


def test_credentials_come_from_a_profile(
    odd_tree: Path, tmp_path: Path, s3_server, s3: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"{s3}/profiled"
    pack(odd_tree, url, PackOptions(shard_size=SMALL_SHARD, progress=False))
    credentials = tmp_path / "credentials"
    credentials.write_text(
        f"[work]\naws_access_key_id = {s3_server.access_key}\n"
        f"aws_secret_access_key = {s3_server.secret_key}\n"
    )
    _without_key_variables(monkeypatch)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_PROFILE", "work")
    assert "dataset_id:" in dlfs("info", url).stdout


# An on-premises store (Ceph RGW, MinIO) often has a certificate from a private CA: dlfs trusts the
# CA that AWS_CA_BUNDLE or the profile's ca_bundle names, as the AWS CLI does.


def test_an_untrusted_certificate_is_a_one_line_error_that_says_what_to_set(
    s3_server, s3: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.https_endpoint)
    result = dlfs("ls", f"{s3}/tls", check=False)
    assert_one_line_error(result, "not trusted", "UnknownIssuer", "AWS_CA_BUNDLE", s3_server.https_endpoint)


def test_the_ca_named_by_aws_ca_bundle_is_trusted(
    odd_tree: Path, s3_server, s3: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"{s3}/tls"
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.https_endpoint)
    monkeypatch.setenv("AWS_CA_BUNDLE", str(s3_server.tls.ca))
    dlfs("pack", odd_tree, url, "--shard-size", str(SMALL_SHARD))
    assert "OK: checked" in dlfs("verify", url).stdout  # every byte read back over HTTPS


def test_the_ca_named_by_the_profiles_ca_bundle_is_trusted(
    odd_tree: Path, tmp_path: Path, s3_server, s3: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"{s3}/tls"
    dlfs("pack", odd_tree, url, "--shard-size", str(SMALL_SHARD))  # over plain HTTP
    listing = dlfs("ls", "-R", url).stdout
    config = tmp_path / "aws-config"
    config.write_text(f"[default]\nca_bundle = {s3_server.tls.ca}\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.https_endpoint)
    assert dlfs("ls", "-R", url).stdout == listing


def test_an_unusable_ca_bundle_is_a_one_line_error(
    tmp_path: Path, s3_server, s3: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.https_endpoint)
    not_pem, bad_pem = tmp_path / "not.pem", tmp_path / "bad.pem"
    not_pem.write_text("[default]\n")
    bad_pem.write_text("-----BEGIN CERTIFICATE-----\nZm9v\n-----END CERTIFICATE-----\n")
    unusable = (
        (tmp_path / "gone.pem", "cannot read the CA bundle"),
        (not_pem, "no PEM"),
        (bad_pem, "cannot be used (BadEncoding)"),
    )
    for bundle, complaint in unusable:
        monkeypatch.setenv("AWS_CA_BUNDLE", str(bundle))
        assert_one_line_error(dlfs("ls", f"{s3}/tls", check=False), complaint, str(bundle))


def test_temporary_credentials_are_renewed_while_the_store_is_in_use(
    odd_tree: Path, tmp_path: Path, s3_server, s3: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``credential_process`` hands out credentials that expire within minutes: botocore runs it
    again before they do, and the store asks for them on its requests."""
    url = f"{s3}/renewed"
    pack(odd_tree, url, PackOptions(shard_size=SMALL_SHARD, progress=False))
    calls = tmp_path / "calls"
    process = tmp_path / "credential-process"
    process.write_text(
        "#!/bin/sh\n"
        f"echo call >> {calls}\n"
        'expires=$(date -u -d "+2 minutes" +%Y-%m-%dT%H:%M:%SZ)\n'
        f'echo "{{\\"Version\\": 1, \\"AccessKeyId\\": \\"{s3_server.access_key}\\", '
        f'\\"SecretAccessKey\\": \\"{s3_server.secret_key}\\", \\"Expiration\\": \\"$expires\\"}}"\n'
    )
    process.chmod(0o755)
    config = tmp_path / "config"
    config.write_text(f"[profile temporary]\ncredential_process = {process}\n")
    _without_key_variables(monkeypatch)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_PROFILE", "temporary")
    monkeypatch.setattr(s3_settings, "CREDENTIALS_TTL", datetime.timedelta(0))  # asked on every request
    store = S3Store(url)
    for _ in range(3):
        assert store.read(fmt.INDEX_NAME, 0, 8) == fmt.INDEX_MAGIC
    assert len(calls.read_text().splitlines()) >= 3


@pytest.fixture(scope="module")
def big_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Incompressible files enough for three shards of ``INTERRUPTED_SHARD``, each uploaded in a few
    parts: a pack of it takes long enough to be interrupted at every stage."""
    root = tmp_path_factory.mktemp("big")
    for folder in range(4):
        (root / f"class{folder}").mkdir()
        for number in range(12):
            (root / f"class{folder}" / f"{number}.bin").write_bytes(os.urandom(2 << 20))
    return root


INTERRUPTED_SHARD = 40 << 20


def _progress_events(process: subprocess.Popen[bytes], events: list[int]) -> None:
    """Count the progress bar's refreshes on ``process``'s stderr (each begins with a CR)."""
    assert process.stderr is not None
    while chunk := process.stderr.read1(4096):  # type: ignore[attr-defined]
        events[0] += chunk.count(b"\r")


def _parts_stored(server: SeaweedServer, url: str) -> bool:
    """Has an open upload under ``url`` stored a part? (One may complete between the two asks.)"""
    bucket, prefix = split(url)
    client = server.client()
    uploads = client.list_multipart_uploads(Bucket=bucket, Prefix=prefix + "/").get("Uploads", [])
    try:
        return any(
            client.list_parts(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"]).get("Parts")
            for upload in uploads
        )
    except client.exceptions.NoSuchUpload:
        return False


#: Moments of a pack into S3, each as a condition seen from outside the packing process.
MOMENTS: dict[str, Callable[[SeaweedServer, str, list[int]], bool]] = {
    "after 3 progress events": lambda server, url, events: events[0] >= 3,
    "an upload open": lambda server, url, events: bool(open_uploads(server, url)),
    "a part stored": lambda server, url, events: _parts_stored(server, url),
    "a shard written": lambda server, url, events: bool(objects(server, url)),
    "a shard written and an upload open": lambda server, url, events: bool(
        [name for name in objects(server, url) if name.endswith(fmt.SHARD_SUFFIX)]
        and open_uploads(server, url)
    ),
}


@contextmanager
def pack_until(
    big_tree: Path, url: str, reached: Callable[[list[int]], bool], *extra: str
) -> Iterator[Popen[bytes]]:
    """A real ``dlfs pack`` of ``big_tree`` into ``url``, once ``reached`` (given the count of
    progress events) says so; killed and reaped on the way out if it still runs."""
    shard_size = str(INTERRUPTED_SHARD)
    command = [*DLFS, "pack", str(big_tree), url, "--shard-size", shard_size, "--readers", "2", *extra]
    pipe = subprocess.PIPE
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=pipe, stderr=pipe)
    events = [0]
    reader = threading.Thread(target=_progress_events, args=(process, events), daemon=True)
    reader.start()
    try:
        ended = process.poll
        assert wait_until(lambda: reached(events) or ended() is not None, 60)
        assert process.poll() is None, "the pack ended first"
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
        reader.join(timeout=30)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("moment", "signals"),
    [
        ("after 3 progress events", [signal.SIGINT]),
        ("after 3 progress events", [signal.SIGTERM]),
        ("an upload open", [signal.SIGTERM]),
        ("a part stored", [signal.SIGINT, signal.SIGINT]),  # as ``timeout`` and a shell send it
        ("a part stored", [signal.SIGTERM]),
        ("a shard written", [signal.SIGINT]),
        ("a shard written", [signal.SIGTERM, signal.SIGINT]),
    ],
)
def test_an_interrupted_pack_leaves_no_object_and_no_unfinished_upload(
    big_tree: Path, s3_server: SeaweedServer, s3: str, moment: str, signals: list[int]
) -> None:
    """A real ``dlfs pack`` interrupted at one moment of its upload, by SIGINT or SIGTERM, once or
    with a second signal while it cleans up: it says so, and nothing is left under its prefix."""
    url = f"{s3}/interrupted"
    with pack_until(big_tree, url, lambda events: MOMENTS[moment](s3_server, url, events)) as process:
        for signum in signals:
            process.send_signal(signum)
        assert process.wait(timeout=60) == 130
    assert objects(s3_server, url) == []
    assert open_uploads(s3_server, url) == []


def _killed_while_uploading(big_tree: Path, server: SeaweedServer, url: str, *extra: str) -> tuple[str, str]:
    """SIGKILL a pack into ``url`` once it has written a shard and opened another's upload; the
    names of those two."""
    before = objects(server, url)

    def new_shards() -> list[str]:
        return [n for n in objects(server, url) if n.endswith(fmt.SHARD_SUFFIX) and n not in before]

    def written_and_open(_: list[int]) -> bool:
        return bool(new_shards() and open_uploads(server, url))

    with pack_until(big_tree, url, written_and_open, *extra) as process:
        process.kill()
        process.wait(timeout=30)
    return new_shards()[0], open_uploads(server, url)[0].rsplit("/", 1)[1]


@pytest.mark.timeout(300)
def test_what_a_killed_pack_left_is_listed_by_info_and_removed_by_the_next_pack(
    big_tree: Path, odd_tree: Path, s3_server: SeaweedServer, s3: str
) -> None:
    """SIGKILL leaves a written shard and an open upload: ``dlfs info`` names them, beside a
    dataset or where there is none, and the next pack into the prefix removes them."""
    url = f"{s3}/killed"
    for force in ((), ("--force",)):
        shard, upload = _killed_while_uploading(big_tree, s3_server, url, *force)
        if force:
            info = dlfs("info", url).stdout
            assert shard in info and f"{upload} (unfinished upload)" in info and "next dlfs pack" in info
        else:
            result = dlfs("info", url, check=False)
            assert_one_line_error(result, "not a dlfs dataset", shard, f"{upload} (unfinished upload)")
        dlfs("pack", odd_tree, url, "--shard-size", str(SMALL_SHARD), "--force")
        assert shard not in objects(s3_server, url) and open_uploads(s3_server, url) == []
        assert "leftovers:        none" in dlfs("info", url).stdout


def _obstore_client(endpoint: str, secret: str | None = None, bucket: str = TEST_BUCKET, **client: object):
    """A bare obstore client of ``bucket`` at ``endpoint``, retrying little and timing out soon."""
    import obstore.store

    env = dict(os.environ)
    second = datetime.timedelta(seconds=1)
    return obstore.store.S3Store(
        bucket,
        config={
            "region": "us-east-1",
            "endpoint": endpoint,
            "access_key_id": env["AWS_ACCESS_KEY_ID"],
            "secret_access_key": secret or env["AWS_SECRET_ACCESS_KEY"],
        },
        client_options={"allow_http": True, "timeout": second, "connect_timeout": second, **client},
        retry_config={"max_retries": 1, "retry_timeout": second, "backoff": {"base": 2}},
    )


@pytest.fixture
def stalled_body() -> Iterator[int]:
    """A port whose server answers every request with the start of a body that never ends."""
    start = (
        b"HTTP/1.1 206 Partial Content\r\nContent-Length: 100\r\nContent-Range: bytes 0-99/1000\r\n\r\nabc"
    )
    with stalling_server(start) as port:
        yield port


def test_the_obstore_words_that_errors_are_told_apart_by_are_still_there(
    s3_server: SeaweedServer, s3: str, stalled_body: int
) -> None:
    """obstore has no exception type for a listing's failures, an endpoint that does not answer or
    a certificate it refuses (``obstore_errors``): its words are read. Each is produced here with
    the installed obstore, so that a change in them fails this test rather than, silently, the
    one-line error a user sees. The failures that have a type keep it."""
    import obstore
    import obstore.exceptions

    def failure(call: Callable[[], object]) -> Exception:
        try:
            call()
        except Exception as exc:
            return exc
        raise AssertionError("no failure")

    def said(call: Callable[[], object]) -> str:
        return str(failure(call))

    def listing(endpoint: str, **how: object) -> Callable[[], object]:
        return lambda: obstore.list_with_delimiter(_obstore_client(endpoint, **how))  # type: ignore[arg-type]

    def s3_code(text: str) -> str | None:
        match = obstore_errors.S3_CODE.search(text)
        return match.group(1) if match else None

    endpoint = s3_server.env()["AWS_ENDPOINT_URL"]
    assert s3_code(said(listing(endpoint, bucket="no-such-bucket"))) == "NoSuchBucket"
    assert s3_code(said(listing(endpoint, secret="wrong"))) in obstore_errors.DENIED
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        nobody = f"http://127.0.0.1:{closed.getsockname()[1]}"
    assert obstore_errors.NO_ANSWER.search(said(listing(nobody)))
    stalled = _obstore_client(f"http://127.0.0.1:{stalled_body}")
    assert obstore_errors.NO_ANSWER.search(said(lambda: obstore.get_range(stalled, "k", start=0, length=100)))
    untrusted = obstore_errors.UNTRUSTED.search(said(listing(s3_server.https_endpoint)))
    assert untrusted and untrusted.group(1) == "UnknownIssuer"
    bad_pem = b"-----BEGIN CERTIFICATE-----\nZm9v\n-----END CERTIFICATE-----\n"
    refused = said(lambda: _obstore_client(endpoint, root_certificate=bad_pem))
    unusable = obstore_errors.UNTRUSTED.search(refused)
    assert unusable and unusable.group(1) == "BadEncoding"
    # The typed ones.
    client = _obstore_client(endpoint)
    missing = failure(lambda: obstore.get_range(client, "nothing", start=0, length=1))
    assert isinstance(missing, FileNotFoundError)
    wrong = _obstore_client(endpoint, secret="not-the-secret")
    assert isinstance(
        failure(lambda: obstore.get_range(wrong, "nothing", start=0, length=1)),
        obstore.exceptions.PermissionDeniedError,
    )


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
