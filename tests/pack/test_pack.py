"""pack's promises: clear refusals, --force, safe interruption, unreadable files, JSON summary."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from commands import DLFS, assert_one_line_error, dlfs
from page_cache import tmpfs
from waits import wait_for_files

from dlfs.cli.common import human
from dlfs.core import format as fmt
from dlfs.core import libc
from dlfs.core.errors import PackError
from dlfs.core.index import Index
from dlfs.core.store import local
from dlfs.core.store.local import LocalStore
from dlfs.pack import PackOptions, pack, pipeline, tree_source
from dlfs.pack.options import PROGRESS_EVERY


def test_missing_or_non_directory_source_is_refused(tmp_path: Path) -> None:
    assert_one_line_error(dlfs("pack", tmp_path / "nope", tmp_path / "dst", check=False), "does not exist")
    (tmp_path / "file").write_text("x")
    assert_one_line_error(
        dlfs("pack", tmp_path / "file", tmp_path / "dst", check=False), "neither a directory nor an archive"
    )


def test_existing_dataset_needs_force(odd_tree: Path, packed: Path) -> None:
    old_index = (packed / fmt.INDEX_NAME).read_bytes()
    assert_one_line_error(dlfs("pack", odd_tree, packed, check=False), "--force")
    assert (packed / fmt.INDEX_NAME).read_bytes() == old_index
    dlfs("pack", odd_tree, packed, "--force", "--shard-size", "64M")
    assert (packed / fmt.INDEX_NAME).read_bytes() != old_index
    assert len(list(packed.glob("*.shard"))) == 1, "the replaced dataset's shards are removed"
    assert dlfs("verify", packed).returncode == 0


def test_foreign_destination_and_destination_inside_source_are_refused(
    odd_tree: Path, tmp_path: Path
) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert_one_line_error(dlfs("pack", odd_tree, foreign, check=False), "not empty")
    assert_one_line_error(dlfs("pack", odd_tree, odd_tree / "many" / "ds", check=False), "inside the source")


def test_a_shard_size_past_what_a_32_bit_offset_addresses_is_refused(odd_tree: Path, tmp_path: Path) -> None:
    for size, message in (("5G", "at most 4 GiB"), ("1K", "at least 4 KiB")):
        result = dlfs("pack", odd_tree, tmp_path / "dst", "--shard-size", size, check=False)
        assert_one_line_error(result, message)
    assert not (tmp_path / "dst").exists()


@pytest.mark.parametrize(
    ("limit", "value", "message"),
    [("OWNERS_MAX", 3, "distinct (uid, gid) owners"), ("BLOB_MAX", 1000, "the names in the source tree")],
)
def test_a_tree_past_what_one_index_holds_is_refused_with_nothing_published(
    odd_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limit: str, value: int, message: str
) -> None:
    """The bounds of the index's 16- and 32-bit columns, made small: the odd tree has five owners
    and about 4 KiB of names."""
    monkeypatch.setattr(fmt, limit, value)
    with pytest.raises(PackError, match="pack its folders as separate datasets") as info:
        pack(odd_tree, tmp_path / "dst", PackOptions(progress=False))
    assert message in str(info.value)
    assert not list(tmp_path.glob("dst/*"))


def _big_tree(src: Path, files: int = 3000, size: int = 256 * 1024) -> Path:
    """Large enough (768 MB) that a pack is still running when the test signals it."""
    block = os.urandom(size)
    for k in range(files):
        path = src / f"d{k % 10}" / f"{k}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(k.to_bytes(8, "little") + block[8:])
    return src


def test_killed_pack_leaves_nothing_that_mounts_and_the_next_pack_cleans_up(tmp_path: Path) -> None:
    src = _big_tree(tmp_path / "src")
    dst = tmp_path / "dst"
    proc = subprocess.Popen([*DLFS, "-q", "pack", src, dst, "--shard-size", "256K", "--threads", "1"])
    try:
        wait_for_files(dst, "*.shard", proc.pid, "the pack's first shard")
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert not (dst / fmt.INDEX_NAME).exists(), (
        "the kill landed after the pack finished; make the tree larger"
    )
    (tmp_path / "mnt").mkdir()
    assert_one_line_error(dlfs("mount", dst, tmp_path / "mnt", check=False), "not a dlfs dataset")
    dlfs("pack", src, dst, "--shard-size", "4M")
    index = Index.load(LocalStore(dst))
    assert sorted(p.name for p in dst.glob("*.shard")) == sorted(index.shard_names)


def test_interrupted_repack_keeps_the_old_dataset_intact(tmp_path: Path, packed: Path) -> None:
    src = _big_tree(tmp_path / "bigger")
    before = sorted(p.name for p in packed.iterdir())
    # As from a terminal: a shell that starts a job in the background (`make test &`) has it
    # ignore SIGINT, and Python then never turns one into KeyboardInterrupt.
    proc = subprocess.Popen(
        [*DLFS, "-q", "pack", src, packed, "--force", "--shard-size", "256K", "--threads", "1"],
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        wait_for_files(packed, "*.shard", proc.pid, "the repack's first shard", more_than=len(before))
        proc.send_signal(signal.SIGINT)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == 130
    assert sorted(p.name for p in packed.iterdir()) == before, "Ctrl-C removed the partial shards"
    assert dlfs("verify", packed).returncode == 0


def test_a_repack_over_a_dataset_of_another_format_keeps_its_shards_until_it_is_replaced(
    odd_tree: Path, packed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older dlfs may still be serving that dataset: a pack that fails leaves every shard."""
    index = packed / fmt.INDEX_NAME
    with open(index, "r+b") as f:
        f.seek(len(fmt.INDEX_MAGIC))
        f.write((fmt.FORMAT_VERSION - 1).to_bytes(4, "little"))
    shards = sorted(packed.glob("*.shard"))
    monkeypatch.setattr(fmt, "OWNERS_MAX", 1)  # the new pack fails in its walk
    with pytest.raises(PackError):
        pack(odd_tree, packed, PackOptions(progress=False, force=True))
    assert sorted(packed.glob("*.shard")) == shards


