"""Waiting in tests: on the event that ends the wait (a file written, a process ended, a mount
made, a thread's signal), never a fixed sleep; and how long to wait before calling a wait a hang.

``wait_for`` blocks in ``poll`` on what can make its condition hold (``Wake``s) and asks the
condition again each time one fires. Only the counters of another process (the daemon's
``.dlfs/stats``) and kernel state no descriptor reports (the page cache, a process's wait channel)
have nothing to wake on: their waits name ``Asked``, which asks again every ``ASK_EVERY`` seconds
and still wakes at once when the daemon serving them ends.

A hang must fail, so every wait has a bound. A bound that fits a quiet machine fails on a busy one
(``make test-stress``, or a suite beside other work): the daemon's exit after an unmount takes a
second, but on two cores shared with twenty runnable processes its share of them makes that many
times longer. So each bound is scaled by ``contention()``, how many times its CPU time a busy loop
here takes now in wall-clock time, measured at most every ``MEASURE_EVERY`` seconds.
"""

from __future__ import annotations

import contextlib
import os
import select
import time
from collections.abc import Callable
from pathlib import Path

from inotify_simple import INotify, flags

#: Seconds a test waits, on a quiet machine, for something that takes well under a second there
#: before it calls it a hang; ``bound`` scales it.
HANG = 30.0
#: The most any wait may be stretched to: a test's own timeout (pyproject's 180 s) must still find
#: the test, not a wait, at fault when the whole machine stands still.
LONGEST = 150.0
#: CPU seconds of the busy loop that measures contention, and how long a measure holds.
SAMPLE_CPU = 0.02
MEASURE_EVERY = 5.0
#: How often ``Asked`` asks a condition that nothing signals.
ASK_EVERY = 0.02

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


class Wake:
    """A descriptor that becomes ready when the condition waited for may have changed."""

    events = select.POLLIN
    closed_by_wait = True

    def fileno(self) -> int:
        raise NotImplementedError

    def rearm(self) -> None:
        """Take the event that fired, so that the next ``poll`` waits for a new one."""

    def close(self) -> None:
        """Let go of the descriptor."""


class Changes(Wake):
    """Files created, written, renamed or removed at ``paths``: each a file or a folder, watched
    once it exists, its parent folder meanwhile (so a path that appears later is seen)."""

    def __init__(self, *paths: Path) -> None:
        self.paths = paths
        self.inotify = INotify(nonblocking=True)
        self._watch()

    def _watch(self) -> None:
        mask = (
            flags.CREATE
            | flags.MODIFY
            | flags.CLOSE_WRITE
            | flags.MOVED_TO
            | flags.MOVED_FROM
            | flags.DELETE
            | flags.ATTRIB
        )
        for path in self.paths:
            for watched in (path, path.parent):
                try:
                    self.inotify.add_watch(watched, mask)
                except FileNotFoundError:
                    continue

    def fileno(self) -> int:
        return self.inotify.fileno()

    def rearm(self) -> None:
        self.inotify.read(timeout=0)
        self._watch()  # a path that appeared is watched from now on

    def close(self) -> None:
        self.inotify.close()


