"""The mounted tree, checked with the tools users run: diff, find, stat, du, ls, df."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest
from conftest import (
    DLFS,
    SMALL_SHARD,
    assert_one_line_error,
    dlfs,
    find_listing,
    force_unmount,
    is_mounted,
    listing_requests,
    make_odd_tree,
    mount_pid,
    pid_alive,
    wait_until,
    write,
)

from dlfs.fuse import mount as dlfs_mount
from dlfs.fuse import operations as fs


def test_diff_finds_no_difference(packed: Path, odd_tree: Path, mount) -> None:
    with mount(packed) as mnt:
        result = subprocess.run(
            ["diff", "-r", "--no-dereference", odd_tree, mnt], capture_output=True, timeout=120, check=False
        )
        assert result.returncode == 0, result.stdout.decode(errors="replace") + result.stderr.decode()


@pytest.mark.parametrize("readdirplus", ["always", "auto"])
def test_find_sees_the_same_names_types_sizes_modes_mtimes_and_links(
    packed: Path, odd_tree: Path, mount, readdirplus: str
) -> None:
    """``auto`` exercises plain READDIR (names and types only) followed by LOOKUPs for the stats."""
    with mount(packed, "--readdirplus", readdirplus) as mnt:
        assert find_listing(mnt) == find_listing(odd_tree)


def test_stat_matches_source_for_every_entry(packed: Path, odd_tree: Path, mount) -> None:
    with mount(packed) as mnt:
        for src in [odd_tree, *odd_tree.rglob("*")]:
            there = Path(mnt) / src.relative_to(odd_tree)
            a, b = os.lstat(src), os.lstat(there)
            assert (a.st_mode, a.st_size, a.st_mtime_ns, a.st_uid, a.st_gid) == (
                b.st_mode,
                b.st_size,
                b.st_mtime_ns,
                b.st_uid,
                b.st_gid,
            ), src
            if src.is_dir() and not src.is_symlink():
                assert a.st_nlink == b.st_nlink, src


def test_apparent_disk_usage_matches_source(packed: Path, odd_tree: Path, mount) -> None:
    def du(path: Path) -> str:
        out = subprocess.run(
            ["du", "-s", "--apparent-size", "-b", path],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
        return out.split()[0]

    with mount(packed) as mnt:
        assert du(mnt) == du(odd_tree)
        blocks = os.lstat(Path(mnt) / "random.bin").st_blocks
        assert blocks * 512 >= 100_000


def test_ls_long_lists_dot_entries_and_children(packed: Path, mount) -> None:
    with mount(packed) as mnt:
        out = subprocess.run(
            ["ls", "-la", Path(mnt) / "classes"], capture_output=True, text=True, check=True, timeout=30
        ).stdout.splitlines()
        names = [line.split()[-1] for line in out[1:]]
        assert names == [".", "..", "n00000000", "n00000001", "n00000002"]
        assert out[1].startswith("dr-x") or out[1].startswith("drwx")


def test_dot_entries_stat_as_the_directories_they_name(packed: Path, odd_tree: Path, mount) -> None:
    """Listings carry '.' and '..' without attributes (the kernel takes none from them); stat
    through them still gives the directories' own."""
    with mount(packed) as mnt:
        listed = Path(mnt) / "classes" / "n00000001"
        list(os.scandir(listed))  # the first listing on a fresh mount: READDIRPLUS
        for dots, source in ((".", odd_tree / "classes" / "n00000001"), ("..", odd_tree / "classes")):
            got, want = os.stat(listed / dots), os.stat(source)
            assert (got.st_mode, got.st_nlink, got.st_mtime_ns) == (
                want.st_mode,
                want.st_nlink,
                want.st_mtime_ns,
            )


def test_statfs_reports_dataset_size_and_entry_count(packed: Path, mount) -> None:
    with mount(packed) as mnt:
        st = os.statvfs(mnt)
        shards = sum(p.stat().st_size for p in packed.glob("*.shard"))
        assert st.f_blocks * st.f_frsize >= shards
        assert st.f_files > 400
        assert st.f_bavail == 0
        df = subprocess.run(["df", mnt], capture_output=True, text=True, check=True, timeout=30).stdout
        assert "dlfs:" in df


def test_every_write_is_refused_read_only(packed: Path, mount) -> None:
    with mount(packed) as mnt:
        mnt = Path(mnt)
        attempts = [
            lambda: open(mnt / "plain.txt", "ab"),
            lambda: open(mnt / "plain.txt", "r+b"),
            lambda: open(mnt / "new-file", "wb"),
            lambda: os.mkdir(mnt / "new-dir"),
            lambda: os.unlink(mnt / "plain.txt"),
            lambda: os.rename(mnt / "plain.txt", mnt / "renamed"),
            lambda: os.chmod(mnt / "plain.txt", 0o777),
            lambda: os.symlink("x", mnt / "new-link"),
            lambda: os.truncate(mnt / "plain.txt", 0),
        ]
        for attempt in attempts:
            with pytest.raises(OSError) as info:
                attempt()
            assert info.value.errno == errno.EROFS
        assert (mnt / "plain.txt").read_bytes() == b"hello dlfs\n"


