"""Directory listings through the mount: dot entries, how many requests a listing takes, and the
listings the daemon makes itself so that the kernel answers later lookups."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from mounts import counters_of, mount_stats
from trees import write
from waits import wait_for

from dlfs.fuse import operations as fs


def listing_requests(mnt: Path) -> int:
    """READDIR and READDIRPLUS requests the mount answered so far: in Python (``requests``) and in
    the native request server's C threads (``native``)."""
    stats = mount_stats(mnt)
    native = (stats.get("native") or {}).get("answered", {})
    return stats["requests"].get("readdir", 0) + native.get("readdir", 0) + native.get("readdirplus", 0)


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


def test_a_class_folder_is_listed_in_one_round_trip_and_one_to_find_its_end(
    tmp_path: Path, pack_and_mount
) -> None:
    """Directories report a 1 MiB block size: glibc's opendir takes it as its getdents buffer, and
    the kernel sizes each READDIR by that buffer. With the default 4 KiB, a thousand entries with
    attributes took seven requests. (With ``--readdirplus always``: under ``auto`` a listing of the
    whole tree is followed by the daemon's own listing with attributes, in the background.)"""
    names = {f"n01440764_{k:05d}.JPEG" for k in range(1000)}
    for name in names:
        write(tmp_path / "src" / "n01440764" / name, b"x")
    with pack_and_mount(tmp_path / "src", "--readdirplus", "always") as mnt:
        folder = mnt / "n01440764"
        assert folder.stat().st_blksize == fs.LISTING_BLOCK
        assert (folder / "n01440764_00000.JPEG").stat().st_blksize == fs.STATFS_BLOCK
        before = listing_requests(mnt)
        assert set(os.listdir(folder)) == names
        assert listing_requests(mnt) - before == 2


@pytest.mark.parametrize("readdirplus", ["always", "auto"])
def test_a_folder_walked_by_name_is_listed_so_later_opens_skip_the_daemon(
    tmp_path: Path, pack_and_mount, readdirplus: str
) -> None:
    """Opening files by name (a file list) with nothing cached: after a few LOOKUPs in a folder the
    daemon lists it through the mount, and the kernel answers the rest of the walk itself. Only
    LOOKUPs that reach Python count (the native request server answers them in C, at a fraction of
    the cost, without listing), so this runs with Python answering every request."""
    names = [f"n01440764_{k:05d}.JPEG" for k in range(200)]
    for name in names:
        write(tmp_path / "src" / "cls" / name, name.encode())
    with pack_and_mount(tmp_path / "src", "--readdirplus", readdirplus, "--native-threads", "0") as mnt:
        folder = mnt / "cls"
        for name in names[:4]:
            assert (folder / name).read_bytes() == name.encode()
        wait_for(
            lambda: mount_stats(mnt)["listed_folders"] == 1,
            "the daemon's listing of the folder",
            counters_of(mnt),
        )
        before = mount_stats(mnt)["requests"]
        for name in names[4:]:
            assert (folder / name).read_bytes() == name.encode()
        after = mount_stats(mnt)["requests"]
    # Reading .dlfs/stats looks up '.dlfs' and 'stats' each time (control entries never stay cached),
    # and 'stats' twice: the kernel revalidates its old entry, meets a new snapshot's inode and looks
    # the name up again.
    assert after["lookup"] - before["lookup"] == 3, "the listing taught the kernel every file"
    assert after["readdir"] == before["readdir"]


@pytest.mark.parametrize("readdirplus", ["always", "auto"])
def test_directory_larger_than_one_listing_buffer_lists_every_entry_once(
    tmp_path: Path, pack_and_mount, readdirplus: str
) -> None:
    src = tmp_path / "wide"
    names = {f"{'long-name-' * 6}{k:05d}.JPEG" for k in range(8000)}  # over 1 MiB of records
    for name in names:
        write(src / "cls" / name, name.encode())
    (src / "cls" / "sub").mkdir()
    with pack_and_mount(src, "--readdirplus", readdirplus) as mnt:
        listed = os.listdir(mnt / "cls")
        assert len(listed) == len(names) + 1 and set(listed) == names | {"sub"}
        assert listing_requests(mnt) >= 3, "the listing took more than one reply"
        kinds = {entry.name: entry.is_dir(follow_symlinks=False) for entry in os.scandir(mnt / "cls")}
        assert kinds["sub"] and not any(kinds[name] for name in names)
        long = subprocess.run(
            ["ls", "-l", mnt / "cls"], capture_output=True, text=True, check=True, timeout=60
        ).stdout.splitlines()
        assert len(long) == len(names) + 2  # 'total' line and sub
