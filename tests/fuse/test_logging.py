"""Where dlfs logs: ``--log-level`` and ``--log-file`` anywhere on the line, and the systemd journal."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

from commands import DLFS, assert_one_line_error, dlfs
from mounts import force_unmount, is_mounted, wait_mounted
from trees import write
from waits import HANG, bound

from dlfs.logs import JournalFormatter

#: A time of day as the plain log format writes it.
TIMESTAMP = re.compile(r"\d\d:\d\d:\d\d")


def tree_with_a_fifo(root: Path) -> Path:
    """A tree whose pack logs a warning: FIFOs are skipped with one."""
    write(root / "file.txt", b"data\n")
    os.mkfifo(root / "fifo")
    return root


def run_logged(*args: str | Path, stderr: Path, env: dict[str, str] | None = None) -> int:
    """Run the CLI with stderr going to the file ``stderr``; its exit status."""
    with open(stderr, "ab") as stream:
        return subprocess.run(
            [*DLFS, *map(str, args)], stderr=stream, stdout=subprocess.DEVNULL, env=env, timeout=120
        ).returncode


def journal_env(stream: Path) -> dict[str, str]:
    """The environment systemd gives a unit whose stderr is the journal: here the file ``stream``."""
    st = os.stat(stream)
    return os.environ | {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}


def test_under_systemd_lines_carry_their_priority_and_no_time_of_their_own(
    packed: Path, tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    journal.touch()
    src = tree_with_a_fifo(tmp_path / "src")
    assert run_logged("-q", "pack", src, tmp_path / "dst", stderr=journal, env=journal_env(journal)) == 0
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with open(journal, "ab") as stream:  # the daemon as a Type=notify unit runs it: in the foreground
        daemon = subprocess.Popen(
            [*DLFS, "mount", packed, mnt, "--foreground"],
            stderr=stream,
            stdout=subprocess.DEVNULL,
            env=journal_env(journal),
        )
    try:
        wait_mounted(mnt, daemon, "the daemon to mount", seconds=60)
        assert is_mounted(mnt), f"the daemon exited {daemon.returncode} before it mounted"
    finally:
        force_unmount(mnt)
        try:
            daemon.wait(timeout=bound(HANG))
        finally:
            daemon.kill()
    lines = journal.read_text().splitlines()
    assert any(line.startswith("<4>dlfs.pack.walk: skipping special file") for line in lines), lines
    assert any(line.startswith("<6>dlfs.fuse.daemon: mounted ") for line in lines), lines
    assert all(re.match(r"<[0-7]>dlfs[.\w]*: ", line) for line in lines), lines
    assert not any(TIMESTAMP.search(line) for line in lines), lines


def test_a_stderr_that_is_not_the_journal_keeps_its_timestamps(tmp_path: Path) -> None:
    """A child of a unit inherits JOURNAL_STREAM even when its stderr goes elsewhere."""
    elsewhere, log = tmp_path / "elsewhere", tmp_path / "log"
    elsewhere.touch()
    src = tree_with_a_fifo(tmp_path / "src")
    assert run_logged("-q", "pack", src, tmp_path / "dst", stderr=log, env=journal_env(elsewhere)) == 0
    warning = [line for line in log.read_text().splitlines() if "skipping special file" in line]
    assert len(warning) == 1 and TIMESTAMP.search(warning[0]) and " WARNING: " in warning[0], warning
    assert not warning[0].startswith("<")


def test_every_line_of_a_record_carries_its_priority() -> None:
    """A traceback spans lines, and the journal takes each line as an entry of its own."""
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("dlfs.x", logging.ERROR, __file__, 1, "failed", None, True)
        record.exc_info = sys.exc_info()
    lines = JournalFormatter().format(record).splitlines()
    assert lines[0] == "<3>dlfs.x: failed" and len(lines) > 2
    assert all(line.startswith("<3>") for line in lines)


def test_log_level_and_log_file_are_taken_before_and_after_the_command(tmp_path: Path) -> None:
    src = tree_with_a_fifo(tmp_path / "src")
    log, stderr = tmp_path / "logs" / "pack.log", tmp_path / "stderr"
    # After the command, and overriding -q: the warning goes to the file (its folder made), not stderr.
    assert (
        run_logged("-q", "pack", src, tmp_path / "a", "--log-file", log, "--log-level", "info", stderr=stderr)
        == 0
    )
    assert "WARNING: skipping special file" in log.read_text()
    assert "skipping" not in stderr.read_text()
    # Before the command: error only, so the warning is not logged at all.
    log.unlink()
    assert (
        run_logged("--log-level", "error", "--log-file", log, "pack", src, tmp_path / "b", stderr=stderr) == 0
    )
    assert "skipping" not in log.read_text() and "skipping" not in stderr.read_text()


def test_a_background_daemon_logs_at_the_level_asked(packed: Path, mount, tmp_path: Path) -> None:
    """``dlfs -q mount``: warnings only, unless ``--log-level`` says otherwise."""
    quiet, informed = tmp_path / "quiet.log", tmp_path / "informed.log"
    with mount(packed, log_file=quiet):
        pass
    with mount(packed, "--log-level", "info", log_file=informed):
        pass
    assert " INFO: " not in quiet.read_text()
    assert "dlfs.fuse.daemon INFO: mounted " in informed.read_text()


def test_an_unwritable_log_file_is_one_line(packed: Path) -> None:
    result = dlfs("ls", packed, "--log-file", "/proc/version/dlfs.log", check=False)
    assert_one_line_error(result, "cannot write the log file /proc/version/dlfs.log")