def test_every_file_starts_below_the_shard_size(tmp_path: Path) -> None:
    """An empty file after a shard filled to exactly its target starts the next shard: offsets
    stay below ``--shard-size``, which bounds them to the index's 32 bits (``fmt.SHARD_MAX``)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"a" * (4096 - fmt.HEADER_SIZE))
    (src / "b.empty").write_bytes(b"")
    pack(src, tmp_path / "dst", PackOptions(progress=False, shard_size=4096))
    index = Index.load(LocalStore(tmp_path / "dst"))
    row = index.resolve(b"b.empty")
    assert row is not None and int(index.offset[row]) < 4096


def test_unreadable_file_fails_by_default_and_is_skipped_on_request(
    packed: Path, tmp_path: Path, mount
) -> None:
    """A real EIO source: a dlfs mount with one corrupted file."""
    from damage import flip_byte, payload_place

    shard, offset, _ = payload_place(packed, "plain.txt")
    flip_byte(shard, offset)
    with mount(packed) as mnt:
        result = dlfs("pack", mnt, tmp_path / "out", check=False)
        assert_one_line_error(result, "cannot read", "plain.txt", "--skip-errors")
        assert not (tmp_path / "out" / fmt.INDEX_NAME).exists()
        assert not list((tmp_path / "out").glob("*.shard")), "a failed pack removes its shards"
        skipped = subprocess.run(
            [*DLFS, "pack", mnt, tmp_path / "out", "--skip-errors", "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert skipped.returncode == 0, skipped.stderr
    summary = json.loads(skipped.stdout)
    assert summary["skipped_errors"] == 1 and summary["skipped_paths"][0].endswith("plain.txt")
    listing = dlfs("ls", tmp_path / "out").stdout.splitlines()
    assert "plain.txt" not in listing and "random.bin" in listing
    assert dlfs("verify", tmp_path / "out").returncode == 0


def test_json_summary_counts_match_the_tree(odd_tree: Path, tmp_path: Path) -> None:
    summary = json.loads(dlfs("pack", odd_tree, tmp_path / "ds", "--json", "--compress", "lz4").stdout)
    files = [p for p in odd_tree.rglob("*") if p.is_file() and not p.is_symlink()]
    dirs = [p for p in odd_tree.rglob("*") if p.is_dir() and not p.is_symlink()]
    assert summary["files"] == len(files)
    assert summary["directories"] == len(dirs) + 1  # and the root
    assert summary["symlinks"] == 5
    assert summary["compressed_files"] >= 1
    assert summary["stored_bytes"] < summary["bytes"]


def test_ls_lists_the_index_without_mounting(packed: Path) -> None:
    top = dlfs("ls", packed).stdout.splitlines()
    assert top[:3] == ["classes", "compressible.txt", "deep"]
    long = dlfs("ls", packed, "classes/n00000001", "-l").stdout.splitlines()
    assert len(long) == 20 and long[0].startswith("-rw-r--r--")
    link = dlfs("ls", packed, "link-to-file", "-l").stdout
    assert link.strip().endswith("link-to-file -> plain.txt")
    recursive = dlfs("ls", packed, "-R").stdout.splitlines()
    assert "deep/d0/d1" in recursive and "classes/n00000002/n00000002_19.JPEG" in recursive
    assert_one_line_error(dlfs("ls", packed, "no/such", check=False), "no such file")


@pytest.mark.parametrize("sync", [True, False])
def test_no_sync_writes_the_same_dataset_without_waiting_for_the_disk(
    odd_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync: bool
) -> None:
    waits: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (waits.append("fsync"), real_fsync(fd))[1])
    real_range = libc._libc.sync_file_range
    monkeypatch.setattr(
        libc._libc, "sync_file_range", lambda *a: (waits.append("sync_file_range"), real_range(*a))[1]
    )
    # Flushes and writeback starts even for a small tree.
    monkeypatch.setattr(local, "WRITE_BUFFER", 1 << 10)
    monkeypatch.setattr(local, "WRITEBACK_STEP", 1 << 10)
    pack(odd_tree, tmp_path / "ds", PackOptions(sync=sync, progress=False))
    if sync:
        assert {"fsync", "sync_file_range"} <= set(waits)
    else:
        assert waits == []
    assert dlfs("verify", tmp_path / "ds").returncode == 0  # every file's checksum


@pytest.mark.parametrize("shard_size", [1 << 30, 4096], ids=["one-shard", "shard-a-file"])
@pytest.mark.parametrize("compress", [False, True], ids=["in-place", "in-order"])
def test_files_that_change_after_the_walk_are_stored_as_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mount, compress: bool, shard_size: int
) -> None:
    """Slots are laid out from the sizes the walk saw. A file that grew is appended past them (in
    a shard of its own where the last one is full), one that shrank leaves a hole, one that
    vanished is skipped: every file left reads back as it was read."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a-grows.bin").write_bytes(b"a" * 1000)
    (src / "b-shrinks.bin").write_bytes(b"b" * 5000)
    (src / "c-large-grows.bin").write_bytes(os.urandom(3 << 20))
    (src / "d-large-shrinks.bin").write_bytes(os.urandom(3 << 20))
    (src / "z-vanishes.bin").write_bytes(b"z" * 7000)
    monkeypatch.setattr(fmt, "WHOLE_PAYLOAD_LIMIT", 1 << 20)  # c and d are streamed, in chunks
    monkeypatch.setattr(pipeline, "STREAM_CHUNK", 1 << 20)
    walk = tree_source.walk

    def walk_then_change(*args: object) -> object:
        tree = walk(*args)
        (src / "a-grows.bin").write_bytes(b"A" * 3000)
        (src / "b-shrinks.bin").write_bytes(b"B" * 100)
        with open(src / "c-large-grows.bin", "ab") as f:
            f.write(os.urandom(1 << 20))
        (src / "d-large-shrinks.bin").write_bytes(os.urandom(1 << 20))
        (src / "z-vanishes.bin").unlink()
        return tree

    monkeypatch.setattr(tree_source, "walk", walk_then_change)
    options = PackOptions(progress=False, compress=compress, skip_errors=True, shard_size=shard_size)
    summary = pack(src, tmp_path / "ds", options)
    assert summary.skipped_errors == 1 and summary.skipped_paths[0].endswith("z-vanishes.bin")
    assert dlfs("verify", tmp_path / "ds").returncode == 0  # shard lengths and every checksum
    with mount(tmp_path / "ds") as mnt:
        assert sorted(os.listdir(mnt)) == sorted(os.listdir(src))
        for name in os.listdir(src):
            assert (Path(mnt) / name).read_bytes() == (src / name).read_bytes(), name


