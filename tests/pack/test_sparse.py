"""GNU sparse members (``tar -S``) in each of GNU tar's sparse formats, old GNU and pax 0.0, 0.1 and
1.0: packed and served in place, they read as ``tar x`` extracts them, holes as zeros, small files
and files past the whole-payload limit alike; only their runs of data are stored, and a byte
changed in a run is an I/O error, never wrong bytes."""

from __future__ import annotations

import errno
import subprocess
from pathlib import Path

import pytest
from archives import listing, pack_and_compare
from commands import dlfs
from damage import flip_byte, payload_place
from mounts import mounted

from dlfs.core import format as fmt

MiB = 1 << 20
#: GNU tar's flags for each sparse format.
FORMATS = {
    "oldgnu": ["--format=gnu", "--sparse"],
    "pax-0.0": ["--format=pax", "--sparse", "--sparse-version=0.0"],
    "pax-0.1": ["--format=pax", "--sparse", "--sparse-version=0.1"],
    "pax-1.0": ["--format=pax", "--sparse", "--sparse-version=1.0"],
}


def write_sparse(path: Path, size: int, runs: list[tuple[int, bytes]]) -> Path:
    """A file of ``size`` bytes, holes but for ``runs`` (offset, bytes)."""
    with open(path, "wb") as f:
        for offset, data in runs:
            f.seek(offset)
            f.write(data)
        f.truncate(size)
    return path


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Sparse files: runs inside, one at the very start and end, all holes, and one past the
    whole-payload limit (read by range); a plain file after them."""
    root = tmp_path_factory.mktemp("sparse") / "src"
    root.mkdir()
    write_sparse(root / "holes.bin", 5 * MiB, [(MiB, b"x" * 5000), (3 * MiB, b"y" * 70_000)])
    write_sparse(root / "ends.bin", 300_000, [(0, b"start"), (299_999, b"z")])
    write_sparse(root / "empty-holes.bin", 2 * MiB, [])
    big = fmt.WHOLE_PAYLOAD_LIMIT + 5 * MiB
    write_sparse(root / "large.bin", big, [(7, b"a" * 9000), (40 * MiB, b"b" * 100_000), (big - 3, b"end")])
    (root / "plain.txt").write_bytes(b"plain\n")
    return root


def sparse_tar(tree: Path, kind: str, out: Path) -> Path:
    subprocess.run(["tar", *FORMATS[kind], "-cf", out, "-C", tree, "."], check=True, timeout=120)
    return out


@pytest.mark.parametrize("kind", list(FORMATS))
@pytest.mark.parametrize("in_place", [False, True], ids=["packed", "in-place"])
def test_a_sparse_member_reads_as_tar_x_extracts_it_and_only_its_runs_are_stored(
    tree: Path, tmp_path: Path, kind: str, in_place: bool
) -> None:
    archive = sparse_tar(tree, kind, tmp_path / "sparse.tar")
    assert archive.stat().st_size < 2 * MiB, "the tar holds the runs only"
    pack_and_compare(tmp_path, archive, *(["--in-place"] if in_place else []))
    stored = sum(path.stat().st_size for path in (tmp_path / "dst").iterdir())
    assert stored < MiB, "the dataset stores the runs, not the holes"
    assert dlfs("verify", tmp_path / "dst").returncode == 0


def test_a_byte_changed_in_a_sparse_run_is_an_io_error(tree: Path, tmp_path: Path) -> None:
    archive = sparse_tar(tree, "pax-1.0", tmp_path / "sparse.tar")
    dst = tmp_path / "dst"
    dlfs("pack", archive, dst)
    shard, offset, length = payload_place(dst, "holes.bin")
    assert length < 100_000, "its runs (GNU tar finds them a file system block at a time)"
    flip_byte(shard, offset + 100)
    with mounted(dst, tmp_path / "mnt") as mnt:
        with pytest.raises(OSError) as failed:
            (mnt / "holes.bin").read_bytes()
        assert failed.value.errno == errno.EIO
        assert (mnt / "plain.txt").read_bytes() == b"plain\n"
    assert "holes.bin" in dlfs("verify", dst, check=False).stdout


def test_a_sparse_file_of_a_directory_tree_is_packed_as_it_reads(tree: Path, pack_and_mount) -> None:
    """A tree is read as files are read: its holes are zeros like any bytes."""
    with pack_and_mount(tree) as mnt:
        assert listing(mnt).keys() == listing(tree).keys()
        assert (mnt / "holes.bin").read_bytes() == (tree / "holes.bin").read_bytes()
