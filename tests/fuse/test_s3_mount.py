"""Mounting a dataset from a real S3 server (SeaweedFS): the tree byte for byte, the disk tier
across epochs and remounts, two nodes each fetching their ranks' share, and a store that goes away
and comes back."""

from __future__ import annotations

import errno
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import xxhash
from footprint import PeakRss, counts, resident
from mounts import counters_of, daemon_of, mount_stats
from readers import finish_readers, start_readers
from s3env import use_s3
from scrapes import scrape, value
from seaweed import SeaweedServer, free_ports
from trees import SMALL_SHARD, find_listing
from waits import bound, wait_for

from dlfs.core.protocol import order_path, parse_order
from dlfs.core.store.disk_tier import BLOCK, MAP_SUFFIX
from dlfs.pack import PackOptions, pack

pytestmark = pytest.mark.timeout(180)


def _same_tree(src: Path, mnt: Path) -> None:
    assert find_listing(mnt) == find_listing(src)
    for path in src.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert (mnt / path.relative_to(src)).read_bytes() == path.read_bytes(), path


def _cached_blocks(cache: Path) -> list[tuple[Path, int]]:
    """(sparse shard file, block number) of every block a disk tier marks as written."""
    return [
        (shard, number)
        for shard in sorted((cache / "shards").glob("*.shard"))
        for number, mark in enumerate(shard.with_name(shard.name + MAP_SUFFIX).read_bytes())
        if mark == 1
    ]


def _classes(root: Path, classes: int = 6, per_class: int = 100, size: int = 30_000) -> Path:
    for c in range(classes):
        for k in range(per_class):
            path = root / f"n{c:08d}" / f"n{c:08d}_{k:04d}.JPEG"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(os.urandom(size + 37 * k))
    return root


def test_a_bucket_mounts_as_the_tree_and_a_remount_reads_from_the_disk_tier(
    odd_tree: Path, tmp_path: Path, s3: str, mount
) -> None:
    url = f"{s3}/odd"
    pack(odd_tree, url, PackOptions(shard_size=SMALL_SHARD, progress=False))
    cache = ("--disk-tier", str(tmp_path / "cache"), "--disk-tier-size", "64M")
    with mount(url, *cache) as mnt:
        _same_tree(odd_tree, mnt)
        first = mount_stats(mnt)
        assert first["store"]["bytes"] > 0
        assert first["disk_tier"]["misses"] > 0
    with mount(url, *cache) as mnt:
        before = mount_stats(mnt)["store"]
        _same_tree(odd_tree, mnt)
        after = mount_stats(mnt)
        assert after["store"] == before  # every byte from the disk tier
        assert after["disk_tier"]["hits"] > 0 and after["disk_tier"]["misses"] == 0


def test_a_scrape_of_an_s3_mount_gives_its_store_and_disk_tier_counters(
    odd_tree: Path, tmp_path: Path, s3: str, mount
) -> None:
    """What Prometheus sees of a bucket mount with a disk tier is what ``.dlfs/stats`` says."""
    url = f"{s3}/metrics"
    pack(odd_tree, url, PackOptions(shard_size=SMALL_SHARD, progress=False))
    (port,) = free_ports(1)
    flags = ("--disk-tier", str(tmp_path / "cache"), "--disk-tier-size", "64M", "--metrics-port", str(port))
    with mount(url, *flags) as mnt:
        _same_tree(odd_tree, mnt)
        wait_for(
            lambda: mount_stats(mnt)["listing_folders"] == 0,
            "the background listings to end",
            counters_of(mnt),
        )
        stats = mount_stats(mnt)
        samples = scrape(port)
    assert stats["store"]["requests"] > 0 and stats["disk_tier"]["misses"] > 0
    assert value(samples, "dlfs_store_requests_total") == stats["store"]["requests"]
    assert value(samples, "dlfs_store_received_bytes_total") == stats["store"]["bytes"]
    for key in ("hits", "misses", "evictions"):
        assert value(samples, f"dlfs_cache_{key}_total", tier="disk") == stats["disk_tier"][key]
    assert value(samples, "dlfs_cache_used_bytes", tier="disk") == stats["disk_tier"]["used"]
    assert value(samples, "dlfs_cache_budget_bytes", tier="disk") == 64 << 20


