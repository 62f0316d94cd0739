"""The native request server (``dlfs.fuse.server``): hot requests answered in C on several threads.

Real mounts throughout. Each test checks in ``.dlfs/stats`` that the C threads did answer what it
is about, so none passes by falling back on the Python path.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from commands import dlfs
from damage import flip_byte, payload_place
from mounts import counters_of, is_mounted, mount_pid, mount_stats
from page_cache import drop_from_memory
from trees import write
from waits import HANG, Changes, Exit, alive, bound, wait_exited, wait_for

from dlfs.core.libc import cached_pages
from dlfs.core.protocol import LATENCY_BUCKETS

#: Readers at once: more than the machine's cores and the mount's threads.
READERS = 16


def native_stats(mnt: Path) -> dict:
    return mount_stats(mnt)["native"]


def files_under(root: Path) -> list[Path]:
    return sorted(
        Path(folder, name).relative_to(root)
        for folder, _, names in os.walk(root)
        for name in names
        if not Path(folder, name).is_symlink()
    )


def read_the_way_torchvision_does(path: Path) -> bytes:
    """torchvision's default loader: a buffered open (which asks isatty on Python < 3.14)."""
    with open(path, "rb") as f:
        return f.read()


def metadata(path: Path) -> tuple[int, ...]:
    s = os.lstat(path)
    return (s.st_mode, s.st_nlink, s.st_uid, s.st_gid, s.st_size, s.st_mtime_ns)


def test_many_readers_get_every_byte_and_attribute_from_the_c_threads(
    odd_tree: Path, packed: Path, mount
) -> None:
    files = files_under(odd_tree)
    with mount(packed, "--native-threads", "4") as mnt:
        with ThreadPoolExecutor(READERS) as pool:
            for _ in range(2):  # the second round finds the files in the kernel's page cache
                got = list(pool.map(lambda p: read_the_way_torchvision_does(mnt / p), files))
                assert got == [(odd_tree / p).read_bytes() for p in files]
        for path in [Path(folder) for folder, _, _ in os.walk(odd_tree)] + [odd_tree / p for p in files]:
            relative = path.relative_to(odd_tree)
            assert metadata(mnt / relative) == metadata(path), relative
        counts = native_stats(mnt)
    assert counts["threads"] == 4
    for kind in ("lookup", "ioctl", "read"):
        assert counts["answered"][kind] > 0, counts
    assert "read" not in counts["forwarded"], counts  # every file here is small enough for C


def test_reads_answered_in_c_are_timed_apart_from_pythons(odd_tree: Path, packed: Path, mount) -> None:
    """Every READ the C threads answer lands in one log2 µs bucket of their own histogram, whose
    p50/p99 ``dlfs stats`` shows beside Python's."""
    with mount(packed) as mnt:
        for path in sorted((odd_tree / "many").iterdir())[:50]:
            assert (mnt / "many" / path.name).read_bytes() == path.read_bytes()
        counts = native_stats(mnt)
        totals = json.loads(dlfs("stats", mnt, "--json").stdout)
        assert "reads in C" in dlfs("stats", mnt).stdout
    latency = counts["read_latency_us_log2"]
    assert len(latency) == LATENCY_BUCKETS
    assert sum(latency) == counts["answered"]["read"] >= 45  # empty files need no READ
    used = [k for k, n in enumerate(latency) if n]
    mean_us = counts["read_seconds"] * 1e6 / sum(latency)
    # The seconds in all agree with the buckets: their mean lies between the lowest and highest used.
    assert (2 ** used[0] if used[0] else 0) <= mean_us <= 2 ** (used[-1] + 1)
    assert totals["native_read_p50_us"] <= totals["native_read_p99_us"]
    assert totals["read_p50_us"] is None  # Python answered no READ of a file


