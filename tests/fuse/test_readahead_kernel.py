"""The read-ahead and what the kernel knows: files it caches already are not pushed again, files it
has no inode for are pushed once their folder is listed (by a scan, in the background, or by the
read-ahead itself), and pages or entries it forgets are fetched and pushed again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mounts import counters_of, mount_stats
from readahead_checks import (
    forget_everything,
    make_classes,
    pinned,
    published,
    read_all,
    read_checked,
    uncached,
    wait_settled,
)
from waits import wait_for


def test_files_the_kernel_already_caches_are_not_pushed_again(tmp_path: Path, pack_and_mount) -> None:
    src = make_classes(tmp_path / "src", classes=4, per_class=100, size=20_000)
    with pack_and_mount(src, "--readahead-budget", "64M") as mnt:
        first = published(mnt, "epoch-0")
        read_all(first)
        with pinned(first):  # every file now sits in the mount's page cache, and stays there
            assert uncached(mnt, first) == (0, 0)
            before = mount_stats(mnt)["readahead"]
            second = published(mnt, "epoch-1")  # a new epoch: its read-ahead starts at once
            wait_settled(mnt, "epoch-1", len(second))
            after = mount_stats(mnt)["readahead"]
            data = read_all(second)
    assert data == [(src / p.relative_to(mnt)).read_bytes() for p in second]
    assert after["already_cached"] - before["already_cached"] >= 0.9 * len(second)
    assert after["pushed_files"] - before["pushed_files"] <= 0.05 * len(second), "nothing copied twice"


def test_files_never_looked_up_are_pushed_after_listing_their_directory(
    tmp_path: Path, pack_and_mount
) -> None:
    """A cold start: the kernel knows no inode, so a push is refused until the directory is listed."""
    src = make_classes(tmp_path / "src", classes=4, per_class=50, size=20_000)
    with pack_and_mount(src, "--readahead-budget", "64M") as mnt:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        paths = published(mnt, "epoch-0")
        wait_settled(mnt, "epoch-0", len(paths))
        data, before, after = read_checked(mnt, paths, len(paths))
    assert data == [(src / p.relative_to(mnt)).read_bytes() for p in paths]
    readahead = after["readahead"]
    assert readahead["revealed_dirs"] >= 4 and readahead["push_refused"] == 0, readahead
    assert after["requests"]["lookup"] - before["requests"]["lookup"] <= 4, "the listing made the entries"


@pytest.mark.parametrize(
    ("readdirplus", "scanned", "in_background", "by_read_ahead"),
    [("always", 4, 0, 0), ("auto", 4, 4, 0), ("auto", 3, 0, 4)],
)
def test_entries_a_scan_listed_are_pushed(
    tmp_path: Path, pack_and_mount, readdirplus: str, scanned: int, in_background: int, by_read_ahead: int
) -> None:
    """A training job scans its classes first (ImageFolder). With ``--readdirplus always`` those
    listings carry attributes, so the kernel knows every inode and the read-ahead pushes at once.
    With ``auto`` they give files none, and the kernel keeps the listings: once the scan has listed
    every folder, the daemon lists them all again with attributes in the background, before any
    epoch. After a partial scan it does not, and the read-ahead drops and lists each folder again
    itself, once, with attributes (the unscanned one too: the kernel knows none of its files)."""
    src = make_classes(tmp_path / "src", classes=4, per_class=50, size=20_000)
    with pack_and_mount(src, "--readahead-budget", "64M", "--readdirplus", readdirplus) as mnt:
        for class_dir in sorted(os.scandir(mnt), key=lambda entry: entry.name)[:scanned]:
            list(os.scandir(class_dir.path))
        wait_for(
            lambda: mount_stats(mnt)["listing_folders"] == 0,
            "the background listings to end",
            counters_of(mnt),
        )
        assert mount_stats(mnt)["listed_folders"] == in_background
        paths = published(mnt, "epoch-0")
        wait_settled(mnt, "epoch-0", len(paths))
        data = read_all(paths)
        stats = mount_stats(mnt)
    readahead = stats["readahead"]
    assert data == [(src / p.relative_to(mnt)).read_bytes() for p in paths]
    assert stats["listed_folders"] == in_background, stats
    assert readahead["revealed_dirs"] == by_read_ahead and readahead["push_refused"] == 0, readahead
    assert readahead["pushed_files"] > 0.95 * len(paths), readahead


def test_a_scan_after_the_kernel_forgot_the_tree_is_a_plain_one_again(tmp_path: Path, pack_and_mount) -> None:
    """Under ``auto`` the background listing wants every file's attributes; once the kernel forgot
    the tree, the next scan gets plain listings again (and the background listing follows it), not
    listings with attributes that would make the scanner build every inode as ``always`` does."""
    src = make_classes(tmp_path / "src", classes=4, per_class=50, size=1_000)
    with pack_and_mount(src, "--readdirplus", "auto") as mnt:
        for scan in (1, 2):
            for class_dir in sorted(os.scandir(mnt), key=lambda entry: entry.name):
                list(os.scandir(class_dir.path))
            wait_for(
                lambda: mount_stats(mnt)["listing_folders"] == 0,
                f"the listings after scan {scan} to end",
                counters_of(mnt),
            )
            assert mount_stats(mnt)["listed_folders"] == 4 * scan, mount_stats(mnt)
            forget_everything(mnt, 200)


def test_pages_dropped_by_the_kernel_are_fetched_again(tmp_path: Path, pack_and_mount) -> None:
    """Pushed files the kernel forgets before the reader comes (memory pressure) are pushed again."""
    src = make_classes(tmp_path / "src", classes=4, per_class=50, size=20_000)
    with pack_and_mount(src, "--readahead-budget", "64M") as mnt:
        paths = published(mnt, "epoch-0")
        wait_settled(mnt, "epoch-0", len(paths))
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        wait_for(
            lambda: mount_stats(mnt)["readahead"]["forgotten_ahead"] > 0,
            "the engine to see the forgets",
            counters_of(mnt),
        )
        wait_settled(mnt, "epoch-0", len(paths))
        data, _, _ = read_checked(mnt, paths, len(paths))
    assert data == [(src / p.relative_to(mnt)).read_bytes() for p in paths]


def test_a_pass_after_the_kernel_forgot_everything_is_pushed_again(tmp_path: Path, pack_and_mount) -> None:
    """``drop_caches`` between two passes over one epoch: the second restarts the read-ahead, which
    must list the directories again (the kernel forgot every entry) to push anything."""
    src = make_classes(tmp_path / "src", classes=4, per_class=100, size=20_000)
    with pack_and_mount(src, "--readahead-budget", "64M") as mnt:
        paths = published(mnt, "epoch-0")
        wait_settled(mnt, "epoch-0", len(paths))
        read_all(paths)
        # A training job's next epoch starts long after the FORGETs arrive; here, wait for them.
        forget_everything(mnt, len(paths))
        restarts = mount_stats(mnt)["readahead"]["restarts"]
        data = read_all(paths[:1])  # the first file is a sentinel: reading it restarts the epoch
        wait_settled(mnt, "epoch-0", len(paths))
        rest, before, _ = read_checked(mnt, paths[1:], len(paths))
    assert data + rest == [(src / p.relative_to(mnt)).read_bytes() for p in paths]
    assert before["readahead"]["restarts"] == restarts + 1
