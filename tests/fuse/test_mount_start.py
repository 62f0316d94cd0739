"""A mount starting: the mountpoints it refuses, a mountpoint whose daemon died before, a daemon not
ready in time, and a ``dlfs mount`` given up (Ctrl-C, or killed) before its daemon was ready.
Nothing may be left behind: no daemon, and no dead mount."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
from commands import DLFS, assert_one_line_error, dlfs
from mounts import daemons_of, force_unmount, is_mounted, kill_daemon, mount_pid, wait_mounted
from waits import HANG, Asked, bound, wait_exited, wait_for

from dlfs.fuse import mount as dlfs_mount


def test_mount_is_refused_at_bad_mountpoints(packed: Path, tmp_path: Path, mount) -> None:
    assert_one_line_error(dlfs("mount", packed, tmp_path / "missing", check=False), "does not exist")
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    assert_one_line_error(dlfs("mount", packed, full, check=False), "not empty")
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    assert_one_line_error(dlfs("mount", packed, a_file, check=False), "not a directory")
    with mount(packed) as mnt:
        assert_one_line_error(dlfs("mount", packed, mnt, check=False), "already a mount point")


def test_mount_of_a_non_dataset_is_refused(tmp_path: Path) -> None:
    (tmp_path / "mnt").mkdir()
    (tmp_path / "not-a-dataset").mkdir()
    result = dlfs("mount", tmp_path / "not-a-dataset", tmp_path / "mnt", check=False)
    assert_one_line_error(result, "not a dlfs dataset", "dlfs pack")


def test_a_mount_on_a_mountpoint_whose_daemon_died_takes_it_over(packed: Path, odd_tree: Path, mount) -> None:
    with mount(packed) as mnt:
        kill_daemon(mnt)
        log_file = mnt.parent / "again.log"
        result = dlfs("mount", packed, mnt, "--log-file", log_file)
        try:
            assert (mnt / "plain.txt").read_bytes() == (odd_tree / "plain.txt").read_bytes()
            assert "whose daemon died" in log_file.read_text()
        finally:
            dlfs("umount", mnt)
            wait_exited(mount_pid(result), "the daemon that took the mountpoint over, after dlfs umount")


def test_a_mount_not_ready_in_time_is_stopped_and_says_what_to_do(packed: Path, tmp_path: Path) -> None:
    """A daemon still loading its index when ``--ready-timeout`` runs out is stopped: nothing is
    left behind, and the error names the flag (a slow volume needs more time, not a retry)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = dlfs("mount", packed, mnt, "--ready-timeout", "0.001", check=False)
    assert_one_line_error(result, "not ready after 0.001 s", "--ready-timeout")
    assert not is_mounted(mnt) and os.listdir(mnt) == [] and daemons_of(mnt) == []


def test_a_daemon_stopped_after_it_mounted_leaves_no_dead_mount(packed: Path, tmp_path: Path) -> None:
    """The timeout can fall between the daemon's mount and its word that it is ready: stopping it
    then must remove the mount too, which would otherwise answer everything with ENOTCONN."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    command = [*DLFS, "mount", str(packed), str(mnt), "--foreground"]
    child = subprocess.Popen(command, stderr=subprocess.DEVNULL)
    try:
        wait_mounted(mnt, child, "the foreground daemon to mount")
        assert is_mounted(mnt), f"the daemon exited {child.returncode} before it mounted"
        dlfs_mount._stop(child, str(mnt))
        assert not is_mounted(mnt) and os.listdir(mnt) == []
    finally:
        child.kill()
        child.wait()
        force_unmount(mnt)


@contextmanager
def _log_that_holds_its_writers(path: Path) -> Iterator[int]:
    """A FIFO at ``path`` whose buffer is full, held open for reading: a process that logs to it
    waits in its first write until the test drains it (``_drain``). Yields the read end."""
    os.mkfifo(path)
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    writer = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    try:
        with suppress(BlockingIOError):
            while True:  # a byte at a time: the last page of the buffer fills too
                os.write(writer, b"\n")
    finally:
        os.close(writer)
    try:
        yield reader
    finally:
        os.close(reader)


def _drain(reader: int) -> threading.Thread:
    """Read the FIFO on a thread until its last writer is gone: its writers go on."""
    os.set_blocking(reader, True)

    def read_to_the_end() -> None:
        while os.read(reader, 1 << 16):
            pass

    thread = threading.Thread(target=read_to_the_end, daemon=True)
    thread.start()
    return thread


def _sleeps_in(pid: int, *functions: str) -> bool:
    """Whether process ``pid``'s main thread sleeps in the kernel in a function whose name holds one
    of ``functions`` (names vary between kernels: ``pipe_write`` is ``anon_pipe_write`` in 6.18)."""
    try:
        where = Path(f"/proc/{pid}/wchan").read_text()
    except OSError:  # gone
        return False
    return any(function in where for function in functions)


def _children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGKILL])
def test_a_mount_given_up_while_starting_leaves_nothing_behind(packed: Path, tmp_path: Path, signum) -> None:
    """Ctrl-C on a ``dlfs mount`` still waiting for its daemon stops the daemon too; a ``dlfs mount``
    killed outright leaves a daemon that finds nobody to tell it is ready, and unmounts.

    The daemon must still be starting when the signal comes: its log is a FIFO kept full, so it
    waits in its first log line (before it loads the index) until the test drains the FIFO, and the
    signal goes once it sleeps there and ``dlfs mount`` sleeps waiting for it."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    log = tmp_path / "log"
    with _log_that_holds_its_writers(log) as reader:
        # A shell starts background jobs with SIGINT ignored, and an ignored signal stays ignored in
        # children: give dlfs mount the default disposition, as a terminal's Ctrl-C finds it.
        parent = subprocess.Popen(
            [*DLFS, "mount", str(packed), str(mnt), "--log-file", str(log)],
            stderr=subprocess.DEVNULL,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        daemons: list[int] = []

        def held() -> bool:
            assert parent.poll() is None, f"dlfs mount exited {parent.returncode} while starting"
            daemons[:] = _children(parent.pid)
            waiting = _sleeps_in(parent.pid, "poll_schedule_timeout", "do_select", "do_sys_poll")
            return waiting and len(daemons) == 1 and _sleeps_in(daemons[0], "pipe_write")

        try:
            wait_for(held, "dlfs mount waiting for a daemon held at its first log line", Asked(parent.pid))
            daemon = daemons[0]
            parent.send_signal(signum)
            if signum == signal.SIGINT:  # dlfs mount stops its daemon, which never gets further
                wait_exited(daemon, "the daemon after Ctrl-C on dlfs mount")
                drained = _drain(reader)
                assert parent.wait(timeout=bound(HANG)) == 130
            else:  # the daemon, let go, mounts and finds nobody to tell
                parent.wait(timeout=bound(HANG))
                drained = _drain(reader)
                wait_exited(daemon, "the daemon after dlfs mount was killed")
            drained.join(bound(HANG))
            assert not is_mounted(mnt) and os.listdir(mnt) == []
        finally:
            parent.kill()
            parent.wait()
            for pid in daemons_of(mnt):
                os.kill(pid, signal.SIGKILL)
            force_unmount(mnt)