@pytest.mark.parametrize("filesystem", ["on_disk", "in_tmpfs"])
def test_an_epoch_from_the_disk_tier_is_read_ahead_by_the_c_loop(
    filesystem: str, request: pytest.FixtureRequest, tmp_path: Path, s3: str, mount
) -> None:
    """The disk tier's files hold blocks at the shards' own offsets, so the read-ahead's C loop
    reads them as it reads a local dataset; the store is not asked for a byte. Also with the tier
    on tmpfs (``/dev/shm``), which refuses the C loop's reads that must not wait."""
    src = _classes(tmp_path / "src", classes=3, per_class=80)
    url = f"{s3}/tier-epoch"
    pack(src, url, PackOptions(shard_size=2 << 20, progress=False))
    cache = request.getfixturevalue(filesystem) / "cache"
    flags = ("--disk-tier", str(cache), "--order", "block", "--readahead-budget", "4M")
    for _ in range(2):
        with mount(url, *flags) as mnt:
            before = mount_stats(mnt)["store"]  # the index's header and meta
            paths = parse_order(order_path(mnt, 0).read_bytes())
            for path in paths:
                assert (mnt / path).read_bytes() == (src / path).read_bytes()
            after = mount_stats(mnt)
    assert after["store"] == before
    readahead = after["readahead"]
    assert readahead["native_cpu_seconds"] > 0 and readahead["pushed_files"] > len(paths) // 2


def test_the_disk_tier_keeps_its_budget(tmp_path: Path, s3: str, mount) -> None:
    src = _classes(tmp_path / "src", classes=2, per_class=60)
    url = f"{s3}/budget"
    pack(src, url, PackOptions(shard_size=1 << 20, progress=False))
    cache = tmp_path / "cache"
    budget = 2 * BLOCK
    with mount(
        url, "--disk-tier", str(cache), "--disk-tier-size", str(budget), "--readahead-budget", "0"
    ) as mnt:
        _same_tree(src, mnt)
        tier = mount_stats(mnt)["disk_tier"]
        assert tier["used"] <= budget and tier["evictions"] > 0, tier
    on_disk = sum(shard.stat().st_blocks * 512 for shard in (cache / "shards").glob("*.shard"))
    assert on_disk <= budget + 4096 * len(_cached_blocks(cache))  # holes are punched in pages


