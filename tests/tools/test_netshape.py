"""The shaped network for S3 benchmarks: the delay proxy, the rate-capped namespace, and the baselines."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from netshape import DelayProxy, ShapedNetwork, shaped_seaweed
from s3_baselines import get_objects, memcached_latency, s3_store, upload_objects

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")

#: A server for inside a namespace: listens on argv[1], prints its port, serves one connection.
#: ``sink`` reads to EOF and answers the byte count; ``source N`` sends N bytes and closes.
PEER = """
import socket, sys
server = socket.create_server((sys.argv[1], 0))
print(server.getsockname()[1], flush=True)
conn, _ = server.accept()
if sys.argv[2] == "sink":
    total = 0
    while chunk := conn.recv(1 << 20):
        total += len(chunk)
    conn.sendall(str(total).encode())
else:
    conn.sendall(bytes(int(sys.argv[3])))
conn.close()
"""


def _echo(conn: socket.socket) -> None:
    with conn:
        while chunk := conn.recv(1 << 18):
            conn.sendall(chunk)


@pytest.fixture
def echo_server() -> Iterator[tuple[str, int]]:
    """A TCP echo server on loopback; each connection echoes until EOF."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # shut down: the test is over
                return
            threading.Thread(target=_echo, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()
    finally:
        server.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(), which close() alone does not
        server.close()
        thread.join(5)


def _receive_all(sock: socket.socket) -> bytes:
    parts = []
    while chunk := sock.recv(1 << 20):
        parts.append(chunk)
    return b"".join(parts)


@pytest.mark.timeout(60)
def test_delay_proxy_carries_bytes_intact(echo_server: tuple[str, int]) -> None:
    payload = os.urandom(20 * 1024 * 1024)
    with (
        DelayProxy(*echo_server, delay_ms=5) as proxy,
        socket.create_connection(("127.0.0.1", proxy.port)) as sock,
    ):

        def send() -> None:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)

        sender = threading.Thread(target=send)
        sender.start()
        echoed = _receive_all(sock)
        sender.join()
    assert hashlib.sha256(echoed).digest() == hashlib.sha256(payload).digest()


@pytest.mark.timeout(60)
def test_delay_proxy_adds_its_delay_in_each_direction(echo_server: tuple[str, int]) -> None:
    delay_ms = 25
    with (
        DelayProxy(*echo_server, delay_ms=delay_ms) as proxy,
        socket.create_connection(("127.0.0.1", proxy.port)) as sock,
    ):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        round_trips = []
        for i in range(5):
            started = time.perf_counter()
            sock.sendall(bytes([i]))
            assert sock.recv(1) == bytes([i])
            round_trips.append(time.perf_counter() - started)
    assert min(round_trips) >= 2 * delay_ms / 1000


@pytest.fixture
def network() -> Iterator[ShapedNetwork]:
    with ShapedNetwork(rate_mbit=80, one_way_delay_ms=0) as shaped:
        yield shaped


def _start_peer(network: ShapedNetwork, *args: str) -> tuple[subprocess.Popen[str], int]:
    peer = subprocess.Popen(
        [*network.prefix, sys.executable, "-c", PEER, network.server_ip, *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert peer.stdout is not None
    return peer, int(peer.stdout.readline())


@needs_root
@pytest.mark.timeout(60)
@pytest.mark.parametrize("direction", ["to_namespace", "from_namespace"])
def test_shaped_network_caps_the_rate(network: ShapedNetwork, direction: str) -> None:
    size = 10_000_000  # 80 Mbit: one second at 80 Mbit/s
    peer, port = _start_peer(network, *(["sink"] if direction == "to_namespace" else ["source", str(size)]))
    try:
        with socket.create_connection((network.server_ip, port), timeout=30) as sock:
            started = time.perf_counter()
            if direction == "to_namespace":
                sock.sendall(bytes(size))
                sock.shutdown(socket.SHUT_WR)
                moved = int(_receive_all(sock))
            else:
                moved = len(_receive_all(sock))
            seconds = time.perf_counter() - started
    finally:
        peer.kill()
        peer.wait()
    assert moved == size
    assert seconds >= 0.9


@needs_root
@pytest.mark.timeout(60)
def test_shaped_network_leaves_nothing_behind() -> None:
    with ShapedNetwork(rate_mbit=100, one_way_delay_ms=1) as shaped:
        name, host_ip = shaped.name, shaped.host_ip
        assert name in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert name not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert (
        f"inet {host_ip}/"
        not in subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
    )


@pytest.mark.timeout(60)
def test_memcached_latency_reports_percentiles() -> None:
    result = memcached_latency(value_size=110_000, gets=200)
    assert result["gets"] == 200
    assert 0 < result["p50_us"] <= result["p99_us"] < 1_000_000


@needs_root
@pytest.mark.timeout(90)
def test_shaped_seaweed_serves_puts_and_gets_through_the_proxy(tmp_path: Path) -> None:
    rtt_ms = 20
    tree = tmp_path / "tree"
    (tree / "a").mkdir(parents=True)
    files = {"a/one.bin": os.urandom(300_000), "a/two.bin": b"", "three.bin": os.urandom(1000)}
    for key, data in files.items():
        (tree / key).write_bytes(data)
    with shaped_seaweed(tmp_path / "weed", rate_mbit=200, rtt_ms=rtt_ms) as seaweed:
        assert seaweed.endpoint != seaweed.server.endpoint
        client = seaweed.client()
        client.create_bucket(Bucket="direct")
        client.put_object(Bucket="direct", Key="k", Body=files["a/one.bin"])
        started = time.perf_counter()
        assert client.get_object(Bucket="direct", Key="k")["Body"].read() == files["a/one.bin"]
        assert time.perf_counter() - started >= rtt_ms / 1000

        client.create_bucket(Bucket="objects")
        store = s3_store(seaweed.env(), "objects")
        uploaded = upload_objects(store, tree, threads=2)
        fetched = get_objects(store, sorted(files), threads=2)
        for result in (uploaded, fetched):
            assert (result.objects, result.bytes) == (len(files), sum(map(len, files.values())))
        assert client.get_object(Bucket="objects", Key="a/one.bin")["Body"].read() == files["a/one.bin"]
