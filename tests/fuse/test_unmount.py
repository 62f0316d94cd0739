"""A mount ending: ``dlfs umount`` (busy for a moment, kept busy, or of a mount whose daemon died),
a plain fusermount3 while the daemon lists folders through its own view of the mount, and the
signals systemd and terminals send. The daemon must exit and leave an empty mountpoint each time."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest
from commands import assert_one_line_error, dlfs
from mounts import force_unmount, is_mounted, kill_daemon, mount_pid
from trees import write
from waits import alive, wait_exited


def test_a_mount_whose_daemon_died_is_unmounted_with_a_word_why(packed: Path, mount) -> None:
    with mount(packed) as mnt:
        kill_daemon(mnt)
        result = dlfs("umount", mnt)
        assert "daemon that died" in result.stderr and "Transport endpoint is not connected" in result.stderr
        assert os.listdir(mnt) == []


def test_umount_of_something_not_mounted_says_so(tmp_path: Path) -> None:
    assert_one_line_error(dlfs("umount", tmp_path, check=False), "not mounted")


def test_umount_command_unmounts_and_the_daemon_exits(packed: Path, tmp_path: Path, mount) -> None:
    with mount(packed) as mnt:
        dlfs("umount", mnt)
        assert os.listdir(mnt) == []


def test_umount_waits_out_a_moment_of_busy(packed: Path, tmp_path: Path, mount) -> None:
    """The read-ahead lists directories through the mount for milliseconds at a time; an unmount
    that lands then must not fail. Held for a quarter second here, then released."""
    with mount(packed) as mnt:
        fd = os.open(mnt / "many", os.O_RDONLY | os.O_DIRECTORY)
        threading.Timer(0.25, os.close, (fd,)).start()
        dlfs("umount", mnt)
        assert os.listdir(mnt) == []


def test_umount_of_a_mount_kept_busy_says_what_to_do(packed: Path, tmp_path: Path, mount) -> None:
    with mount(packed) as mnt:
        fd = os.open(mnt / "many", os.O_RDONLY | os.O_DIRECTORY)
        sleeper = subprocess.Popen(["sleep", "60"], cwd=mnt / "many")
        try:
            result = dlfs("umount", mnt, check=False)
            named = (f"pid {os.getpid()} (", f"pid {sleeper.pid} (sleep)")
            assert_one_line_error(result, "busy", "--lazy", *named)
        finally:
            sleeper.kill()
            sleeper.wait()
            os.close(fd)


def test_a_plain_fusermount_right_after_an_epoch_is_announced_is_not_busy(tmp_path: Path) -> None:
    """Announcing an epoch sets the read-ahead listing folders through the mount (after a scan, it
    lists the whole tree again): the daemon's own open folders must not make an unmount busy."""
    for c in range(300):
        for k in range(30):
            write(tmp_path / "src" / f"c{c:04d}" / f"f{k}", b"x" * 2000)
    dlfs("pack", tmp_path / "src", tmp_path / "ds")
    for attempt in range(3):  # the listings race the unmount: a few tries, each a fresh mount
        mnt = tmp_path / f"mnt{attempt}"
        mnt.mkdir()
        pid = mount_pid(dlfs("mount", tmp_path / "ds", mnt, "--log-file", tmp_path / f"{attempt}.log"))
        try:
            subprocess.run(["find", mnt], capture_output=True, check=True, timeout=60)
            (mnt / ".dlfs" / "order" / "epoch-0").read_bytes()
            result = subprocess.run(["fusermount3", "-u", mnt], capture_output=True, text=True, timeout=30)
            assert result.returncode == 0, result.stderr
            wait_exited(pid, "the daemon after fusermount3 -u")
        finally:
            force_unmount(mnt)
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_the_daemon_unmounts_cleanly(packed: Path, tmp_path: Path, signum: int) -> None:
    """systemd stops with SIGTERM, a terminal with SIGINT or SIGHUP: each unmounts and the daemon
    exits, leaving an empty mountpoint and no error in its log."""
    mnt, log = tmp_path / "mnt", tmp_path / "daemon.log"
    mnt.mkdir()
    pid = mount_pid(dlfs("mount", packed, mnt, "--log-file", log))
    try:
        assert (mnt / "many").is_dir()
        os.kill(pid, signum)
        wait_exited(pid, f"the daemon after {signal.Signals(signum).name}")
        assert not is_mounted(mnt) and os.listdir(mnt) == []
        assert "Traceback" not in log.read_text()
    finally:
        force_unmount(mnt)
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