def test_a_damaged_block_of_the_disk_tier_is_dropped_and_read_again(tmp_path: Path, s3: str, mount) -> None:
    src = _classes(tmp_path / "src", classes=2, per_class=60)
    url = f"{s3}/damaged"
    pack(src, url, PackOptions(shard_size=1 << 20, progress=False))
    flags = ("--disk-tier", str(tmp_path / "cache"), "--readahead-budget", "0", "--ram-cache-size", "0")
    with mount(url, *flags) as mnt:
        _same_tree(src, mnt)
    blocks = _cached_blocks(tmp_path / "cache")
    for shard, number in blocks:  # one flipped byte in each: a file in each fails its check
        at = min(number * BLOCK + BLOCK // 2, shard.stat().st_size - 1)
        with open(shard, "r+b") as f:
            f.seek(at)
            byte = f.read(1)[0]
            f.seek(at)
            f.write(bytes([byte ^ 0xFF]))
    with mount(url, *flags) as mnt:
        _same_tree(src, mnt)
        assert mount_stats(mnt)["disk_tier"]["forgotten"] == len(blocks)


def test_two_nodes_each_fetch_about_half_of_the_shards(tmp_path: Path, s3: str, mount) -> None:
    """Two mounts of one bucket stand for two nodes, ranks 0 and 1 of 2. Each announces its rank by
    reading its order file, and its read-ahead fetches that rank's files: together each shard byte
    about once, each node about half. Block order gives each rank contiguous runs of the shards
    (the window, far below a rank's share as with ImageNet's 4096 of 160k files per rank of 8)."""
    src = _classes(tmp_path / "src")
    url = f"{s3}/nodes"
    pack(src, url, PackOptions(shard_size=2 << 20, progress=False))
    total = sum(path.stat().st_size for path in src.rglob("*.JPEG"))
    flags = ("--order", "block", "--block", "32", "--window", "64", "--readahead-budget", "8M")
    fetched = []
    with mount(url, *flags) as node0, mount(url, *flags) as node1:
        for rank, mnt in enumerate((node0, node1)):
            paths = parse_order(order_path(mnt, 0, 2, rank).read_bytes())
            for path in paths:
                assert (mnt / path).read_bytes() == (src / path).read_bytes()
            fetched.append(mount_stats(mnt)["store"]["bytes"])
    shares = [part / total for part in fetched]
    assert all(0.35 < share < 0.75 for share in shares), shares
    assert sum(shares) < 1.3, shares


@pytest.fixture
def own_server(tmp_path: Path) -> SeaweedServer:
    """A server of this test's own, which it may stop and start again."""
    server = SeaweedServer(tmp_path / "own-server").start()
    yield server
    server.stop()


def test_a_store_that_goes_away_gives_eio_in_bounded_time_and_reads_resume_when_it_returns(
    tmp_path: Path, own_server: SeaweedServer, monkeypatch: pytest.MonkeyPatch, mount
) -> None:
    url = use_s3(own_server, monkeypatch, tmp_path) + "/outage"
    src = _classes(tmp_path / "src", classes=2, per_class=20)
    pack(src, url, PackOptions(shard_size=1 << 20, progress=False))
    files = sorted(src.rglob("*.JPEG"))
    with mount(url, "--store-timeout", "3", "--readahead-budget", "0", "--ram-cache-size", "0") as mnt:
        assert (mnt / files[0].relative_to(src)).read_bytes() == files[0].read_bytes()
        own_server.stop()
        started = time.monotonic()
        with pytest.raises(OSError) as failure:
            (mnt / files[-1].relative_to(src)).read_bytes()
        assert failure.value.errno == errno.EIO
        assert time.monotonic() - started < bound(15)
        own_server.start()
        wait_for(
            lambda: _readable(mnt / files[-1].relative_to(src)),
            "reads to resume with the store back",
            counters_of(mnt),
        )
        _same_tree(src, mnt)


def _readable(path: Path) -> bool:
    try:
        path.read_bytes()
    except OSError:
        return False
    return True


class SilentProxy:
    """A TCP relay in front of the S3 server that can fall silent: it then still accepts
    connections, and answers nothing on them or on those already open, as a hung server or a
    black-holed route does."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.speaking = threading.Event()
        self.speaking.set()
        self._sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            self._sockets.append(client)
            self.speaking.wait()  # silent: the connection stays open and unread
            upstream = socket.create_connection(self.target)
            self._sockets.append(upstream)
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._relay, args=(source, sink), daemon=True).start()

    def _relay(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(1 << 16):
                self.speaking.wait()  # silent: what arrives is held, nothing is passed on
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            return

    def close(self) -> None:
        self.speaking.set()
        for sock in self._sockets:
            sock.close()


@pytest.fixture
def silent_proxy(s3_server: SeaweedServer) -> Iterator[SilentProxy]:
    proxy = SilentProxy((s3_server.ip, s3_server.port))
    yield proxy
    proxy.close()


def test_a_store_that_accepts_but_never_answers_gives_eio_after_the_timeout_in_bounded_memory(
    tmp_path: Path, s3: str, silent_proxy: SilentProxy, mount
) -> None:
    """16 readers (4 processes of 4 threads) against a store that has gone silent for 10 s: each
    read fails with EIO once ``--store-timeout`` has passed, none hangs, and the daemon's memory
    and threads stay bounded; reads come back when the store answers again."""
    url = f"{s3}/silent"
    src = _classes(tmp_path / "src", classes=4, per_class=50)
    pack(src, url, PackOptions(shard_size=1 << 20, progress=False))
    expected = {
        str(p.relative_to(src)): [p.stat().st_size, xxhash.xxh3_64_hexdigest(p.read_bytes())]
        for p in src.rglob("*.JPEG")
    }
    (tmp_path / "expected.json").write_text(json.dumps(expected))
    timeout = 2.0
    flags = (
        "--endpoint-url",
        silent_proxy.endpoint,
        "--store-timeout",
        str(timeout),
        "--ram-cache-size",
        "0",
    )
    with mount(url, *flags, "--readahead-budget", "0") as mnt:
        pid = daemon_of(mnt)
        first = next(iter(expected))
        assert (mnt / first).read_bytes() == (src / first).read_bytes()
        before = resident(pid), counts(pid)[1]
        silent_proxy.speaking.clear()
        jobs = [[{"role": "random", "seed": 4 * p + t} for t in range(4)] for p in range(4)]
        with PeakRss(pid) as rss:
            readers = start_readers(
                mnt, tmp_path / "expected.json", tmp_path / "work", jobs, deadline=time.time() + 10
            )
            results = finish_readers(readers, 10 + 4 * timeout + 15)  # a reader still blocked fails here
            threads = counts(pid)[1]
        for result in results:
            # Only a file still in the kernel's cache (the one read above) is read without the store.
            assert result["mismatches"] == 0 and set(result["errnos"]) == {str(errno.EIO)}, result
            # Not two or three timeouts: the kernel's retry of a failed READ is answered at once.
            assert timeout <= result["slowest_error"] < timeout + 2, result
        assert rss.peak - before[0] < 64 << 20, (rss.peak, before)
        assert threads <= before[1] + 16 + 64, (threads, before)  # storage threads, hinted GETs' pool
        silent_proxy.speaking.set()
        wait_for(
            lambda: all(_readable(mnt / relpath) for relpath in expected),
            "reads to resume with the store answering",
            counters_of(mnt),
        )
        _same_tree(src, mnt)
