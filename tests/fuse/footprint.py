"""What the daemon holds of the machine while it serves: resident memory (now, and the peak over a
run), open descriptors and threads, read from /proc."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def status(pid: int, field: str) -> int:
    """One number of ``/proc/PID/status`` (kB for the memory fields)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def resident(pid: int) -> int:
    """Process ``pid``'s resident memory now, in bytes."""
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_resident(pid: int) -> int:
    """The most resident memory process ``pid`` has had (``VmHWM``), in bytes."""
    return status(pid, "VmHWM") << 10


def counts(pid: int) -> tuple[int, int]:
    """(open descriptors, threads) of a process."""
    return len(os.listdir(f"/proc/{pid}/fd")), len(os.listdir(f"/proc/{pid}/task"))


class PeakRss:
    """The highest RSS a process reached while the block ran, sampled every 50 ms on a thread of its
    own (``VmHWM`` holds the peak since the process began, not since the block did)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, status(self.pid, "VmRSS") << 10)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
