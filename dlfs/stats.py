"""``dlfs stats MNT``: what a mount is doing, from its ``.dlfs/stats``, once or every few seconds.

The daemon keeps counters only (requests, bytes, hits, waits, latency histograms); rates are the
difference of two snapshots over the time between them, so watching costs the daemon nothing but
one small read. Reads and bytes count those answered in C (``native``) and in Python alike; their
latencies are kept apart, since a READ Python answers waits for its one thread and C's do not.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dlfs.core.errors import MountError
from dlfs.core.protocol import CONTROL_NAME, STATS_NAME, latency_percentile

Json = dict[str, Any]


def snapshot(mnt: str | os.PathLike[str]) -> Json:
    path = Path(mnt) / os.fsdecode(CONTROL_NAME) / os.fsdecode(STATS_NAME)
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise MountError(f"{mnt} is not a dlfs mount (no readable {path.name} in .dlfs): {exc}") from None


def figures(stats: Json) -> Json:
    """The cumulative counters ``dlfs stats`` shows, flat, from one snapshot."""
    native = stats.get("native") or {}
    requests = stats.get("requests") or {}
    cache = stats.get("ram_cache") or {}
    disk = stats.get("disk_tier") or {}
    store = stats.get("store") or {}
    storage = stats.get("storage") or {}
    readahead = stats.get("readahead") or {}
    readings = (readahead.get("readings") or {}).values()
    latency = stats.get("read_latency_us_log2") or []
    native_latency = native.get("read_latency_us_log2") or []
    return {
        # READs of files: those Python answered are in its latency histogram (its "read" requests
        # count the control files too, this very snapshot among them).
        "reads": sum(latency) + (native.get("answered") or {}).get("read", 0),
        "bytes_served": requests.get("read_bytes", 0) + native.get("read_bytes", 0),
        "lookups": requests.get("lookup", 0) + (native.get("answered") or {}).get("lookup", 0),
        "ram_hits": cache.get("hits", 0),
        "ram_misses": cache.get("misses", 0),
        "disk_hits": disk.get("hits", 0),
        "disk_misses": disk.get("misses", 0),
        "store_requests": store.get("requests", 0),
        "store_bytes": store.get("bytes", 0),
        "storage_bytes": storage.get("bytes", 0),
        "storage_waits": storage.get("waits", 0),
        "storage_wait_seconds": storage.get("wait_seconds", 0.0),
        "pushed_files": readahead.get("pushed_files", 0),
        "lead_files": sum(r.get("lead_files", 0) for r in readings),
        "latency": latency,
        "native_latency": native_latency,
        "uptime_seconds": stats.get("uptime_seconds", 0.0),
    }


def _ratio(hits: float, misses: float) -> float | None:
    return hits / (hits + misses) if hits + misses else None


def _percentiles(latency: list[int]) -> tuple[float | None, float | None]:
    return latency_percentile(latency, 0.5), latency_percentile(latency, 0.99)


#: The histograms among ``figures``: no rate of their own, percentiles instead.
_HISTOGRAMS = ("latency", "native_latency")


def summary(now: Json) -> Json:
    """Cumulative figures since the mount, with hit ratios and read latency percentiles."""
    p50, p99 = _percentiles(now["latency"])
    native_p50, native_p99 = _percentiles(now["native_latency"])
    return {
        **{key: value for key, value in now.items() if key not in _HISTOGRAMS},
        "ram_hit_ratio": _ratio(now["ram_hits"], now["ram_misses"]),
        "disk_hit_ratio": _ratio(now["disk_hits"], now["disk_misses"]),
        "read_p50_us": p50,
        "read_p99_us": p99,
        "native_read_p50_us": native_p50,
        "native_read_p99_us": native_p99,
    }


def rates(before: Json, after: Json, seconds: float) -> Json:
    """Per-second rates between two snapshots, hit ratios and read latencies of that interval."""
    delta = {key: after[key] - before[key] for key in after if key not in (*_HISTOGRAMS, "lead_files")}
    p50, p99 = _percentiles(_difference(before["latency"], after["latency"]))
    native_p50, native_p99 = _percentiles(_difference(before["native_latency"], after["native_latency"]))
    per_second = {f"{key}_per_s": value / seconds for key, value in delta.items() if key != "uptime_seconds"}
    return {
        **per_second,
        "ram_hit_ratio": _ratio(delta["ram_hits"], delta["ram_misses"]),
        "disk_hit_ratio": _ratio(delta["disk_hits"], delta["disk_misses"]),
        "storage_wait_ms": 1e3 * delta["storage_wait_seconds"] / delta["storage_waits"]
        if delta["storage_waits"]
        else None,
        "lead_files": after["lead_files"],
        "read_p50_us": p50,
        "read_p99_us": p99,
        "native_read_p50_us": native_p50,
        "native_read_p99_us": native_p99,
    }


def _difference(before: list[int], after: list[int]) -> list[int]:
    """The histogram of what came between two snapshots of it."""
    return [b - a for a, b in zip(before, after, strict=False)]


def watch(mnt: str | os.PathLike[str], every: float) -> Iterator[Json]:
    """Rates every ``every`` seconds until interrupted."""
    before, started = figures(snapshot(mnt)), time.monotonic()
    while True:
        time.sleep(every)
        after, now = figures(snapshot(mnt)), time.monotonic()
        yield rates(before, after, now - started)
        before, started = after, now


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _us(value: float | None) -> str:
    return "-" if value is None else f"<{value:,.0f} µs"


def table(mnt: str | os.PathLike[str], figures_now: Json) -> str:
    s = summary(figures_now)
    rows = [
        ("reads", f"{s['reads']:,} ({s['bytes_served'] / 1e6:,.1f} MB served)"),
        ("lookups", f"{s['lookups']:,}"),
        ("RAM cache hits", f"{_pct(s['ram_hit_ratio'])} of {s['ram_hits'] + s['ram_misses']:,}"),
        ("disk tier hits", f"{_pct(s['disk_hit_ratio'])} of {s['disk_hits'] + s['disk_misses']:,} blocks"),
        ("object store", f"{s['store_requests']:,} requests, {s['store_bytes'] / 1e6:,.1f} MB"),
        (
            "waits on storage",
            f"{s['storage_waits']:,} reads, {s['storage_wait_seconds']:.2f} s in all",
        ),
        ("read-ahead", f"{s['pushed_files']:,} files pushed, {s['lead_files']:,} ahead of the readers now"),
        ("reads in C", f"p50 {_us(s['native_read_p50_us'])}, p99 {_us(s['native_read_p99_us'])}"),
        ("reads in Python", f"p50 {_us(s['read_p50_us'])}, p99 {_us(s['read_p99_us'])}"),
        ("uptime", f"{s['uptime_seconds']:,.0f} s"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join([str(mnt), *(f"  {name:<{width}}  {value}" for name, value in rows)])


def line(r: Json) -> str:
    return (
        f"{r['reads_per_s']:9,.0f} reads/s {r['bytes_served_per_s'] / 1e6:8,.1f} MB/s  "
        f"RAM {_pct(r['ram_hit_ratio']):>4}  disk {_pct(r['disk_hit_ratio']):>4}  "
        f"store {r['store_bytes_per_s'] / 1e6:7,.1f} MB/s  ahead {r['lead_files']:>6,}  "
        f"waits {r['storage_waits_per_s']:6,.0f}/s"
        + (f" ({r['storage_wait_ms']:.1f} ms)" if r["storage_wait_ms"] is not None else "")
        + f"  C p50 {_us(r['native_read_p50_us'])} p99 {_us(r['native_read_p99_us'])}"
        + f"  Python p50 {_us(r['read_p50_us'])} p99 {_us(r['read_p99_us'])}"
    )
