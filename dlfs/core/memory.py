"""How much memory a mount's daemon may take, and its budgets fitted to it at start.

What a daemon's resident memory is made of: the interpreter and its libraries, the index (read
whole at start), the RAM cache (``--ram-cache-size``) and the read-ahead's files parked in it
(``--readahead-budget``), one read buffer per read-ahead batch in flight (``--readahead-inflight``;
two for an object store, whose responses land beside it), and what the allocator and thread stacks
grow by under load (``UNDER_LOAD``). ``--memory-limit`` bounds the sum: what the daemon holds once
its index is loaded is measured, and the budgets and batches are fitted to the rest.

A budget larger than the machine, or than the memory cgroup the daemon runs in (a systemd
``MemoryMax``, a container's limit), would grow the daemon until the kernel's OOM killer ends it
mid-epoch, and every reader with it. Budgets are caches: a smaller one makes the mount slower,
never wrong. So they are clamped at start, not refused, and the mount says so in one line; so are
the read-ahead's batches in flight when their buffers would take more than half of what is left.
The read-ahead keeps its budget first (up to half of what fits), since it is what keeps readers
from waiting on storage; the RAM cache takes the rest. Only when not even one batch fits is the
mount refused.

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
    """Bytes the daemon may still take, where the figure comes from (for the message), and the share
    of them the budgets may fill: half of the machine's (the rest is the training job's and the
    page cache's), all of what ``--memory-limit`` leaves."""

    bytes: int
    source: str
    share: float = BUDGET_SHARE

    @property
    def for_budgets(self) -> float:
        return self.bytes * self.share


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


def resident(status: Path = Path("/proc/self/status")) -> int:
    """This process's resident memory (``VmRSS``)."""
    return _meminfo("VmRSS", status) or 0


def available(limit: int | None = None) -> Available:
    """Memory the daemon may still take: MemAvailable, or less under a cgroup limit, or what
    ``limit`` (``--memory-limit``) leaves beside what the daemon holds already."""
    machine = Available(_meminfo("MemAvailable") or 0, "MemAvailable")
    group = cgroup_room()
    found = group if group is not None and group.bytes < machine.bytes else machine
    if limit is not None:
        held = resident()
        own = Available(limit - held, f"--memory-limit {_mib(limit)} less the {_mib(held)} held", share=1.0)
        found = min(found, own, key=lambda room: room.for_budgets)
    return found


@dataclass(frozen=True)
class Budgets:
    ram_cache_size: int
    readahead_budget: int
    readahead_inflight: int
    #: One line for the user when they were clamped; None when they fit as asked.
    note: str | None = None


def fit(ram_cache_size: int, readahead_budget: int, inflight: int, buffer: int, room: Available) -> Budgets:
    """The budgets and the batches in flight (each holding ``buffer`` bytes while the read-ahead is
    on) fitted to ``room`` less ``UNDER_LOAD``: the buffers to half of it at most, the two budgets
    to ``room.share`` of what the buffers leave, the read-ahead's first. Refuses the mount
    (``MountError``) when one buffer leaves less than ``MIN_ROOM``."""
    usable = room.bytes - UNDER_LOAD
    buffer = buffer if readahead_budget > 0 else 0
    if usable - buffer < MIN_ROOM:
        raise MountError(
            f"only {_mib(max(room.bytes, 0))} of memory is available to the mount ({room.source}); "
            "free memory or raise the limit"
        )
    batches = min(inflight, max(1, usable // 2 // buffer)) if buffer else inflight
    fits = int((usable - batches * buffer) * room.share)
    if ram_cache_size + readahead_budget <= fits and batches == inflight:
        return Budgets(ram_cache_size, readahead_budget, inflight)
    readahead = min(readahead_budget, max(fits - ram_cache_size, fits // 2))
    cache = min(ram_cache_size, fits - readahead)
    asked = _flags(ram_cache_size, readahead_budget, inflight)
    used = _flags(cache, readahead, batches)
    changed = [flag for flag in asked if asked[flag] != used[flag]]
    portion = "" if room.share >= 1 else f"{room.share:.0%} of "
    note = (
        f"{', '.join(f'{flag} {asked[flag]}' for flag in changed)} would take more than {portion}the "
        f"{_mib(room.bytes)} of memory available to the mount ({room.source}): using "
        f"{', '.join(f'{flag} {used[flag]}' for flag in changed)}"
    )
    return Budgets(cache, readahead, batches, note)


def _flags(ram_cache_size: int, readahead_budget: int, inflight: int) -> dict[str, str]:
    """The three flags ``fit`` may change, as its note names them."""
    return {
        "--ram-cache-size": _mib(ram_cache_size),
        "--readahead-budget": _mib(readahead_budget),
        "--readahead-inflight": str(inflight),
    }


def _mib(n: int) -> str:
    if n >= 10 << 40:
        return f"{n / (1 << 40):.1f}T"
    return f"{n / (1 << 30):.1f}G" if n >= 10 << 30 else f"{n >> 20}M"
