"""``dlfs mount --metrics-port``: a mount's counters as Prometheus metrics, over HTTP.

A cluster's Prometheus scrapes every node the way it scrapes any exporter. Nothing is counted twice:
each scrape takes one snapshot of the stats ``.dlfs/stats`` serves (``dlfs stats`` reads the same)
and translates it, so the three always agree, and an endpoint nobody scrapes costs the daemon
nothing. The snapshot function is the daemon's to give: it builds the stats in the event loop that
changes them, since a scrape arrives on a thread of its own.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from socketserver import TCPServer, ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, ProcessCollector, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from dlfs.core.errors import MountError
from dlfs.core.protocol import LATENCY_BUCKETS
from dlfs.readahead.stats import ReadAheadStats

Json = dict[str, Any]

log = logging.getLogger(__name__)

#: Python's request counters that are not requests: bytes read, and inodes forgotten (one FORGET
#: request names many), each exported under its own name.
_NOT_REQUESTS = ("read_bytes", "forget")

#: The read-ahead's counters (all cumulative): exported as ``dlfs_readahead_<name>_total``.
PREFETCH_COUNTERS = tuple(field.name for field in dataclasses.fields(ReadAheadStats))


def latency_buckets(counts: list[int]) -> list[tuple[str, float]]:
    """A ``read_latency_us_log2`` histogram as Prometheus buckets: cumulative counts by upper bound
    in seconds. Bucket k of the stats holds [2^k, 2^(k+1)) µs, so its bound is 2^(k+1) µs; the last
    also holds every slower READ, so it is +Inf."""
    buckets, seen = [], 0
    for k in range(LATENCY_BUCKETS - 1):
        seen += counts[k] if k < len(counts) else 0
        buckets.append((floatToGoString(2 ** (k + 1) / 1e6), seen))
    buckets.append(("+Inf", sum(counts)))
    return buckets


class StatsCollector(Collector):
    """The mount's counters, translated from one stats snapshot per scrape."""

    def __init__(self, snapshot: Callable[[], Json | None]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        stats = self._snapshot()
        if stats is None:  # the daemon is stopping: its series go stale, as when it is gone
            return
        native = stats.get("native") or {}
        requests = stats.get("requests") or {}
        yield from self._requests(requests, native)
        yield from self._reads(stats, requests, native)
        yield from self._caches(stats.get("ram_cache"), stats.get("disk_tier"))
        storage = stats.get("storage") or {}
        yield _counter(
            "storage_reads",
            "Storage reads Python made (the C threads' are not counted)",
            storage.get("reads"),
        )
        yield _counter("storage_read_bytes", "Bytes those storage reads brought", storage.get("bytes"))
        yield _counter("storage_waits", "READs Python answered that waited for storage", storage.get("waits"))
        yield _counter(
            "storage_wait_seconds",
            "Seconds those READs waited for storage, in all",
            storage.get("wait_seconds"),
        )
        store = stats.get("store")
        if store is not None:
            yield _counter("store_requests", "Requests to the object store", store.get("requests"))
            yield _counter("store_received_bytes", "Bytes received from the object store", store.get("bytes"))
        if stats.get("readahead") is not None:
            yield from self._readahead(stats["readahead"])
        if native:
            yield from self._native(native)
        yield _counter("forgotten_inodes", "Inodes the kernel forgot (FORGET)", requests.get("forget"))
        yield _counter(
            "listed_folders",
            "Folders the daemon listed through the mount itself",
            stats.get("listed_folders"),
        )
        yield GaugeMetricFamily(
            "dlfs_listing_folders",
            "Folder listings queued or in progress (0: the mount is idle)",
            value=stats.get("listing_folders") or 0,
        )
        yield GaugeMetricFamily(
            "dlfs_uptime_seconds", "Seconds since the daemon started", value=stats.get("uptime_seconds") or 0
        )

    @staticmethod
    def _requests(requests: Json, native: Json) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "dlfs_requests",
            "FUSE requests answered, by kind and by who answered: the C threads (native) or Python",
            labels=["op", "server"],
        )
        for op, count in sorted(requests.items()):
            if op not in _NOT_REQUESTS:
                family.add_metric([op, "python"], count)
        for op, count in sorted((native.get("answered") or {}).items()):
            if op not in ("forget", "batch_forget"):  # gathered for Python, which counts them
                family.add_metric([op, "native"], count)
        yield family

    @staticmethod
    def _reads(stats: Json, requests: Json, native: Json) -> Iterator[Metric]:
        """READs of dataset files (not of ``.dlfs``), their bytes and latencies, by who answered."""
        python_latency = stats.get("read_latency_us_log2") or []
        native_latency = native.get("read_latency_us_log2") or []
        reads = CounterMetricFamily(
            "dlfs_reads", "READs of dataset files answered, by who answered", labels=["server"]
        )
        reads.add_metric(["python"], sum(python_latency))
        served = CounterMetricFamily("dlfs_read_bytes", "Bytes those READs returned", labels=["server"])
        served.add_metric(["python"], requests.get("read_bytes", 0))
        latency = HistogramMetricFamily(
            "dlfs_read_latency_seconds",
            "Latency of READs of dataset files: in Python from the handler's start to its data, in C "
            "from reading the request to writing the reply",
            labels=["server"],
        )
        latency.add_metric(["python"], latency_buckets(python_latency), stats.get("read_seconds", 0.0))
        if native:
            reads.add_metric(["native"], (native.get("answered") or {}).get("read", 0))
            served.add_metric(["native"], native.get("read_bytes", 0))
            latency.add_metric(["native"], latency_buckets(native_latency), native.get("read_seconds", 0.0))
        yield from (reads, served, latency)

    @staticmethod
    def _caches(ram: Json | None, disk: Json | None) -> Iterator[Metric]:
        """The RAM cache (counting files) and the disk tier (counting 1 MiB blocks)."""
        tiers = [("ram", ram or {})] + ([("disk", disk)] if disk is not None else [])
        families = {
            "hits": CounterMetricFamily("dlfs_cache_hits", "Cache hits, by tier", labels=["tier"]),
            "misses": CounterMetricFamily("dlfs_cache_misses", "Cache misses, by tier", labels=["tier"]),
            "evictions": CounterMetricFamily(
                "dlfs_cache_evictions", "Cache evictions, by tier", labels=["tier"]
            ),
            "used": GaugeMetricFamily(
                "dlfs_cache_used_bytes", "Bytes a cache holds, by tier", labels=["tier"]
            ),
            "budget": GaugeMetricFamily("dlfs_cache_budget_bytes", "Bytes a cache may hold", labels=["tier"]),
        }
        for tier, counts in tiers:
            for key, family in families.items():
                family.add_metric([tier], counts.get(key, 0))
        yield from families.values()

    @staticmethod
    def _readahead(readahead: Json) -> Iterator[Metric]:
        for name in PREFETCH_COUNTERS:
            yield _counter(f"readahead_{name}", f"Read-ahead: {name.replace('_', ' ')}", readahead.get(name))
        readings = (readahead.get("readings") or {}).values()
        yield GaugeMetricFamily(
            "dlfs_readahead_lead_files",
            "Files the read-ahead holds ready ahead of its readers, over all followed sequences",
            value=sum(r.get("lead_files", 0) for r in readings),
        )
        yield GaugeMetricFamily(
            "dlfs_readahead_readings", "Published sequences the read-ahead follows", value=len(readings)
        )
        yield GaugeMetricFamily(
            "dlfs_readahead_paused_readings",
            "Followed sequences whose reader went quiet: their read-ahead waits for it",
            value=readahead.get("paused_readings") or 0,
        )
        yield GaugeMetricFamily(
            "dlfs_readahead_inflight", "Storage batches in flight", value=readahead.get("inflight") or 0
        )
        yield GaugeMetricFamily(
            "dlfs_readahead_budget_bytes",
            "Bytes read ahead of each reader at most",
            value=readahead.get("budget", 0),
        )

    @staticmethod
    def _native(native: Json) -> Iterator[Metric]:
        forwarded = CounterMetricFamily(
            "dlfs_native_forwarded", "Requests the C threads handed to Python, by kind", labels=["op"]
        )
        for op, count in sorted((native.get("forwarded") or {}).items()):
            forwarded.add_metric([op], count)
        yield forwarded
        yield _counter(
            "native_regions_fetched",
            "Shard regions the C threads had the kernel read",
            native.get("regions_fetched"),
        )
        yield GaugeMetricFamily(
            "dlfs_native_threads", "Threads answering requests in C", value=native.get("threads", 0)
        )


