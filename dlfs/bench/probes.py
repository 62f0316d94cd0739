"""Probes: what the system around a run did, read from /proc and /sys.

The CPU time and RSS of the FUSE daemon serving a root, and what the block devices behind the
root did meanwhile (reads, MB, and like fio's ``util`` the share of the run they had I/O in
flight: whether a cold job waited on the disk or on a CPU).
"""

from __future__ import annotations

import os
import resource
import stat
from pathlib import Path

import numpy as np


def rusage_cpu(who: int = resource.RUSAGE_SELF) -> float:
    """User + system seconds of this process, all its threads (``RUSAGE_SELF``), or of the
    children it has reaped (``RUSAGE_CHILDREN``)."""
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def proc_cpu(pid: int) -> float:
    """User + system seconds of a process and all its threads, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def block_devices(root: str, pid: int | None) -> list[Path]:
    """The sysfs ``stat`` file of each block device a root's bytes come from: its own filesystem's,
    or for a FUSE root (``pid``: its daemon), those of the files the daemon holds open (dlfs's
    shards, a squashfs image, a tar). Empty for memory-backed filesystems, and for a daemon whose
    descriptors this user may not see."""
    try:
        paths = [root] if pid is None else [fd.path for fd in os.scandir(f"/proc/{pid}/fd")]
    except OSError:
        return []
    devices = set()
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:  # closed since it was listed
            continue
        if pid is None or stat.S_ISREG(st.st_mode):
            devices.add(st.st_dev)
    found = (Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat") for dev in sorted(devices))
    return [path for path in found if path.exists()]


def disk_counters(devices: list[Path]) -> np.ndarray:
    """Per device: reads completed, sectors read, milliseconds with I/O in flight (the kernel's
    Documentation/block/stat.rst, fields 1, 3 and 10)."""
    fields = [path.read_text().split() for path in devices]
    return np.array([[int(f[0]), int(f[2]), int(f[9])] for f in fields], dtype=np.int64).reshape(-1, 3)


def daemon_pid(root: str) -> int | None:
    """The process serving the FUSE mount at ``root``: it holds /dev/fuse and names ``root`` in argv.

    The kernel does not say which process serves a mount, but every FUSE daemon in use (dlfs,
    squashfuse_ll, ratarmount) is started with the mountpoint as an argument, relative to its cwd.
    Of several such processes the last started is the one serving now: the daemon of an earlier
    mount of the same root may still be exiting, holding /dev/fuse until it has.
    """
    target = os.path.realpath(root)
    found: list[tuple[int, int]] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            args = Path(entry.path, "cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(os.path.join(entry.path, "cwd"))
            named = any(os.path.realpath(os.path.join(cwd, os.fsdecode(a))) == target for a in args if a)
            if named and any(
                os.readlink(fd.path) == "/dev/fuse" for fd in os.scandir(os.path.join(entry.path, "fd"))
            ):
                found.append((_start_ticks(entry.path), int(entry.name)))
        except OSError:
            continue
    return max(found)[1] if found else None


def _start_ticks(proc: str) -> int:
    """When the process at ``proc`` (``/proc/PID``) started, in clock ticks since boot (field 22 of
    its ``stat``, counted after the parenthesised command name, which may hold spaces)."""
    stat = Path(proc, "stat").read_bytes()
    return int(stat[stat.rindex(b")") + 2 :].split()[19])