class Exit(Wake):
    """Process ``pid`` ended (its pidfd): any process, not only a child. Once it fires, what the
    condition depends on can change no more: the condition is asked a last time."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        try:
            self.fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self.fd = os.eventfd(1)  # it has ended already: ready at once

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        os.close(self.fd)


class Mounts(Wake):
    """A mount made or gone on this machine: ``/proc/self/mountinfo`` reports every change to the
    mount table as an exceptional condition, until it is read again."""

    events = select.POLLPRI | select.POLLERR

    def __init__(self) -> None:
        self.file = open("/proc/self/mountinfo", "rb")
        self.rearm()

    def fileno(self) -> int:
        return self.file.fileno()

    def rearm(self) -> None:
        self.file.seek(0)
        self.file.read()

    def close(self) -> None:
        self.file.close()


class Signal(Wake):
    """Set by another thread of this process when what it does may hold the condition (an
    ``eventfd``). It outlives a wait, since the thread may set it after: its owner closes it
    (``with Signal() as signal``), not ``wait_for``."""

    closed_by_wait = False

    def __init__(self) -> None:
        self.fd = os.eventfd(0, os.EFD_NONBLOCK)

    def __enter__(self) -> Signal:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)

    def set(self) -> None:
        os.eventfd_write(self.fd, 1)

    def fileno(self) -> int:
        return self.fd

    def rearm(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self.fd)


class Asked(Exit):
    """For state no descriptor reports (another process's counters, the page cache): asked again
    every ``ASK_EVERY`` seconds; with ``pid``, the process keeping that state, whose end ends the
    wait at once."""

    def __init__(self, pid: int | None = None) -> None:
        if pid is None:
            self.pid, self.fd = 0, os.eventfd(0)  # never ready: only the asking
        else:
            super().__init__(pid)


def wait_for(
    condition: Callable[[], object],
    what: str,
    *wakes: Wake,
    seconds: float = HANG,
    seen: Callable[[], object] | None = None,
) -> None:
    """Ask ``condition`` until it holds, again each time one of ``wakes`` fires; fail, naming
    ``what`` was waited for (and what ``seen`` gives then, if given), once ``bound(seconds)`` have
    passed without it, or at once when a process it depends on has ended. Closes the wakes but a
    ``Signal``."""
    assert wakes, "a wait needs what can end it: Changes, Exit, Mounts, Signal or Asked"
    limit = bound(seconds)
    deadline = time.monotonic() + limit
    every = ASK_EVERY if any(isinstance(wake, Asked) for wake in wakes) else None
    by_fd = {wake.fileno(): wake for wake in wakes}
    poller = select.poll()
    for fd, wake in by_fd.items():
        poller.register(fd, wake.events)

    def failed(why: str) -> AssertionError:
        return AssertionError(f"{why} {what}" + (f"; seen: {seen()}" if seen is not None else ""))

    try:
        while not condition():
            left = deadline - time.monotonic()
            if left <= 0:
                raise failed(f"waited {limit:.0f} s for")
            for fd, _ in poller.poll(1000 * (left if every is None else min(left, every))):
                wake = by_fd[fd]
                if isinstance(wake, Exit):
                    if condition():
                        return
                    raise failed(f"pid {wake.pid} ended while waiting for")
                wake.rearm()
    finally:
        for wake in wakes:
            if wake.closed_by_wait:
                wake.close()


def wait_for_files(folder: Path, pattern: str, writer: int, what: str, more_than: int = 0) -> None:
    """Until more than ``more_than`` files in ``folder`` match ``pattern``, as process ``writer``
    writes them: woken by every change there, failing at once if the writer ends first."""
    wait_for(
        lambda: len(list(folder.glob(pattern))) > more_than,
        what,
        Changes(folder),
        Exit(writer),
        seconds=60,
    )


def exited_within(pid: int, seconds: float) -> bool:
    """Whether process ``pid`` (any process, not only a child) has ended, or ends within ``seconds``:
    woken by its pidfd the moment it does. A child that ended and was not reaped yet counts as
    ended."""
    wake = Exit(pid)
    try:
        return bool(select.select([wake], [], [], seconds)[0])
    finally:
        wake.close()


def wait_exited(pid: int, what: str, seconds: float = HANG) -> None:
    """Wait for process ``pid`` to end (``exited_within``); fail naming ``what`` after
    ``bound(seconds)``."""
    limit = bound(seconds)
    if not exited_within(pid, limit):
        raise AssertionError(f"{what}: pid {pid} was still running {limit:.0f} s later")


def alive(pid: int) -> bool:
    """Whether process ``pid`` is still running (one ended but not reaped is not)."""
    return not exited_within(pid, 0)