def test_a_vanished_last_file_leaves_its_shard_the_length_the_index_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its slot, the last of the shard, is never written: the shard still reaches its end."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"a" * 1000)
    (src / "z-vanishes.bin").write_bytes(b"z" * 7000)
    walk = tree_source.walk

    def walk_then_delete(*args: object) -> object:
        tree = walk(*args)
        (src / "z-vanishes.bin").unlink()
        return tree

    monkeypatch.setattr(tree_source, "walk", walk_then_delete)
    pack(src, tmp_path / "ds", PackOptions(progress=False, skip_errors=True))
    assert dlfs("verify", tmp_path / "ds").returncode == 0


@pytest.mark.parametrize("how", [[], ["--compress", "lz4"]], ids=["in-place", "in-order"])
def test_a_full_destination_is_one_line_and_leaves_nothing_behind(tmp_path: Path, how: list[str]) -> None:
    """A real full disk: a 1 MiB tmpfs, and 4 MB of incompressible files."""
    src = tmp_path / "src"
    src.mkdir()
    for k in range(40):
        (src / f"{k:02d}.bin").write_bytes(os.urandom(100_000))
    with tmpfs(tmp_path / "small", "1m") as small:
        result = dlfs("pack", src, small / "ds", *how, check=False)
        assert_one_line_error(result, "cannot write", "No space left on device")
        assert not (small / "ds" / fmt.INDEX_NAME).exists()
        assert not list((small / "ds").glob("*.shard")), "a failed pack removes its shards"


