"""pack's column files: correct values, the same index whatever the chunk sizes, nothing left behind."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from commands import DLFS
from trees import make_odd_tree
from waits import wait_for_files

from dlfs.core import format as fmt
from dlfs.core.index import Index
from dlfs.core.store.local import LocalStore
from dlfs.pack import PackOptions, columns, pack, placement, spill, tree_source, walk
from dlfs.pack.placement import permute


def test_a_column_reads_gathers_and_scatters_what_was_written(tmp_path: Path) -> None:
    store = spill.Spill(tmp_path)
    try:
        column = store.column("c", np.uint64)
        column.extend(np.arange(10, dtype=np.uint64))
        column.extend(np.arange(10, 25, dtype=np.uint64))
        assert len(column) == 25
        assert column.read(8, 12).tolist() == [8, 9, 10, 11]
        assert column.read(20, 99).tolist() == [20, 21, 22, 23, 24]
        rows = np.array([24, 0, 13, 13])
        assert column.gather(rows).tolist() == [24, 0, 13, 13]
        column.scatter(np.array([3, 17]), np.array([1000, 2000], dtype=np.uint64))
        assert column.read(0, 25)[[3, 17]].tolist() == [1000, 2000], "a scatter reaches the file"
        blob = store.column("b", np.uint8)
        blob.extend(b"alphabetagamma")
        assert blob.slices(np.array([5, 0, 9]), np.array([9, 5, 14])) == [b"beta", b"alpha", b"gamma"]
        zeros = store.column("z", np.uint32, length=1 << 20)
        assert zeros.read(0, 1 << 20).sum() == 0, "preallocated as zeros"
        assert os.stat(zeros.path).st_blocks * 512 >= 4 << 20, "its blocks reserved: a full disk is an error"
    finally:
        store.close()
    assert not store.root.exists()


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5, 17, 1000, 4096, 4097, 65_537])
def test_the_random_placement_is_a_permutation(count: int) -> None:
    keys = np.arange(1, placement.ROUNDS + 1, dtype=np.uint64)
    picks = permute(np.arange(count, dtype=np.uint64), count, keys)
    assert np.array_equal(np.sort(picks), np.arange(count))


def test_the_source_placement_lays_files_out_in_tree_pre_order(tmp_path: Path) -> None:
    """A folder's files and subfolders interleave by name: each subfolder's files come where its
    name falls, before the folder's later files."""
    src = tmp_path / "src"
    names = ["a.bin", "b/x.bin", "b/c/y.bin", "b/d.bin", "c.bin", "d/e.bin", "e.bin"]
    for name in names:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(name.encode())
    pack(src, tmp_path / "dst", PackOptions(progress=False))
    index = Index.load(LocalStore(tmp_path / "dst"))
    laid = sorted(names, key=lambda name: int(index.offset[index.resolve(name.encode())]))
    assert laid == ["a.bin", "b/c/y.bin", "b/d.bin", "b/x.bin", "c.bin", "d/e.bin", "e.bin"]


def _index_sections(dst: Path) -> dict[str, np.ndarray]:
    raw = (dst / fmt.INDEX_NAME).read_bytes()
    return {name: np.array(a) for name, a in fmt.decode_index(memoryview(raw), "test").arrays.items()}


@pytest.mark.parametrize(
    ("placement", "compress"),
    [("tree", False), ("random", False), ("tree", True)],
    ids=["in-place", "random", "lz4"],
)
def test_chunk_sizes_never_change_the_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, placement: str, compress: bool
) -> None:
    """Every buffer and chunk at a few rows or bytes (every gather and scatter in batches), so each
    boundary falls inside a folder, a run of files, a name or a value: the index is the one the
    default sizes write. Two files vanish after the walk
    (``--skip-errors`` drops them and renumbers the rows after)."""
    src = make_odd_tree(tmp_path / "src")
    vanish = [src / "many" / "file-0007.dat", src / "classes" / "n00000001" / "n00000001_3.JPEG"]
    real_walk = walk.walk

    def walk_then_delete(*args: object, **kwargs: object) -> walk.Tree:
        tree = real_walk(*args, **kwargs)  # type: ignore[arg-type]
        for path in vanish:
            path.unlink(missing_ok=True)
        return tree

    monkeypatch.setattr(tree_source, "walk", walk_then_delete)
    options = PackOptions(
        progress=False, shard_size=1 << 16, placement=placement, seed=3, compress=compress, skip_errors=True
    )
    contents = [path.read_bytes() for path in vanish]
    times = {path: path.stat().st_mtime_ns for path in [*vanish, *(path.parent for path in vanish)]}
    summaries = {}
    for label, sizes in (
        ("default", {}),
        (
            "tiny",
            {
                "FLUSH_ROWS": 2,
                "CHUNK": 3,
                "ROWS_CHUNK": 3,
                "PLACED_BUFFER": 2,
                "PIECE": 3,
                "MAPPED_BYTES": 0,
                "ROWS_MAPPED": 2,
            },
        ),
    ):
        for module in (walk, placement, columns, spill):
            for name, value in sizes.items():
                if hasattr(module, name):
                    monkeypatch.setattr(module, name, value)
        for path, data in zip(vanish, contents, strict=True):
            path.write_bytes(data)
        for path, ns in times.items():
            os.utime(path, ns=(ns, ns))
        summaries[label] = pack(src, tmp_path / label, options)
    assert summaries["tiny"].skipped_errors == 2
    default, tiny = _index_sections(tmp_path / "default"), _index_sections(tmp_path / "tiny")
    for name in fmt.SECTIONS:
        assert np.array_equal(default[name], tiny[name]), name
    index = Index.load(LocalStore(tmp_path / "tiny"))
    assert index.resolve(b"many/file-0007.dat") is None and index.resolve(b"many/file-0008.dat") is not None
    assert (
        subprocess.run([*DLFS, "verify", tmp_path / "tiny"], capture_output=True, timeout=120).returncode == 0
    )
    assert not list((tmp_path / "tiny").glob(f"{spill.PREFIX}*")), "the column files are removed"


def test_a_killed_packs_column_files_are_removed_by_the_next_pack(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for k in range(20_000):
        (src / f"d{k % 50}").mkdir(parents=True, exist_ok=True)
        (src / f"d{k % 50}" / f"{k}").write_bytes(b"x")
    dst = tmp_path / "dst"
    proc = subprocess.Popen([*DLFS, "-q", "pack", src, dst], stderr=subprocess.DEVNULL)
    try:
        wait_for_files(dst, f"{spill.PREFIX}*", proc.pid, "the pack's first column file")
        proc.kill()
    finally:
        proc.wait(timeout=30)
    left = list(dst.glob(f"{spill.PREFIX}*"))
    assert left, "the kill landed after the pack finished; make the tree larger"
    subprocess.run([*DLFS, "-q", "pack", "--force", src, dst], check=True, timeout=300)
    assert not any(path.exists() for path in left)
    assert Index.load(LocalStore(dst)).count == 20_000 + 50 + 1
