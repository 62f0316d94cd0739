"""``dlfs mount --metrics-port``: the mount's counters scraped over loopback, as Prometheus would."""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from unittest import mock

import pytest
import trio
from commands import assert_one_line_error, dlfs
from mounts import counters_of, is_mounted, mount_stats
from page_cache import drop_from_memory
from scrapes import Samples, scrape, value
from seaweed import free_ports
from waits import wait_for

from dlfs.core.protocol import LATENCY_BUCKETS
from dlfs.fuse.mount_stats import from_thread
from dlfs.metrics import MetricsEndpoint, StatsCollector, latency_buckets


def histogram(samples: Samples, server: str) -> list[float]:
    """The cumulative bucket counts of one server's read latency, by rising bound."""
    found = [
        (float(dict(labels)["le"]), count)
        for (name, labels), count in samples.items()
        if name == "dlfs_read_latency_seconds_bucket" and dict(labels)["server"] == server
    ]
    return [count for _, count in sorted(found)]


def cumulative(counts: list[int]) -> list[int]:
    running, out = 0, []
    for count in counts[:-1]:
        running += count
        out.append(running)
    return [*out, sum(counts)]


@pytest.mark.parametrize("native_threads", ["0", "2"])
def test_a_scrape_gives_the_counters_of_dlfs_stats(
    packed_on_disk: Path, odd_tree: Path, mount, native_threads: str
) -> None:
    """Read files through Python (0) or the C threads (2), then scrape: the same figures as
    ``.dlfs/stats``, which reading the stats file does not change (it counts READs of files only)."""
    for shard in packed_on_disk.glob("*.shard"):
        drop_from_memory(shard)  # so that Python's reads wait for storage
    (port,) = free_ports(1)
    with mount(packed_on_disk, "--native-threads", native_threads, "--metrics-port", str(port)) as mnt:
        for path in sorted((odd_tree / "many").iterdir())[:60]:
            assert (mnt / "many" / path.name).read_bytes() == path.read_bytes()
        # The daemon's own listings (of folders read by name) finish first: then nothing moves.
        wait_for(
            lambda: mount_stats(mnt)["listing_folders"] == 0,
            "the daemon's own listings to end",
            counters_of(mnt),
        )
        stats = mount_stats(mnt)
        samples = scrape(port)
    python = stats["read_latency_us_log2"]
    assert value(samples, "dlfs_reads_total", server="python") == sum(python)
    assert value(samples, "dlfs_read_bytes_total", server="python") == stats["requests"].get("read_bytes", 0)
    assert histogram(samples, "python") == cumulative(python)
    assert value(samples, "dlfs_read_latency_seconds_sum", server="python") == stats["read_seconds"]
    assert value(samples, "dlfs_cache_hits_total", tier="ram") == stats["ram_cache"]["hits"]
    assert value(samples, "dlfs_cache_misses_total", tier="ram") == stats["ram_cache"]["misses"]
    assert value(samples, "dlfs_storage_waits_total") == stats["storage"]["waits"]
    assert value(samples, "dlfs_storage_wait_seconds_total") == stats["storage"]["wait_seconds"]
    assert value(samples, "dlfs_readahead_pushed_files_total") == stats["readahead"]["pushed_files"]
    assert value(samples, "process_resident_memory_bytes") > 0  # the daemon's, beside its counters
    if native_threads == "0":
        assert sum(python) >= 50 and stats["storage"]["waits"] > 0  # empty files need no READ
        assert stats["native"] is None and not histogram(samples, "native")
        return
    native = stats["native"]
    assert native["answered"]["read"] >= 50
    assert value(samples, "dlfs_reads_total", server="native") == native["answered"]["read"]
    assert value(samples, "dlfs_read_bytes_total", server="native") == native["read_bytes"]
    assert histogram(samples, "native") == cumulative(native["read_latency_us_log2"])
    assert value(samples, "dlfs_read_latency_seconds_count", server="native") == native["answered"]["read"]
    assert value(samples, "dlfs_requests_total", op="lookup", server="native") == native["answered"]["lookup"]
    assert value(samples, "dlfs_native_threads") == 2


def test_latencies_become_cumulative_log2_buckets_in_seconds() -> None:
    counts = [0] * LATENCY_BUCKETS
    counts[3], counts[10], counts[-1] = 2, 5, 1  # [8, 16) µs, [1024, 2048) µs, and slower than any bound
    buckets = latency_buckets(counts)
    assert len(buckets) == LATENCY_BUCKETS and buckets[-1] == ("+Inf", 8)
    bounds = dict(buckets)
    assert bounds["8e-06"] == 0 and bounds["1.6e-05"] == 2 and bounds["0.002048"] == 7
    assert float(buckets[-2][0]) == 2 ** (LATENCY_BUCKETS - 1) / 1e6 and buckets[-2][1] == 7


def test_a_snapshot_without_native_threads_read_ahead_or_object_store_still_exports() -> None:
    """``--native-threads 0 --readahead-budget 0`` on a directory: their sections are null."""
    stats = {"requests": {"lookup": 3}, "read_latency_us_log2": [1] + [0] * 31, "read_seconds": 1e-6}
    stats |= {"cache": {"hits": 1}, "storage": {}, "native": None, "readahead": None, "store": None}
    names = {family.name for family in StatsCollector(lambda: stats).collect()}
    assert {"dlfs_requests", "dlfs_read_latency_seconds", "dlfs_cache_hits"} <= names
    assert not any(name.startswith(("dlfs_readahead", "dlfs_native", "dlfs_store")) for name in names)


def test_a_taken_metrics_port_fails_the_mount_and_leaves_nothing_mounted(
    packed: Path, tmp_path: Path
) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = dlfs("mount", packed, mnt, "--metrics-port", str(port), check=False, timeout=60)
    assert_one_line_error(result, f"127.0.0.1:{port}", "--metrics-port")
    assert not is_mounted(mnt)


def test_a_stopping_daemon_gives_no_figures_rather_than_zeros() -> None:
    """A scrape that comes after the daemon's event loop ended gets no snapshot, and the collector
    then gives no series: zeros would read as a counter reset, no series go stale as for a daemon
    gone."""
    tokens = []

    async def loop() -> None:
        tokens.append(trio.lowlevel.current_trio_token())

    trio.run(loop)
    snapshot = from_thread(lambda: {"requests": {}}, tokens[0])
    with ThreadPoolExecutor(1) as scraper:  # scrapes come on the endpoint's thread
        assert scraper.submit(snapshot).result(timeout=10) is None
    assert list(StatsCollector(snapshot).collect()) == []


def test_binding_the_endpoint_asks_no_dns() -> None:
    """HTTPServer looks the bound address up in reverse DNS, which stalls on a node whose resolver
    does not answer; the endpoint must not."""
    with mock.patch.object(socket, "getfqdn", side_effect=AssertionError("reverse DNS lookup")):
        endpoint = MetricsEndpoint("127.0.0.1", 0)
    assert endpoint.port > 0
    endpoint.close()
