"""A shaped network for S3 benchmarks: a rate cap that the kernel enforces and a delay that a proxy adds.

Loopback moves gigabytes per second with microseconds of latency, so a store measured over it looks
far better than over any real network. ``ShapedNetwork`` puts a server in its own network namespace,
joined to the host by a veth pair with a ``tbf`` qdisc capping each direction. The kernel here has
no ``netem``, so the delay comes from ``DelayProxy``: a userspace TCP proxy, in a process of its own
so its CPU never competes for the benchmark's GIL, that holds every chunk in each direction for the
one-way delay before passing it on, in order. ``shaped_seaweed`` puts the two together in front of a
real S3 server.

What the proxy cannot emulate: TCP over a long path. Between the proxy and the server the round trip
is near zero, so congestion windows never limit a connection; instead each direction of a
connection buffers at most ``BUFFER_BYTES`` in the proxy, which caps one connection at
``BUFFER_BYTES`` per one-way delay (400 MiB/s at 10 ms), above the rates benchmarks ask for.

Run as a script, it is the proxy: ``python tools/netshape.py proxy --listen 127.0.0.1:0
--target IP:PORT --delay-ms D`` prints the port it listens on as its first line and serves until
SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import ipaddress
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from seaweed import SeaweedServer
from service import ProcessService, Service

#: The /30 subnets of veth pairs come from here; a range no ordinary network uses.
ADDRESS_POOL = ipaddress.ip_network("10.231.0.0/16")
#: Held while a subnet is chosen and claimed, so parallel runs never pick the same one.
LOCK_PATH = Path(tempfile.gettempdir()) / "dlfs-netshape.lock"
#: How long ``tbf`` queues a packet before dropping it: shallow, as on a datacenter switch, so a
#: saturated link shows as TCP backing off rather than as tens of milliseconds of added latency.
QUEUE_MS = 10
#: The proxy's reads: large, so 1 Gbit/s is a few thousand chunks a second.
READ_SIZE = 256 * 1024
#: Bytes one direction of one connection may hold in the proxy; a full buffer stops reading, and TCP
#: carries that back to the sender.
BUFFER_BYTES = 4 * 1024 * 1024
#: Seconds the proxy gets to print its port, and after SIGTERM to exit.
PROXY_START_TIMEOUT = 10.0
PROXY_STOP_GRACE = 2.0


def _run(*command: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {result.stderr.strip()}")


def _host_networks() -> list[ipaddress.IPv4Network]:
    """The IPv4 networks of every address on the host, to keep a new subnet clear of them."""
    listing = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True, check=True).stdout
    networks = []
    for line in listing.splitlines():
        fields = line.split()
        if "inet" in fields:
            interface = ipaddress.ip_interface(fields[fields.index("inet") + 1])
            networks.append(interface.network)
    return networks


class ShapedNetwork(Service):
    """A network namespace reached from the host over a veth pair capped at ``rate_mbit`` each way.

    Start a server inside with ``prefix`` before its command, bound to ``server_ip``; reach it from
    the host at ``server_ip``, or through ``proxy(port)`` to add ``one_way_delay_ms`` each way.
    Leaving the context deletes the veth pair and the namespace; servers started inside must be
    stopped first (a process still inside keeps the namespace alive, though unnamed).
    """

    def __init__(self, rate_mbit: float, one_way_delay_ms: float) -> None:
        if rate_mbit <= 0 or one_way_delay_ms < 0:
            raise ValueError(
                f"need a positive rate and a delay >= 0, not {rate_mbit} Mbit/s, {one_way_delay_ms} ms"
            )
        self.rate_mbit = rate_mbit
        self.one_way_delay_ms = one_way_delay_ms
        self.name = f"dlfs-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.host_ip = ""
        self.server_ip = ""
        self._host_link = ""
        self._namespace_made = False

    @property
    def prefix(self) -> list[str]:
        """The command prefix that runs a program inside the namespace."""
        return ["ip", "netns", "exec", self.name]

    def proxy(self, port: int) -> DelayProxy:
        """A proxy on the host's loopback that adds this network's delay in front of ``port`` inside."""
        return DelayProxy(self.server_ip, port, self.one_way_delay_ms)

    def _start(self) -> None:
        if os.geteuid() != 0:
            raise RuntimeError("a shaped network needs root (network namespaces, veth and tc): run as root")
        _run("ip", "netns", "add", self.name)
        self._namespace_made = True
        with open(LOCK_PATH, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            index, subnet = self._free_subnet()
            host, server = (str(address) for address in subnet.hosts())
            # Names from the subnet's index: unique while the subnet is, and within IFNAMSIZ.
            host_link, server_link = f"dlfs{index}h", f"dlfs{index}n"
            _run(*f"ip link add {host_link} type veth peer name {server_link} netns {self.name}".split())
            self._host_link = host_link
            _run("ip", "addr", "add", f"{host}/{subnet.prefixlen}", "dev", host_link)
        self.host_ip, self.server_ip = host, server
        inside = ("ip", "-n", self.name)
        _run(*inside, "addr", "add", f"{server}/{subnet.prefixlen}", "dev", server_link)
        _run(*inside, "link", "set", "lo", "up")
        _run(*inside, "link", "set", server_link, "up")
        _run("ip", "link", "set", host_link, "up")
        _run("tc", "qdisc", "add", "dev", host_link, "root", *self._tbf())
        _run("tc", "-n", self.name, "qdisc", "add", "dev", server_link, "root", *self._tbf())

    def _free_subnet(self) -> tuple[int, ipaddress.IPv4Network]:
        """A /30 of ``ADDRESS_POOL`` that no host address overlaps, searched from a random start."""
        taken = _host_networks()
        subnets = list(ADDRESS_POOL.subnets(new_prefix=30))
        start = int.from_bytes(os.urandom(4), "little") % len(subnets)
        for step in range(len(subnets)):
            index = (start + step) % len(subnets)
            if not any(subnets[index].overlaps(network) for network in taken):
                return index, subnets[index]
        raise RuntimeError(f"no free /30 left in {ADDRESS_POOL}: delete stale dlfs* veth links")

    def _tbf(self) -> list[str]:
        rate_bytes = self.rate_mbit * 1e6 / 8
        # A bucket of 2 ms of traffic, at least one 64 KiB GSO packet so tbf need not split it.
        burst = max(64 * 1024, int(rate_bytes * 0.002))
        return f"tbf rate {round(self.rate_mbit * 1e6)}bit burst {burst} latency {QUEUE_MS}ms".split()

    def stop(self) -> None:
        """Delete the veth pair, then the namespace; each step runs even if an earlier one failed."""
        if self._host_link:
            subprocess.run(["ip", "link", "del", self._host_link], capture_output=True, check=False)
            self._host_link = ""
        if self._namespace_made:
            subprocess.run(["ip", "netns", "del", self.name], capture_output=True, check=False)
            self._namespace_made = False


class DelayProxy(ProcessService):
    """The delaying proxy (``python tools/netshape.py proxy``) as a subprocess, to ``target`` from
    ``listen_host``; ``port`` and ``endpoint`` (an http URL) say where to connect once entered."""

    def __init__(
        self, target_host: str, target_port: int, delay_ms: float, listen_host: str = "127.0.0.1"
    ) -> None:
        self.target = (target_host, target_port)
        self.delay_ms = delay_ms
        self.host = listen_host
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _start(self) -> None:
        # A script's own folder (tools/), never the current directory, comes first on its sys.path.
        command = [
            sys.executable, __file__, "proxy", "--listen", f"{self.host}:0",
            "--target", f"{self.target[0]}:{self.target[1]}", "--delay-ms", str(self.delay_ms),
        ]  # fmt: skip
        self._process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
        self.port = self._read_port(self._process)

    @staticmethod
    def _read_port(process: subprocess.Popen[bytes]) -> int:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], PROXY_START_TIMEOUT)
        line = process.stdout.readline() if ready else b""
        if not line.strip().isdigit():
            raise RuntimeError(f"delay proxy did not start (exit status {process.poll()}): {line!r}")
        return int(line)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(PROXY_STOP_GRACE)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        assert process.stdout is not None
        process.stdout.close()


@dataclass
class ShapedSeaweed:
    """A SeaweedFS server inside a shaped network, reached through a delay proxy: use ``endpoint``,
    ``env()`` and ``client()``, which all go through the proxy, never ``server.endpoint``."""

    network: ShapedNetwork
    server: SeaweedServer
    proxy: DelayProxy

    @property
    def endpoint(self) -> str:
        return self.proxy.endpoint

    def env(self) -> dict[str, str]:
        return {**self.server.env(), "AWS_ENDPOINT_URL": self.endpoint}

    def client(self):  # boto3's client type is generated at runtime
        return self.server.client(self.endpoint)


@contextmanager
def shaped_seaweed(root: str | os.PathLike[str], rate_mbit: float, rtt_ms: float) -> Iterator[ShapedSeaweed]:
    """``weed server`` with data under ``root``, ``rtt_ms`` and ``rate_mbit`` away from the host."""
    with (
        ShapedNetwork(rate_mbit, rtt_ms / 2) as network,
        SeaweedServer(root, prefix=network.prefix, ip=network.server_ip) as server,
        network.proxy(server.port) as proxy,
    ):
        yield ShapedSeaweed(network, server, proxy)


class _DelayLine:
    """One direction of one connection: chunks in arrival order, each due ``delay`` seconds after it
    arrived. Bounded in bytes: while it is full the reader waits, and the sender's TCP window closes."""

    def __init__(self, delay: float, limit: int) -> None:
        self._delay = delay
        self._limit = limit
        self._chunks: deque[tuple[float, bytes]] = deque()
        self._bytes = 0
        self._changed = asyncio.Condition()

    async def put(self, arrived: float, chunk: bytes) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self._bytes < self._limit)
            self._chunks.append((arrived + self._delay, chunk))
            self._bytes += len(chunk)
            self._changed.notify_all()

    async def get(self) -> tuple[float, bytes]:
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self._chunks))
            due, chunk = self._chunks.popleft()
            self._bytes -= len(chunk)
            self._changed.notify_all()
        return due, chunk


