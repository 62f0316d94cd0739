"""Faults under load: the daemon killed while 16 readers are mid-read, an unmount asked for while
reads are in flight, and the mount's memory budgets against the memory the daemon may take (the
machine's, or a cgroup's limit). Readers run in processes (``soak_reader.py``) with timeouts, so a
hang fails the test instead of stalling it."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from commands import DLFS, assert_one_line_error, dlfs
from footprint import peak_resident
from mounts import counters_of, daemon_of, is_mounted, mount_pid, mount_stats, mounted, unmount_and_reap
from readers import finish_readers, start_readers
from waits import Changes, alive, wait_exited, wait_for

from dlfs.core import memory

pytestmark = pytest.mark.timeout(240)


def _reads_answered(mnt: Path) -> int:
    stats = mount_stats(mnt)
    return stats["requests"].get("read", 0) + ((stats.get("native") or {}).get("answered", {}).get("read", 0))


def _wait_reading(mnt: Path, reads: int) -> None:
    """Until the readers are under way: ``reads`` more READs reached the daemon from now."""
    start = _reads_answered(mnt)
    wait_for(
        lambda: _reads_answered(mnt) >= start + reads, f"the readers' first {reads} READs", counters_of(mnt)
    )


def test_sigkill_with_16_readers_mid_read_fails_each_at_once_and_a_new_mount_recovers(
    soak_dataset: tuple[Path, Path], tmp_path: Path
) -> None:
    dataset, expected = soak_dataset
    work = tmp_path / "work"
    died_at = work / "died-at"
    with mounted(dataset, tmp_path / "mnt") as mnt:
        pid = daemon_of(mnt)
        jobs = [[{"role": "until-error", "seed": 4 * p + t} for t in range(4)] for p in range(4)]
        readers = start_readers(mnt, expected, work, jobs, died_at=str(died_at))
        _wait_reading(mnt, 500)
        (work / "died-at.tmp").write_text(repr(time.time()))
        (work / "died-at.tmp").rename(died_at)
        os.kill(pid, signal.SIGKILL)
        results = finish_readers(readers, 30)  # a reader still blocked then fails the test
        assert len(results) == 16
        for result in results:
            assert result["files"] > 0 and result["mismatches"] == 0, result
            # ECONNABORTED: the kernel's answer to a request in flight when the connection died.
            assert result["errno"] in (errno.ENOTCONN, errno.ECONNABORTED, errno.EIO), result
            assert result["after_death"] < 5, result
        again = dlfs("mount", dataset, mnt, "--log-file", tmp_path / "again.log")
        try:
            assert "whose daemon died" in (tmp_path / "again.log").read_text()
            for relpath, (size, _) in list(json.loads(expected.read_text()).items())[:50]:
                assert (mnt / relpath).stat().st_size == size
            survivors = start_readers(
                mnt, expected, tmp_path / "again", [[{"role": "random", "seed": 7}]], deadline=time.time() + 3
            )
            assert finish_readers(survivors, 30)[0]["error_count"] == 0
        finally:
            dlfs("umount", mnt)
            wait_exited(mount_pid(again), "the second daemon after dlfs umount")


def test_umount_while_reads_are_in_flight_is_refused_busy_and_lazy_detaches(
    soak_dataset: tuple[Path, Path], tmp_path: Path
) -> None:
    """16 reader threads in 4 processes keep files open: a plain unmount is refused in one line
    naming them; ``--lazy`` detaches at once, reads of files already open finish with the right
    bytes, new opens find the empty mountpoint (ENOENT), and the daemon exits once the last file is
    closed. Nothing hangs: the refusal and the detaching both come while the readers still read,
    so neither waited for their files."""
    dataset, expected = soak_dataset
    with mounted(dataset, tmp_path / "mnt") as mnt:
        pid = daemon_of(mnt)
        jobs = [[{"role": "random", "seed": 4 * p + t} for t in range(4)] for p in range(4)]
        readers = start_readers(mnt, expected, tmp_path / "work", jobs, deadline=time.time() + 20)
        _wait_reading(mnt, 500)
        busy = dlfs("umount", mnt, check=False, timeout=60)
        assert_one_line_error(busy, "busy", "--lazy", "used by pid", "(python")
        assert all(process.poll() is None for process, _ in readers), "the refusal waited for the readers"
        assert is_mounted(mnt)
        dlfs("umount", "--lazy", mnt, timeout=60)
        assert not is_mounted(mnt)
        assert all(process.poll() is None for process, _ in readers), (
            "the lazy unmount waited for the readers"
        )
        results = finish_readers(readers, 60)
        for result in results:
            assert result["files"] > 0 and result["mismatches"] == 0, result
            assert set(result.get("errnos", {})) <= {str(errno.ENOENT)}, result
        wait_exited(pid, "the daemon after its mount was detached and the last file closed")


def test_budgets_larger_than_the_machine_are_clamped_at_mount_with_one_line(
    soak_dataset: tuple[Path, Path], tmp_path: Path
) -> None:
    dataset, _ = soak_dataset
    huge = memory.available().bytes * 4
    log_file = tmp_path / "mnt.log"
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = dlfs("mount", dataset, mnt, "--log-file", log_file, "--ram-cache-size", str(huge))
    try:
        warnings = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(warnings) == 1 and "--ram-cache-size" in warnings[0] and "MemAvailable" in warnings[0], (
            warnings
        )
        assert warnings[0].split("dlfs: warning: ")[1] in log_file.read_text()
        cache = mount_stats(mnt)["ram_cache"]
        assert 0 < cache["budget"] <= memory.available().bytes, cache
    finally:
        dlfs("umount", mnt)
        wait_exited(mount_pid(result), "the daemon after dlfs umount")


#: 16 reader threads in 4 processes: two published orders and two at random in each.
MIXED_READERS = [
    [
        {"role": "order", "epoch": 0, "world": 1, "rank": 0, "worker": p, "workers": 4},
        {"role": "order", "epoch": 1, "world": 1, "rank": 0, "worker": p, "workers": 4},
        {"role": "random", "seed": 2 * p},
        {"role": "random", "seed": 2 * p + 1},
    ]
    for p in range(4)
]

#: The memory limit of the daemon's cgroup: its default budgets (768 MiB) and read buffers
#: (128 MiB) would take it several times over.
CGROUP_LIMIT = 256 << 20


def _memory_hierarchy() -> tuple[Path, str, str] | None:
    """Where to make a memory cgroup here: (parent, limit file, OOM events file). cgroup v2 where
    its root hands children the memory controller, else the v1 memory hierarchy (this machine's)."""
    root = Path("/sys/fs/cgroup")
    if "memory" in _text(root / "cgroup.subtree_control").split():
        return root, "memory.max", "memory.events"
    if (root / "memory" / "cgroup.procs").exists():
        return root / "memory", "memory.limit_in_bytes", "memory.oom_control"
    return None


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


@pytest.fixture
def memory_cgroup() -> Iterator[tuple[Path, str]]:
    """A memory cgroup of this test's own, limited to ``CGROUP_LIMIT``: (its folder, its OOM events
    file). Removed once its processes are gone."""
    hierarchy = _memory_hierarchy()
    if os.geteuid() != 0 or hierarchy is None:
        pytest.skip("needs root and a cgroup memory controller (v1, or v2 with memory delegated)")
    parent, limit, events = hierarchy
    group = parent / f"dlfs-test-{uuid.uuid4().hex[:12]}"
    group.mkdir()
    try:
        (group / limit).write_text(str(CGROUP_LIMIT))
        yield group, events
    finally:
        # cgroup.events is written when the group empties ("populated 0"): a change inotify reports.
        wait_for(
            lambda: not _text(group / "cgroup.procs").strip(),
            f"the processes of {group} to end",
            Changes(group / "cgroup.events", group / "tasks"),
        )
        group.rmdir()


def test_under_a_cgroup_memory_limit_the_daemon_fits_its_budgets_and_is_not_oom_killed(
    soak_dataset: tuple[Path, Path], tmp_path: Path, memory_cgroup: tuple[Path, str]
) -> None:
    """The daemon runs in a cgroup of 256 MiB with its default budgets: it says it clamped them,
    then serves 16 readers for 15 s, in two published orders and at random, every READ through
    Python and its RAM cache (``--native-threads 0``, so that the cache fills), without an
    error, a wrong byte or an OOM kill."""
    dataset, expected = soak_dataset
    group, events = memory_cgroup
    mnt, log_file = tmp_path / "mnt", tmp_path / "mnt.log"
    mnt.mkdir()
    command = [*DLFS, "-q", "mount", dataset, mnt, "--log-file", log_file, "--native-threads", "0"]
    enter = f'echo $$ > {group}/cgroup.procs && exec "$@"'  # the daemon, its child, stays in
    result = subprocess.run(
        ["sh", "-c", enter, "sh", *map(str, command)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    pid = mount_pid(result)
    try:
        warnings = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(warnings) == 1 and f"cgroup {group}" in warnings[0], warnings
        assert str(pid) in _text(group / "cgroup.procs").split()
        readers = start_readers(mnt, expected, tmp_path / "work", MIXED_READERS, deadline=time.time() + 15)
        results = finish_readers(readers, 90)
        assert sum(r["error_count"] for r in results) == 0, [e for r in results for e in r["errors"]]
        assert sum(r["files"] for r in results) > 1000
        assert alive(pid)
        assert re.search(r"^oom_kill 0$", _text(group / events), re.MULTILINE), _text(group / events)
        cache = mount_stats(mnt)["ram_cache"]
        assert cache["budget"] < CGROUP_LIMIT // 4, cache
    finally:
        stuck = unmount_and_reap(mnt, pid)
        assert "Traceback" not in log_file.read_text()
    assert stuck is None, f"the daemon outlived the unmount: {stuck}"


def test_memory_limit_bounds_the_daemons_resident_memory_under_load(
    soak_dataset: tuple[Path, Path], tmp_path: Path
) -> None:
    """16 readers for 10 s, in two published orders and at random, every READ through Python and
    its RAM cache (``--native-threads 0``) so that the cache fills: the daemon's peak resident
    memory stays within ``--memory-limit``, and the mount says which budgets it fitted to it."""
    dataset, expected = soak_dataset
    limit = 320 << 20
    mnt, log_file = tmp_path / "mnt", tmp_path / "mnt.log"
    mnt.mkdir()
    result = dlfs(
        "mount", dataset, mnt, "--log-file", log_file, "--native-threads", "0", "--memory-limit", "320MiB"
    )
    pid = mount_pid(result)
    try:
        warnings = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(warnings) == 1 and "--memory-limit 320M" in warnings[0], warnings
        readers = start_readers(mnt, expected, tmp_path / "work", MIXED_READERS, deadline=time.time() + 10)
        results = finish_readers(readers, 90)
        assert sum(r["error_count"] for r in results) == 0, [e for r in results for e in r["errors"]]
        stats = mount_stats(mnt)
        assert stats["ram_cache"]["evictions"] > 0, stats["ram_cache"]  # it filled, and more
        peak = peak_resident(pid)
        assert peak <= limit, f"peak RSS {peak >> 20} MiB over --memory-limit {limit >> 20} MiB"
    finally:
        stuck = unmount_and_reap(mnt, pid)
        assert "Traceback" not in log_file.read_text()
    assert stuck is None, f"the daemon outlived the unmount: {stuck}"
