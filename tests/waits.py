"""Waiting in tests: for a process's exit on its pidfd, for a condition the code shows by polling
it, never by sleeping a fixed time; and how long to wait before calling a wait a hang.

A hang must fail, so every wait has a bound. A bound that fits a quiet machine fails on a busy one
(``make test-stress``, or a suite beside other work): the daemon's exit after an unmount takes a
second, but on two cores shared with twenty runnable processes its share of them makes that many
times longer. So each bound is scaled by ``contention()``, how many times its CPU time a busy loop
here takes now in wall-clock time, measured at most every ``MEASURE_EVERY`` seconds.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable

#: Seconds a test waits, on a quiet machine, for something that takes well under a second there
#: before it calls it a hang; ``bound`` scales it.
HANG = 30.0
#: The most any wait may be stretched to: a test's own timeout (pyproject's 180 s) must still find
#: the test, not a wait, at fault when the whole machine stands still.
LONGEST = 150.0
#: CPU seconds of the busy loop that measures contention, and how long a measure holds.
SAMPLE_CPU = 0.02
MEASURE_EVERY = 5.0
#: How often a polled condition is asked.
POLL_EVERY = 0.02

_measured: tuple[float, float] | None = None  # (when, factor)


def contention() -> float:
    """Wall-clock seconds per CPU second of a busy loop in this thread now: 1 on an idle machine,
    about the runnable processes per core on a busy one (never below 1)."""
    global _measured
    now = time.monotonic()
    if _measured is None or now - _measured[0] > MEASURE_EVERY:
        wall, cpu = time.monotonic(), time.thread_time()
        while time.thread_time() - cpu < SAMPLE_CPU:
            pass
        factor = (time.monotonic() - wall) / (time.thread_time() - cpu)
        _measured = (now, max(1.0, factor))
    return _measured[1]


def bound(seconds: float) -> float:
    """``seconds`` on a quiet machine, stretched by the contention now (at most ``LONGEST``, at
    least ``seconds``)."""
    return max(seconds, min(seconds * contention(), LONGEST))


def wait_for(
    condition: Callable[[], object],
    what: str,
    seconds: float = HANG,
    seen: Callable[[], object] | None = None,
) -> None:
    """Ask ``condition`` until it holds; fail, naming ``what`` was waited for (and what ``seen``
    gives then, if given), once ``bound(seconds)`` have passed without it."""
    limit = bound(seconds)
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            detail = f"; seen: {seen()}" if seen is not None else ""
            raise AssertionError(f"waited {limit:.0f} s for {what}{detail}")
        time.sleep(POLL_EVERY)


def stays_false(condition: Callable[[], object], seconds: float) -> bool:
    """Whether ``condition`` stayed false for ``seconds``: for what must not happen, where nothing
    signals that it never will."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return False
        time.sleep(POLL_EVERY)
    return not condition()


def exited_within(pid: int, seconds: float) -> bool:
    """Whether process ``pid`` (any process, not only a child) has ended, or ends within ``seconds``:
    woken by its pidfd the moment it does. A child that ended and was not reaped yet counts as
    ended."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([pidfd], [], [], seconds)[0])
    finally:
        os.close(pidfd)


def wait_exited(pid: int, what: str, seconds: float = HANG) -> None:
    """Wait for process ``pid`` to end (``exited_within``); fail naming ``what`` after
    ``bound(seconds)``."""
    limit = bound(seconds)
    if not exited_within(pid, limit):
        raise AssertionError(f"{what}: pid {pid} was still running {limit:.0f} s later")


def alive(pid: int) -> bool:
    """Whether process ``pid`` is still running (one ended but not reaped is not)."""
    return not exited_within(pid, 0)