def test_hidden_names_and_missing_paths(packed: Path, mount) -> None:
    with mount(packed) as mnt:
        with pytest.raises(FileNotFoundError):
            os.stat(Path(mnt) / "nope")
        with pytest.raises(NotADirectoryError):
            os.listdir(Path(mnt) / "plain.txt")


def test_large_file_over_the_whole_payload_limit_reads_back_by_range(tmp_path: Path, mount) -> None:
    from dlfs.core.format import WHOLE_PAYLOAD_LIMIT

    src = tmp_path / "big-src"
    src.mkdir()
    data = os.urandom(1 << 20) * (WHOLE_PAYLOAD_LIMIT // (1 << 20) + 3)
    (src / "huge.bin").write_bytes(data)
    (src / "small.txt").write_bytes(b"small\n")
    dst = tmp_path / "big-ds"
    dlfs("pack", src, dst, "--shard-size", "16M")
    with mount(dst) as mnt, open(Path(mnt) / "huge.bin", "rb") as f:
        f.seek(len(data) - 5000)
        assert f.read() == data[-5000:]
        f.seek(0)
        assert f.read() == data
    assert dlfs("verify", dst).returncode == 0


def test_random_placement_and_lz4_serve_identical_bytes(odd_tree: Path, tmp_path: Path, mount) -> None:
    dst = tmp_path / "random-lz4"
    dlfs(
        "pack",
        odd_tree,
        dst,
        "--placement",
        "random",
        "--seed",
        "3",
        "--compress",
        "lz4",
        "--shard-size",
        str(SMALL_SHARD),
    )
    with mount(dst) as mnt:
        result = subprocess.run(
            ["diff", "-r", "--no-dereference", odd_tree, mnt], capture_output=True, timeout=120, check=False
        )
        assert result.returncode == 0, result.stdout


def test_many_readers_at_once_get_correct_bytes(packed: Path, odd_tree: Path, mount) -> None:
    from concurrent.futures import ThreadPoolExecutor

    files = [p for p in odd_tree.rglob("*") if p.is_file() and not p.is_symlink()]
    with mount(packed, "--cache-size", "64K") as mnt:

        def same(p: Path) -> bool:
            return (Path(mnt) / p.relative_to(odd_tree)).read_bytes() == p.read_bytes()

        with ThreadPoolExecutor(16) as pool:
            assert all(pool.map(same, files * 3))


def test_special_files_are_skipped_with_a_warning(tmp_path: Path, mount) -> None:
    import socket

    src = tmp_path / "special"
    src.mkdir()
    (src / "regular").write_bytes(b"x")
    os.mkfifo(src / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(src / "socket"))
    try:
        result = subprocess.run(
            [*DLFS, "pack", src, tmp_path / "special-ds"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        sock.close()
    assert result.returncode == 0, result.stderr
    assert "skipping special file" in result.stderr and "skipped 2 special" in result.stdout
    with mount(tmp_path / "special-ds") as mnt:
        assert os.listdir(mnt) == ["regular"]


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


def _daemon_of(mnt: Path) -> int:
    """The daemon serving ``mnt``, found from process arguments alone: nothing here touches the
    mount, so the kernel caches none of its attributes."""
    daemons = _daemons_of(mnt)
    assert daemons, f"no daemon serves {mnt}"
    return daemons[0]


def _daemons_of(mnt: Path) -> list[int]:
    """Processes serving ``mnt`` in the foreground (a background mount's daemon is one)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if proc.name.isdigit() and os.fsencode(mnt) in argv and b"--foreground" in argv:
                found.append(int(proc.name))
        except OSError:  # the process ended meanwhile
            continue
    return found


def _killed(mnt: Path) -> None:
    """Kill the daemon serving ``mnt``: the mount stays, answering ENOTCONN."""
    pid = _daemon_of(mnt)
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not os.path.exists(f"/proc/{pid}"), 10)
    with pytest.raises(OSError) as dead:
        os.listdir(mnt)
    assert dead.value.errno == errno.ENOTCONN


def test_a_mount_whose_daemon_died_is_unmounted_with_a_word_why(packed: Path, mount) -> None:
    with mount(packed) as mnt:
        _killed(mnt)
        result = dlfs("umount", mnt)
        assert "daemon that died" in result.stderr and "Transport endpoint is not connected" in result.stderr
        assert os.listdir(mnt) == []


def test_a_mount_on_a_mountpoint_whose_daemon_died_takes_it_over(packed: Path, odd_tree: Path, mount) -> None:
    with mount(packed) as mnt:
        _killed(mnt)
        log_file = mnt.parent / "again.log"
        result = dlfs("mount", packed, mnt, "--log-file", log_file)
        try:
            assert (mnt / "plain.txt").read_bytes() == (odd_tree / "plain.txt").read_bytes()
            assert "whose daemon died" in log_file.read_text()
        finally:
            dlfs("umount", mnt)
            assert wait_until(lambda: not pid_alive(mount_pid(result)), 15)


def test_a_mount_not_ready_in_time_is_stopped_and_says_what_to_do(packed: Path, tmp_path: Path) -> None:
    """A daemon still loading its index when ``--ready-timeout`` runs out is stopped: nothing is
    left behind, and the error names the flag (a slow volume needs more time, not a retry)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = dlfs("mount", packed, mnt, "--ready-timeout", "0.001", check=False)
    assert_one_line_error(result, "not ready after 0.001 s", "--ready-timeout")
    assert not is_mounted(mnt) and os.listdir(mnt) == [] and _daemons_of(mnt) == []


def test_a_daemon_stopped_after_it_mounted_leaves_no_dead_mount(packed: Path, tmp_path: Path) -> None:
    """The timeout can fall between the daemon's mount and its word that it is ready: stopping it
    then must remove the mount too, which would otherwise answer everything with ENOTCONN."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    command = [*DLFS, "mount", str(packed), str(mnt), "--foreground"]
    child = subprocess.Popen(command, stderr=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: is_mounted(mnt), 30)
        dlfs_mount._stop(child, str(mnt))
        assert not is_mounted(mnt) and os.listdir(mnt) == []
    finally:
        child.kill()
        child.wait()
        force_unmount(mnt)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGKILL])
def test_a_mount_given_up_while_starting_leaves_nothing_behind(packed: Path, tmp_path: Path, signum) -> None:
    """Ctrl-C on a ``dlfs mount`` still waiting for its daemon stops the daemon too; a ``dlfs mount``
    killed outright leaves a daemon that finds nobody to tell it is ready, and unmounts."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    command = [*DLFS, "mount", str(packed), str(mnt), "--log-file", str(tmp_path / "log")]
    # A shell starts background jobs with SIGINT ignored, and an ignored signal stays ignored in
    # children: give dlfs mount the default disposition, as a terminal's Ctrl-C finds it.
    parent = subprocess.Popen(
        command,
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert wait_until(lambda: _daemons_of(mnt) != [], 30), "no daemon started"
        parent.send_signal(signum)
        parent.wait(timeout=30)
        assert wait_until(lambda: _daemons_of(mnt) == [], 30), "the daemon stayed"
        assert not is_mounted(mnt) and os.listdir(mnt) == []
    finally:
        parent.kill()
        parent.wait()
        for pid in _daemons_of(mnt):
            os.kill(pid, signal.SIGKILL)
        force_unmount(mnt)


def test_mount_of_a_non_dataset_is_refused(tmp_path: Path) -> None:
    (tmp_path / "mnt").mkdir()
    (tmp_path / "not-a-dataset").mkdir()
    result = dlfs("mount", tmp_path / "not-a-dataset", tmp_path / "mnt", check=False)
    assert_one_line_error(result, "not a dlfs dataset", "dlfs pack")


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


def test_unicode_and_non_utf8_names_survive(tmp_path: Path, mount) -> None:
    src = make_odd_tree(tmp_path / "names")
    dst = tmp_path / "names-ds"
    dlfs("pack", src, dst)
    with mount(dst) as mnt:
        names = set(os.listdir(os.fsencode(mnt)))
        assert b"non-utf8-\xff\xfe.bin" in names
        assert "ünïcødé-名前.txt".encode() in names
        assert b"new\nline.txt" in names
        assert (Path(mnt) / "new\nline.txt").read_bytes() == b"newline in name\n"


def test_a_class_folder_is_listed_in_one_round_trip_and_one_to_find_its_end(tmp_path: Path, mount) -> None:
    """Directories report a 1 MiB block size: glibc's opendir takes it as its getdents buffer, and
    the kernel sizes each READDIR by that buffer. With the default 4 KiB, a thousand entries with
    attributes took seven requests. (With ``--readdirplus always``: under ``auto`` a listing of the
    whole tree is followed by the daemon's own listing with attributes, in the background.)"""
    names = {f"n01440764_{k:05d}.JPEG" for k in range(1000)}
    for name in names:
        write(tmp_path / "src" / "n01440764" / name, b"x")
    dlfs("pack", tmp_path / "src", tmp_path / "ds")
    with mount(tmp_path / "ds", "--readdirplus", "always") as mnt:
        folder = Path(mnt) / "n01440764"
        assert folder.stat().st_blksize == fs.LISTING_BLOCK
        assert (folder / "n01440764_00000.JPEG").stat().st_blksize == fs.STATFS_BLOCK
        before = listing_requests(Path(mnt))
        assert set(os.listdir(folder)) == names
        assert listing_requests(Path(mnt)) - before == 2


@pytest.mark.parametrize("readdirplus", ["always", "auto"])
def test_a_folder_walked_by_name_is_listed_so_later_opens_skip_the_daemon(
    tmp_path: Path, mount, readdirplus: str
) -> None:
    """Opening files by name (a file list) with nothing cached: after a few LOOKUPs in a folder the
    daemon lists it through the mount, and the kernel answers the rest of the walk itself. Only
    LOOKUPs that reach Python count (the native request server answers them in C, at a fraction of
    the cost, without listing), so this runs with Python answering every request."""
    names = [f"n01440764_{k:05d}.JPEG" for k in range(200)]
    for name in names:
        write(tmp_path / "src" / "cls" / name, name.encode())
    dlfs("pack", tmp_path / "src", tmp_path / "ds")
    with mount(tmp_path / "ds", "--readdirplus", readdirplus, "--native-threads", "0") as mnt:
        folder = Path(mnt) / "cls"

        def stats() -> dict:
            return json.loads((Path(mnt) / ".dlfs" / "stats").read_text())

        for name in names[:4]:
            assert (folder / name).read_bytes() == name.encode()
        assert wait_until(lambda: stats()["listed_folders"] == 1, 10), stats()
        before = stats()["requests"]
        for name in names[4:]:
            assert (folder / name).read_bytes() == name.encode()
        after = stats()["requests"]
    # Reading .dlfs/stats looks up '.dlfs' and 'stats' each time (control entries never stay cached),
    # and 'stats' twice: the kernel revalidates its old entry, meets a new snapshot's inode and looks
    # the name up again.
    assert after["lookup"] - before["lookup"] == 3, "the listing taught the kernel every file"
    assert after["readdir"] == before["readdir"]


@pytest.mark.parametrize("readdirplus", ["always", "auto"])
def test_directory_larger_than_one_listing_buffer_lists_every_entry_once(
    tmp_path: Path, mount, readdirplus: str
) -> None:
    src = tmp_path / "wide"
    names = {f"{'long-name-' * 6}{k:05d}.JPEG" for k in range(8000)}  # over 1 MiB of records
    for name in names:
        write(src / "cls" / name, name.encode())
    (src / "cls" / "sub").mkdir()
    dst = tmp_path / "wide-ds"
    dlfs("pack", src, dst)
    with mount(dst, "--readdirplus", readdirplus) as mnt:
        listed = os.listdir(Path(mnt) / "cls")
        assert len(listed) == len(names) + 1 and set(listed) == names | {"sub"}
        assert listing_requests(Path(mnt)) >= 3, "the listing took more than one reply"
        kinds = {entry.name: entry.is_dir(follow_symlinks=False) for entry in os.scandir(Path(mnt) / "cls")}
        assert kinds["sub"] and not any(kinds[name] for name in names)
        long = subprocess.run(
            ["ls", "-l", Path(mnt) / "cls"], capture_output=True, text=True, check=True, timeout=60
        ).stdout.splitlines()
        assert len(long) == len(names) + 2  # 'total' line and sub


def test_a_plain_fusermount_right_after_an_epoch_is_announced_is_not_busy(tmp_path: Path) -> None:
    """Announcing an epoch sets the read-ahead listing folders through the mount (after a scan, it
    lists the whole tree again): the daemon's own open folders must not make an unmount busy."""
    for c in range(300):
        for k in range(30):
            write(tmp_path / "src" / f"c{c:04d}" / f"f{k}", b"x" * 2000)
    dlfs("pack", tmp_path / "src", tmp_path / "ds")
    for attempt in range(3):
        mnt = tmp_path / f"mnt{attempt}"
        mnt.mkdir()
        pid = mount_pid(dlfs("mount", tmp_path / "ds", mnt, "--log-file", tmp_path / f"{attempt}.log"))
        try:
            subprocess.run(["find", mnt], capture_output=True, check=True, timeout=60)
            (mnt / ".dlfs" / "order" / "epoch-0").read_bytes()
            result = subprocess.run(["fusermount3", "-u", mnt], capture_output=True, text=True, timeout=30)
            assert result.returncode == 0, result.stderr
            assert wait_until(lambda pid=pid: not pid_alive(pid), 15)
        finally:
            force_unmount(mnt)


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
        assert wait_until(lambda: not pid_alive(pid), 15), "the daemon stayed"
        assert not is_mounted(mnt) and os.listdir(mnt) == []
        assert "Traceback" not in log.read_text()
    finally:
        force_unmount(mnt)