def test_global_flags_are_taken_before_and_after_the_command(odd_tree: Path, tmp_path: Path) -> None:
    def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
        command = [*DLFS, *map(str, args)]
        return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)

    assert "pack:" in run("pack", odd_tree, tmp_path / "loud").stderr  # the progress bar
    quiet = run("pack", "-q", odd_tree, tmp_path / "quiet")
    assert "pack:" not in quiet.stderr and "packed" in quiet.stdout
    assert "pack:" not in run("-q", "pack", odd_tree, tmp_path / "before").stderr
    assert "dataset_id:" in run("info", tmp_path / "quiet", "-v").stdout  # "unrecognized arguments" once


def test_the_summary_gives_the_shard_size_and_what_the_shards_hold_in_all(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for k in range(40):
        (src / f"{k:02d}.bin").write_bytes(os.urandom(100_000))
    said = dlfs("pack", src, tmp_path / "ds", "--shard-size", "1Mi").stdout
    info = json.loads(dlfs("info", tmp_path / "ds", "--json").stdout)
    assert info["shards"] > 1
    assert f"into {info['shards']} shard(s) of 1.0 MiB, {human(info['stored_bytes'])} in all" in said, said


def test_the_progress_bar_ends_at_the_files_the_summary_counts(tmp_path: Path) -> None:
    """More files than the bar's refresh step and not a multiple of it: its last figure is the
    summary's, not the count at its last step."""
    src = tmp_path / "src"
    src.mkdir()
    files = PROGRESS_EVERY + 44
    for k in range(files):
        (src / f"{k:04d}.txt").write_bytes(b"x" * k)
    result = subprocess.run(
        [*DLFS, "pack", src, tmp_path / "ds"], capture_output=True, text=True, timeout=120, check=True
    )
    assert f"packed {files} files" in result.stdout
    counts = re.findall(r"([\d,]+) files, [\d,]+ files/s", result.stderr)
    assert counts and counts[-1] == f"{files:,}", result.stderr