async def _receive(reader: asyncio.StreamReader, line: _DelayLine) -> None:
    loop = asyncio.get_running_loop()
    while True:
        chunk = await reader.read(READ_SIZE)
        await line.put(loop.time(), chunk)
        if not chunk:
            return


async def _send(line: _DelayLine, writer: asyncio.StreamWriter) -> None:
    loop = asyncio.get_running_loop()
    while True:
        due, chunk = await line.get()
        if (wait := due - loop.time()) > 0:
            await asyncio.sleep(wait)
        if not chunk:  # the sender's EOF, passed on as a half-close once it is due
            if writer.can_write_eof():
                writer.write_eof()
            return
        writer.write(chunk)
        await writer.drain()


async def _forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    line = _DelayLine(delay, BUFFER_BYTES)
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(_receive(reader, line))
        tasks.create_task(_send(line, writer))


def _tune(writer: asyncio.StreamWriter) -> None:
    writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    writer.transport.set_write_buffer_limits(high=READ_SIZE * 4)


async def _relay(
    client_reader: asyncio.StreamReader,
    client_writer: asyncio.StreamWriter,
    target: tuple[str, int],
    delay: float,
) -> None:
    """Carry one connection both ways. A new connection first pays a round trip, as a TCP handshake
    does over a real link; then every chunk waits ``delay`` in each direction."""
    handshake = asyncio.ensure_future(asyncio.sleep(2 * delay))
    writers = [client_writer]
    try:
        target_reader, target_writer = await asyncio.open_connection(*target, limit=READ_SIZE)
        writers.append(target_writer)
        await handshake
        for writer in writers:
            _tune(writer)
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(_forward(client_reader, target_writer, delay))
            tasks.create_task(_forward(target_reader, client_writer, delay))
    except* OSError:
        pass  # a peer reset or refused: close both sides, as the network would
    except* asyncio.CancelledError:
        pass  # the proxy is stopping; Python 3.11's streams would log a cancelled handler as an error
    finally:
        handshake.cancel()
        for writer in writers:
            writer.close()


async def _serve(listen: tuple[str, int], target: tuple[str, int], delay: float) -> None:
    server = await asyncio.start_server(
        lambda reader, writer: _relay(reader, writer, target, delay), *listen, limit=READ_SIZE
    )
    print(server.sockets[0].getsockname()[1], flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with server:
        await stop.wait()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python tools/netshape.py")
    commands = parser.add_subparsers(dest="command", required=True)
    proxy = commands.add_parser("proxy", help="a TCP proxy that delays each direction; prints its port")
    proxy.add_argument("--listen", type=_address, default=("127.0.0.1", 0), help="HOST:PORT (0: any free)")
    proxy.add_argument("--target", type=_address, required=True, help="HOST:PORT to forward to")
    proxy.add_argument("--delay-ms", type=float, required=True, help="one-way delay added in each direction")
    args = parser.parse_args(argv)
    asyncio.run(_serve(args.listen, args.target, args.delay_ms / 1000))


if __name__ == "__main__":
    main()
