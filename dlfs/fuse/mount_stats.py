"""The mount's live counters as one snapshot: what ``.dlfs/stats`` serves and ``--metrics-port``
scrapes (``dlfs.metrics``). ``dlfs stats`` (``dlfs.stats``) reads the snapshot back on the user's side.

Each part of the mount keeps its own counters, where they change: the FUSE adapter the requests it
answers (``RequestCounts``, here, so that the snapshot can be made before the adapter is), the
reader its storage reads, the RAM cache, the store, the read-ahead, the native request server
and the lister. ``MountStats`` only reads them, on the event loop that owns them, between two
requests; a scrape, which comes on the endpoint's thread, is handed to that loop
(``from_thread``). Counters only, never rates: a rate is two snapshots apart.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from dlfs.core.protocol import LATENCY_BUCKETS

if TYPE_CHECKING:
    from dlfs.core.ram_cache import RamCache
    from dlfs.core.store import Store
    from dlfs.fuse.lister import FolderLister
    from dlfs.fuse.server import NativeServer
    from dlfs.fuse.trio_file_bytes import TrioFileBytes
    from dlfs.readahead.engine import ReadAhead

Snapshot = dict[str, object]


@dataclass
class RequestCounts:
    """What the Python FUSE adapter counts of the requests it answers."""

    #: Requests answered, by kind (and bytes read).
    requests: Counter[str] = field(default_factory=Counter)
    #: READs of files, by latency (``protocol.latency_bucket``).
    read_latency: list[int] = field(default_factory=lambda: [0] * LATENCY_BUCKETS)
    #: Their latencies' sum, in seconds (a Prometheus histogram's ``_sum``).
    read_seconds: float = 0.0


@dataclass
class MountStats:
    """The snapshot of one mount's counters (``snapshot``), read from the parts that keep them."""

    store: Store
    cache: RamCache
    file_bytes: TrioFileBytes
    lister: FolderLister
    readahead: ReadAhead | None
    native: NativeServer | None
    #: When the mount began (``time.monotonic``): the snapshot's uptime counts from there.
    started: float
    answered: RequestCounts = field(default_factory=RequestCounts)

    def snapshot(self) -> Snapshot:
        """Every counter now, as ``.dlfs/stats`` gives it; on the event loop only."""
        counted = self.store.stats()
        native = self.native
        return {
            "requests": dict(self.answered.requests),
            "ram_cache": self.cache.stats(),
            "storage": {
                "reads": self.file_bytes.storage_reads,
                "bytes": self.file_bytes.storage_bytes,
                "waits": self.file_bytes.storage_waits,
                "wait_seconds": round(self.file_bytes.storage_wait_seconds, 6),
            },
            "read_latency_us_log2": list(self.answered.read_latency),
            "read_seconds": round(self.answered.read_seconds, 6),
            "disk_tier": counted.get("disk_tier"),
            "store": counted.get("store"),
            "readahead": self.readahead.snapshot() if self.readahead is not None else None,
            "native": native.counts() if native is not None else None,
            "listed_folders": self.lister.listed,
            # Listings the C threads answered count until the lister has taken them (the daemon
            # relays them every few milliseconds).
            "listing_folders": self.lister.pending + (native.scans_pending() if native is not None else 0),
            "uptime_seconds": round(time.monotonic() - self.started, 3),
        }


def from_thread(
    snapshot: Callable[[], Snapshot], token: trio.lowlevel.TrioToken
) -> Callable[[], Snapshot | None]:
    """``snapshot`` for a scrape, which comes on the endpoint's thread: the counters belong to the
    event loop, which builds the snapshot between two requests, as for a read of .dlfs/stats.
    None once the loop has ended (unmounting): no figures rather than zeros that read as a reset."""

    def scraped() -> Snapshot | None:
        try:
            return trio.from_thread.run_sync(snapshot, trio_token=token)
        except trio.RunFinishedError:
            return None

    return scraped
