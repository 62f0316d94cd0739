"""How much memory a mount's daemon may take, and its budgets fitted to it at start.

The payload cache (``--cache-size``) and the read-ahead's files (``--prefetch-budget``) are the
daemon's two budgets; a budget larger than the machine, or than the memory cgroup the daemon runs
in (a systemd ``MemoryMax``, a container's limit), would grow the daemon until the kernel's OOM
killer ends it mid-epoch, and every reader with it. Budgets are caches: a smaller one makes the
mount slower, never wrong. So they are clamped at start, not refused, and the mount says so in one
line; so are the read-ahead's batches in flight (each holds an 8 MiB read buffer) when their
buffers would take more than half of what is left. Only when not even one batch fits is the mount
refused.

What is available: ``MemAvailable`` of ``/proc/meminfo``, and under a memory cgroup its limit less
what the group uses beyond reclaimable file pages (cgroup v2 ``memory.max``, every ancestor's too;
v1 ``hierarchical_memory_limit``), the smaller of the two. The daemon's own index and interpreter
are already counted in what is used when this is asked (after the index is loaded).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dlfs.core.errors import MountError

CGROUP_ROOT = Path("/sys/fs/cgroup")
#: The budgets take at most this share of the memory available: the rest stays for the training
#: job's own processes and for the page cache the read-ahead fills.
BUDGET_SHARE = 0.5
#: Below this much room for the budgets after one read buffer, the mount is refused.
MIN_ROOM = 32 << 20
#: What a daemon grows by under load besides its budgets and read buffers (allocator arenas, thread
#: stacks): 30-54 MiB over its idle RSS in the soak test.
UNDER_LOAD = 64 << 20
#: cgroup v1 reports "no limit" as a number near 2^63.
NO_LIMIT = 1 << 62


@dataclass(frozen=True)
class Available:
    """Bytes the daemon may still take, and where the figure comes from (for the message)."""

    bytes: int
    source: str


def _meminfo(field: str, path: Path = Path("/proc/meminfo")) -> int | None:
    for line in path.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) << 10
    return None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _stat(path: Path) -> dict[str, int]:
    try:
        return {k: int(v) for k, v in (line.split() for line in path.read_text().splitlines())}
    except (OSError, ValueError):
        return {}


def cgroup_room(proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = CGROUP_ROOT) -> Available | None:
    """What this process's memory cgroup still allows (None when no limit applies)."""
    found: list[Available] = []
    for line in proc_cgroup.read_text().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and controllers == "":  # v2: every ancestor's memory.max applies
            group = root / path.lstrip("/")
            while (group / "memory.max").exists() and group != root:
                limit = _read_int(group / "memory.max")  # "max": no limit
                current = _read_int(group / "memory.current")
                if limit is not None and current is not None:
                    reclaimable = _stat(group / "memory.stat").get("inactive_file", 0)
                    found.append(Available(limit - (current - reclaimable), f"cgroup {group} limit"))
                group = group.parent
        elif "memory" in controllers.split(","):  # v1: the hierarchy's effective limit
            group = root / "memory" / path.lstrip("/")
            stat = _stat(group / "memory.stat")
            limit = stat.get("hierarchical_memory_limit", NO_LIMIT)
            usage = _read_int(group / "memory.usage_in_bytes")
            if limit < NO_LIMIT and usage is not None:
                reclaimable = stat.get("total_inactive_file", 0)
                found.append(Available(limit - (usage - reclaimable), f"cgroup {group} limit"))
    return min(found, key=lambda a: a.bytes, default=None)


def available() -> Available:
    """Memory the daemon may still take: MemAvailable, or less under a cgroup limit."""
    machine = Available(_meminfo("MemAvailable") or 0, "MemAvailable")
    group = cgroup_room()
    return group if group is not None and group.bytes < machine.bytes else machine


@dataclass(frozen=True)
class Budgets:
    cache_size: int
    prefetch_budget: int
    prefetch_inflight: int
    #: One line for the user when they were clamped; None when they fit as asked.
    note: str | None = None


def fit(cache_size: int, prefetch_budget: int, inflight: int, buffer: int, room: Available) -> Budgets:
    """The budgets and the batches in flight (each holding ``buffer`` bytes while the read-ahead is
    on) fitted to ``room`` less ``UNDER_LOAD``: the buffers to half of it at most, the two budgets,
    scaled down together, to ``BUDGET_SHARE`` of what the buffers leave. Refuses the mount
    (``MountError``) when one buffer leaves less than ``MIN_ROOM``."""
    usable = room.bytes - UNDER_LOAD
    buffer = buffer if prefetch_budget > 0 else 0
    if usable - buffer < MIN_ROOM:
        raise MountError(
            f"only {_mib(max(room.bytes, 0))} of memory is available to the mount ({room.source}); "
            "free memory or raise the limit"
        )
    batches = min(inflight, max(1, usable // 2 // buffer)) if buffer else inflight
    fits = int((usable - batches * buffer) * BUDGET_SHARE)
    asked = cache_size + prefetch_budget
    if asked <= fits and batches == inflight:
        return Budgets(cache_size, prefetch_budget, inflight)
    cache, prefetch = cache_size, prefetch_budget
    if asked > fits:
        cache, prefetch = cache_size * fits // asked, prefetch_budget * fits // asked
    note = (
        f"--cache-size {_mib(cache_size)}, --prefetch-budget {_mib(prefetch_budget)} and "
        f"--prefetch-inflight {inflight} would take more than half of the {_mib(room.bytes)} of memory "
        f"available to the mount ({room.source}): using {_mib(cache)}, {_mib(prefetch)} and {batches}"
    )
    return Budgets(cache, prefetch, batches, note)


def _mib(n: int) -> str:
    return f"{n / (1 << 30):.1f}G" if n >= 10 << 30 else f"{n >> 20}M"