def test_c_and_python_answer_alike(odd_tree: Path, packed: Path, mount) -> None:
    """Listings and attributes from the C threads (READDIR, READDIRPLUS, LOOKUP, GETATTR, STATFS)
    equal pyfuse3's, entry by entry and stat field by field."""
    entries = (Path(folder, name) for folder, dirs, names in os.walk(odd_tree) for name in dirs + names)
    paths = [Path("."), *sorted(p.relative_to(odd_tree) for p in entries)]

    def observe(mnt: Path) -> list[object]:
        seen: list[object] = [tuple(os.statvfs(mnt))]
        for p in paths:  # listings first, as a scan makes them: names, types and inodes
            if (mnt / p).is_dir() and not (mnt / p).is_symlink():
                with os.scandir(mnt / p) as entries:
                    seen.append(sorted((e.name, e.inode(), e.is_dir(follow_symlinks=False)) for e in entries))
        for p in paths:
            s = os.lstat(mnt / p)
            seen.append(
                (p, s.st_ino, s.st_mode, s.st_nlink, s.st_size, s.st_blocks, s.st_blksize, s.st_mtime_ns)
            )
        return seen

    # No read-ahead: after a full scan it relists every folder with attributes in the background,
    # and each entry the kernel learns that way is one LOOKUP fewer, as many as the race allows.
    quiet = ("--readahead-budget", "0")
    with mount(packed, "--native-threads", "0", *quiet) as mnt:
        by_python = observe(mnt)
        assert native_stats(mnt) is None
    with mount(packed, *quiet) as mnt:
        by_c = observe(mnt)
        counts = native_stats(mnt)["answered"]
    assert by_c == by_python
    folders = sum((odd_tree / p).is_dir() and not (odd_tree / p).is_symlink() for p in paths)
    # Listings give folders their attributes (--readdirplus auto): every other entry is a LOOKUP.
    assert counts["lookup"] >= len(paths) - folders and counts["statfs"] >= 1
    assert counts.get("readdir", 0) + counts.get("readdirplus", 0) >= folders


def test_lz4_files_and_files_of_several_reads_come_whole(odd_tree: Path, pack_and_mount) -> None:
    names = ["compressible.txt", "random.bin", "larger-than-a-shard.bin"]  # 100 KB, 328 KB: several READs
    with pack_and_mount(odd_tree, pack=("--compress", "lz4", "--shard-size", "64K")) as mnt:
        with ThreadPoolExecutor(8) as pool:
            for name, data in zip(names, pool.map(lambda n: (mnt / n).read_bytes(), names * 8), strict=False):
                assert data == (odd_tree / name).read_bytes()
        counts = native_stats(mnt)
    assert counts["answered"]["read"] >= len(names) and "read" not in counts["forwarded"]


