"""Real mounts in tests: started with the CLI, always unmounted, their daemons reaped and their logs
checked; and what a test asks of a mount from outside (the mount table, its daemon, its stats)."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from commands import dlfs
from waits import HANG, Asked, Exit, Mounts, bound, exited_within, wait_exited, wait_for

from dlfs.fuse.mount import holders


def is_mounted(mnt: Path) -> bool:
    target = os.fsencode(os.path.realpath(mnt))
    with open("/proc/self/mountinfo", "rb") as f:
        return any(line.split()[4] == target for line in f)


def wait_mounted(mnt: Path, daemon: subprocess.Popen, what: str, seconds: float = HANG) -> None:
    """Until ``mnt`` is mounted or the foreground ``daemon`` that mounts it has ended (the caller
    tells which): woken by the mount table's change or the daemon's end."""
    wait_for(
        lambda: is_mounted(mnt) or daemon.poll() is not None,
        what,
        Mounts(),
        Exit(daemon.pid),
        seconds=seconds,
    )


def force_unmount(mnt: Path) -> str:
    """fusermount3 -u, then a lazy unmount as the last resort; never raises. Returns why the plain
    unmount failed, and who held the mount then ("" when it did not fail)."""
    why = ""
    for command in (["fusermount3", "-u", str(mnt)], ["fusermount3", "-u", "-z", str(mnt)]):
        if not is_mounted(mnt):
            return why
        result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        if result.returncode != 0 and not why:
            users = ", ".join(holders(str(mnt))) or "no process seen"
            why = f"{' '.join(command)} failed ({result.stderr.strip()}; held by {users}): detached lazily"
    return why


def _doing(pid: int) -> str:
    """What process ``pid``'s threads are doing, counted by name, state and where each sleeps in
    the kernel: ``3 x trio-worker S in futex_wait_queue``."""
    seen: Counter[str] = Counter()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            state = (task / "stat").read_text().rsplit(") ", 1)[1].split()[0]
            seen[f"{(task / 'comm').read_text().strip()} {state} in {(task / 'wchan').read_text()}"] += 1
        except (OSError, IndexError):  # the thread ended meanwhile
            continue
    return "; ".join(f"{count} x {what}" for what, count in seen.most_common())


def unmount_and_reap(mnt: Path, pid: int) -> str | None:
    """Unmount (``force_unmount``) and wait on the daemon's pidfd for it to exit on its own, which
    every clean unmount must. None when it did; otherwise what was seen when the wait gave up, and
    the daemon is killed."""
    why = force_unmount(mnt)
    limit = bound(HANG)
    if exited_within(pid, limit):
        return None
    try:
        doing = _doing(pid)
    except OSError:  # it ended just now
        return None
    table = "still in the mount table" if is_mounted(mnt) else "gone from the mount table"
    os.kill(pid, signal.SIGKILL)
    how = why or "unmounted"
    return f"pid {pid} was still running {limit:.0f} s after the unmount ({table}; {how}): {doing}"


def mount_pid(result: subprocess.CompletedProcess[str]) -> int:
    """The daemon pid a background ``dlfs mount`` printed."""
    return int(re.search(r"daemon pid (\d+)", result.stdout).group(1))  # type: ignore[union-attr]


@contextmanager
def mounted(
    dataset: Path | str,
    mnt: Path,
    *extra: str,
    log_file: Path | None = None,
    launcher: Sequence[str] = (),
    cwd: Path | None = None,
) -> Iterator[Path]:
    """Mount with the real CLI (background daemon, started by ``launcher``, if any, from ``cwd``,
    if any); always unmount, reap the daemon, check its log.

    The daemon must exit on its own once unmounted: one still alive when the wait gives up is
    killed and the test fails, saying what the daemon was doing (a descriptor the test left open on
    the mount, or a daemon that hangs on exit).
    """
    mnt.mkdir(parents=True, exist_ok=True)
    log_file = log_file or mnt.parent / f"{mnt.name}.log"
    result = dlfs("mount", dataset, mnt, "--log-file", log_file, *extra, launcher=launcher, cwd=cwd)
    pid = mount_pid(result)
    try:
        yield mnt
    finally:
        stuck = unmount_and_reap(mnt, pid)
        log_text = log_file.read_text(errors="replace")
        assert "Traceback" not in log_text, log_text
    # Past the finally, so that a failing test reports its own error, not this one.
    assert stuck is None, f"the daemon of {mnt} outlived its unmount: {stuck}"


def daemons_of(mnt: Path) -> list[int]:
    """Processes serving ``mnt`` in the foreground (a background mount's daemon is one), found from
    process arguments alone: nothing here touches the mount, so the kernel caches none of its
    attributes."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if proc.name.isdigit() and os.fsencode(mnt) in argv and b"--foreground" in argv:
                found.append(int(proc.name))
        except OSError:  # the process ended meanwhile
            continue
    return found


def daemon_of(mnt: Path) -> int:
    """The daemon serving ``mnt`` (``daemons_of``)."""
    daemons = daemons_of(mnt)
    assert daemons, f"no daemon serves {mnt}"
    return daemons[0]


def counters_of(mnt: Path) -> Asked:
    """What a wait on ``mnt``'s counters (``mount_stats``) wakes on: nothing signals a change to
    them, so they are asked again, and the wait ends at once when the daemon serving them does."""
    return Asked(daemon_of(mnt))


def mount_stats(mnt: Path) -> dict:
    """The mount's counters now: its ``.dlfs/stats``, a fresh snapshot at every read."""
    return json.loads((mnt / ".dlfs" / "stats").read_bytes())


def kill_daemon(mnt: Path) -> None:
    """Kill the daemon serving ``mnt`` outright, and wait for it to end: the mount stays, answering
    ENOTCONN, as after a crash."""
    pid = daemon_of(mnt)
    os.kill(pid, signal.SIGKILL)
    wait_exited(pid, f"the daemon of {mnt} after SIGKILL")
    try:
        os.listdir(mnt)
    except OSError as dead:
        assert dead.errno == errno.ENOTCONN, dead
    else:
        raise AssertionError(f"{mnt} still answers after its daemon was killed")
