"""The mounted tree, checked with the tools users run: diff, find, stat, du, df; read-only, with
every name, size and byte of the source, however it was packed."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest
from commands import DLFS, dlfs
from trees import SMALL_SHARD, find_listing


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


def test_large_file_over_the_whole_payload_limit_reads_back_by_range(tmp_path: Path, pack_and_mount) -> None:
    from dlfs.core.format import WHOLE_PAYLOAD_LIMIT

    src = tmp_path / "big-src"
    src.mkdir()
    data = os.urandom(1 << 20) * (WHOLE_PAYLOAD_LIMIT // (1 << 20) + 3)
    (src / "huge.bin").write_bytes(data)
    (src / "small.txt").write_bytes(b"small\n")
    dst = tmp_path / "big-ds"
    with (
        pack_and_mount(src, pack=("--shard-size", "16M"), dataset=dst) as mnt,
        open(mnt / "huge.bin", "rb") as f,
    ):
        f.seek(len(data) - 5000)
        assert f.read() == data[-5000:]
        f.seek(0)
        assert f.read() == data
    assert dlfs("verify", dst).returncode == 0


def test_random_placement_and_lz4_serve_identical_bytes(odd_tree: Path, pack_and_mount) -> None:
    how = ("--placement", "random", "--seed", "3", "--compress", "lz4", "--shard-size", str(SMALL_SHARD))
    with pack_and_mount(odd_tree, pack=how) as mnt:
        result = subprocess.run(
            ["diff", "-r", "--no-dereference", odd_tree, mnt], capture_output=True, timeout=120, check=False
        )
        assert result.returncode == 0, result.stdout


def test_many_readers_at_once_get_correct_bytes(packed: Path, odd_tree: Path, mount) -> None:
    from concurrent.futures import ThreadPoolExecutor

    files = [p for p in odd_tree.rglob("*") if p.is_file() and not p.is_symlink()]
    with mount(packed, "--ram-cache-size", "64K") as mnt:

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


def test_unicode_and_non_utf8_names_survive(odd_tree: Path, pack_and_mount) -> None:
    with pack_and_mount(odd_tree) as mnt:
        names = set(os.listdir(os.fsencode(mnt)))
        assert b"non-utf8-\xff\xfe.bin" in names
        assert "ünïcødé-名前.txt".encode() in names
        assert b"new\nline.txt" in names
        assert (Path(mnt) / "new\nline.txt").read_bytes() == b"newline in name\n"