def test_a_corrupt_file_is_eio_never_wrong_bytes(packed: Path, mount) -> None:
    shard, offset, length = payload_place(packed, "random.bin")
    flip_byte(shard, offset + length // 2)
    with mount(packed) as mnt:
        with ThreadPoolExecutor(4) as pool:
            outcomes = list(pool.map(lambda _: _read_errno(mnt / "random.bin"), range(8)))
        assert outcomes == [errno.EIO] * 8
        assert (mnt / "plain.txt").read_bytes() == b"hello dlfs\n"
        counts = native_stats(mnt)
    # The C thread found the mismatch and let Python answer (EIO, logged once; test_integrity).
    assert counts["forwarded"]["read"] >= 1 and counts["answered"]["read"] >= 1


def _read_errno(path: Path) -> int:
    try:
        path.read_bytes()
    except OSError as exc:
        return exc.errno or 0
    return 0


def test_the_control_tree_works_while_c_threads_serve(odd_tree: Path, packed: Path, mount) -> None:
    files = files_under(odd_tree)
    stop = threading.Event()

    def hammer() -> int:
        rounds = 0
        while not stop.is_set():
            for p in files[:50]:
                read_the_way_torchvision_does(mnt / p)
            rounds += 1
        return rounds

    with mount(packed) as mnt, ThreadPoolExecutor(4) as pool:
        busy = [pool.submit(hammer) for _ in range(4)]
        try:
            order = (mnt / ".dlfs" / "order" / "epoch-0").read_bytes().splitlines()
            config = (mnt / ".dlfs" / "config").read_bytes()
            stats = mount_stats(mnt)
        finally:
            stop.set()
        assert all(f.result(timeout=60) >= 1 for f in busy)
    assert len(order) == sum(1 for p in files if stat.S_ISREG(os.lstat(odd_tree / p).st_mode))
    assert b"seed" in config and stats["native"]["answered"]["read"] > 0


def test_after_an_order_is_announced_reads_reach_the_read_ahead(odd_tree: Path, packed: Path, mount) -> None:
    with mount(packed) as mnt:
        order = (mnt / ".dlfs" / "order" / "epoch-0").read_bytes().splitlines()
        before = native_stats(mnt)["forwarded"].get("read", 0)
        for line in order[:40]:
            assert (mnt / os.fsdecode(line)).read_bytes() == (odd_tree / os.fsdecode(line)).read_bytes()
        stats = mount_stats(mnt)
    assert stats["readahead"]["used_files"] + stats["native"]["forwarded"].get("read", 0) - before > 0


@pytest.mark.parametrize("stop", ["umount", "sigterm"])
def test_stopping_with_c_threads_busy_leaves_no_reader_hanging(
    odd_tree: Path, packed: Path, tmp_path: Path, stop: str
) -> None:
    """Readers in other processes hammer the mount; the mount goes away under them. Every reader
    ends (with data or an error) within seconds, the daemon exits and nothing stays mounted."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    pid = mount_pid(dlfs("mount", packed, mnt, "--log-file", tmp_path / "mount.log"))
    reader = (  # the tree's files, read over and over; says so (argv[2]) once it has read them all once
        "import os, sys\n"
        "found = (os.path.join(d, n) for d, _, ns in os.walk(sys.argv[1]) for n in ns)\n"
        "paths = [p for p in found if os.path.isfile(p)]\n"
        "for k in range(1 << 62):\n"
        "    if k == 1:\n"
        "        open(sys.argv[2], 'w').close()\n"
        "    for p in paths:\n"
        "        try:\n"
        "            open(p, 'rb').read()\n"
        "        except OSError:\n"
        "            sys.exit(0)\n"
    )
    reading = [tmp_path / f"reading-{k}" for k in range(6)]
    readers = [subprocess.Popen([sys.executable, "-c", reader, str(mnt), str(path)]) for path in reading]
    try:
        wait_for(
            lambda: all(path.exists() for path in reading),
            "every reader to get going",
            Changes(tmp_path),
            *(Exit(reader.pid) for reader in readers),
        )
        assert native_stats(mnt)["answered"]["read"] > 0
        if stop == "umount":
            dlfs("umount", "--lazy", mnt, timeout=30)  # they hold it busy: only a lazy one goes
        else:
            os.kill(pid, signal.SIGTERM)
        for r in readers:
            r.wait(timeout=bound(HANG))  # a reader that hangs fails here
        wait_exited(pid, f"the daemon after its {stop}")
        assert not is_mounted(mnt)
    finally:
        for r in readers:
            r.kill()
            r.wait()
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True, check=False)
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    log_text = (tmp_path / "mount.log").read_text()
    assert "Traceback" not in log_text and "failed to unmount" not in log_text, log_text


@pytest.mark.parametrize("region", ["1M", "0"])
def test_a_file_read_from_storage_brings_its_shard_region_into_memory(
    on_disk: Path, pack_and_mount, region: str
) -> None:
    """With no published order, a file the C threads read from storage makes the kernel read the
    whole region of the shard around it, so its neighbours cost the disk no seek of their own."""
    src = on_disk / "src"
    for k in range(64):  # 64 files of 32 KiB, stored back to back: 2 MiB of shard
        write(src / "cls" / f"{k:03d}.JPEG", bytes([k]) * (32 << 10))
    dataset = on_disk / "dataset"
    with pack_and_mount(src, "--region-ahead", region, dataset=dataset) as mnt:
        shard = next(dataset.glob("*.shard"))
        _, offset, _ = payload_place(dataset, "cls/010.JPEG")
        drop_from_memory(shard)
        assert (mnt / "cls" / "010.JPEG").read_bytes() == bytes([10]) * (32 << 10)
        fd = os.open(shard, os.O_RDONLY)
        try:
            pages = cached_pages(fd, 1 << 20, offset // (1 << 20) * (1 << 20))
        finally:
            os.close(fd)
        fetched = native_stats(mnt)["regions_fetched"]
    assert pages is not None, "cachestat (Linux 6.5 or later) tells what is in memory"
    if region == "0":
        assert fetched == 0 and pages < 64  # the file's own pages (and the kernel's own read-ahead)
    else:
        assert fetched == 1 and pages == 256


def test_forgets_reach_python_gathered(odd_tree: Path, packed: Path, mount) -> None:
    """The kernel forgets inodes one by one as it evicts them; the C threads gather them and hand
    Python a few batches, not a request per inode, and Python still learns every one."""
    files = files_under(odd_tree)
    with mount(packed) as mnt:
        for p in files:
            os.lstat(mnt / p)  # the kernel learns an inode per file
        Path("/proc/sys/vm/drop_caches").write_text("2\n")  # and forgets them
        wait_for(
            lambda: mount_stats(mnt)["requests"].get("forget", 0) >= len(files),
            f"FORGETs of all {len(files)} files to reach Python",
            counters_of(mnt),
        )
        stats = mount_stats(mnt)
    answered = stats["native"]["answered"]
    assert answered.get("forget", 0) + answered.get("batch_forget", 0) > 0
    assert "forget" not in stats["native"]["forwarded"] and "batch_forget" not in stats["native"]["forwarded"]