def _counter(name: str, documentation: str, value: float | None) -> CounterMetricFamily:
    return CounterMetricFamily(f"dlfs_{name}", documentation, value=value or 0)


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in progress never holds up the daemon's exit

    def server_bind(self) -> None:
        """Bind without HTTPServer's ``getfqdn`` of the address: a reverse DNS lookup that, on a
        node whose resolver does not answer, holds up the mount for seconds. The name only goes
        into CGI variables nobody reads here."""
        TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)
        self.setup_environ()


class _QuietHandler(WSGIRequestHandler):
    """Scrapes come every few seconds: logged at debug level, not one line each on stderr."""

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("metrics: " + format, *args)


class MetricsEndpoint:
    """The HTTP listener Prometheus scrapes (any path answers, ``/metrics`` by convention).

    Bound at construction, so that a taken port fails the mount before it mounts; serving from
    ``start``, when the daemon can build snapshots. Beside the mount's own metrics it gives the
    daemon process's CPU, memory and descriptors (``process_*``)."""

    def __init__(self, address: str, port: int) -> None:
        try:
            family, _, _, _, sockaddr = socket.getaddrinfo(
                address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )[0]

            class Server(_Server):
                address_family = family

            self._registry = CollectorRegistry()
            ProcessCollector(registry=self._registry)
            self._server = make_server(
                sockaddr[0], port, make_wsgi_app(self._registry), Server, handler_class=_QuietHandler
            )
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise MountError(
                f"cannot serve metrics on {address}:{port}: {reason}; choose another --metrics-port "
                "or --metrics-addr"
            ) from None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self, snapshot: Callable[[], Json | None]) -> None:
        self._registry.register(StatsCollector(snapshot))
        self._thread = threading.Thread(target=self._server.serve_forever, name="dlfs-metrics", daemon=True)
        self._thread.start()
        log.info("serving metrics on http://%s:%d/metrics", *self._server.server_address[:2])

    def close(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()
