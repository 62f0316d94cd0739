"""A store that stalls (accepts and never answers, or starts a body and never ends it) fails after
``--store-timeout``, in one line, not never; and the words of obstore's errors that dlfs tells
failures apart by are still what the installed obstore says."""

from __future__ import annotations

import datetime
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from commands import assert_one_line_error, dlfs
from s3env import TEST_BUCKET
from seaweed import SeaweedServer
from waits import bound

from dlfs.core.store.s3 import obstore_errors

pytestmark = pytest.mark.timeout(120)


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
    assert time.monotonic() - started < bound(20)


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
