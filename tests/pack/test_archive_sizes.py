"""Members of every size the readers make a case of, on every path an archive takes: packed (the C
loop over plain members), indexed in place, nested under ``--expand-tars``, from standard input,
and gzip'd; each in a GNU tar (headers the C loop takes) and a pax one (headers ``tarfile``
takes). A member's size sits at each power-of-two boundary of the readers' buffers, on either
side, up to 64 MiB + 1, and one member's header lies 512 bytes before the C loop's buffer ends.
Sizes past 8 GiB (base-256 and pax ``size``) are in the slow tests."""

from __future__ import annotations

import hashlib
import io
import random
import subprocess
import tarfile
from pathlib import Path

import pytest
from archives import tar_bytes
from commands import DLFS, dlfs
from mounts import mounted

from dlfs.core import format as fmt
from dlfs.pack.archive import positional, streams, tarscan

MiB = 1 << 20
#: The readers' buffers: a stream's skip-ahead, its chunk and a local tar's read, the C loop's
#: buffer, its two halves and a pack's stream chunk, the read hint, the whole-payload limit.
BOUNDARIES = sorted(
    {
        streams.SKIPPING_AHEAD,
        streams.CHUNK,
        positional.READ_CHUNK,
        tarscan.BUFFER,
        2 * tarscan.BUFFER,
        positional.BLOCK,
        positional.HINT_AHEAD,
        fmt.WHOLE_PAYLOAD_LIMIT,
    }
)
#: Each side of every boundary below 32 MiB; past one above (they cost their bytes in every run).
SIZES = sorted(
    {0, 1, 511, 512, 513}
    | {size + d for size in BOUNDARIES if size < 32 * MiB for d in (-1, 0, 1)}
    | {size + 1 for size in BOUNDARIES if size >= 32 * MiB}
)
#: The C loop's buffer, and the size of the member before one whose header lies 512 bytes before
#: the buffer ends: the folder's header, that member's header and its bytes fill 4 MiB - 512.
BUFFER = tarscan.BUFFER
FILLER = BUFFER - 3 * 512


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``sizes/`` with a file of each size (``size-NNNNNNNNN``), and ``edge/``: a filler, then a
    file of the buffer's size and one byte whose header lies 512 bytes before the buffer ends."""
    root = tmp_path_factory.mktemp("sizes") / "src"
    (root / "sizes").mkdir(parents=True)
    for size in SIZES:
        (root / "sizes" / f"size-{size:09d}").write_bytes(_bytes(size))
    (root / "edge").mkdir()
    (root / "edge" / "a-filler").write_bytes(_bytes(FILLER))
    (root / "edge" / "b-past-the-buffer").write_bytes(_bytes(BUFFER + 1))
    (root / "edge" / "c-after").write_bytes(b"after")
    return root


def _bytes(size: int) -> bytes:
    """``size`` bytes of their own (seeded by the size): a byte read from the wrong place shows."""
    return random.Random(size).randbytes(size)


def digests(root: Path) -> dict[str, tuple[int, str]]:
    return {
        str(path.relative_to(root)): (path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest())
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def tar_of(tree: Path, folder: str, form: str, out: Path, *extra: str) -> Path:
    command = ["tar", f"--format={form}", "--sort=name", *extra, "-cf", out, "-C", tree, folder]
    subprocess.run(command, check=True, timeout=120)
    return out


#: Every path of a GNU tar, and the two of a pax one that read it where it lies; the rest of the
#: pax ones take the same stream readers as GNU's, and go to ``make test-all``.
CASES = [
    *(("gnu", path) for path in ("packed", "in-place", "expand-tars", "stdin", "tar.gz")),
    ("pax", "packed"),
    ("pax", "in-place"),
    *(pytest.param("pax", path, marks=pytest.mark.slow) for path in ("expand-tars", "stdin", "tar.gz")),
]
#: A fast gzip: the bytes are random, so a slower level only takes longer.
FAST_GZIP = "--use-compress-program=gzip -1"


@pytest.mark.parametrize(("form", "path"), CASES)
def test_members_of_every_size_read_back_byte_for_byte(
    tree: Path, tmp_path: Path, form: str, path: str
) -> None:
    extra = [FAST_GZIP] if path == "tar.gz" else []
    archive = tar_of(tree, "sizes", form, tmp_path / ("sizes.tar.gz" if extra else "sizes.tar"), *extra)
    flags = {"in-place": ["--in-place"], "expand-tars": ["--expand-tars"]}.get(path, [])
    dst = tmp_path / "dst"
    if path == "expand-tars":  # the tar as a member of another: its members' bytes at offsets of the outer
        outer = tmp_path / "outer.tar"
        outer.write_bytes(tar_bytes([("before.txt", b"before"), ("inner.tar", archive.read_bytes())]))
        archive = outer
    if path == "stdin":
        with open(archive, "rb") as f:
            done = subprocess.run([*DLFS, "-q", "pack", "-", dst], stdin=f, capture_output=True, timeout=300)
        assert done.returncode == 0, done.stderr
    else:
        dlfs("pack", archive, dst, *flags, timeout=300)
    with mounted(dst, tmp_path / "mnt") as mnt:
        got = digests(mnt / "inner" if path == "expand-tars" else mnt)
    assert got == _expected(tree, "sizes")


def _expected(tree: Path, folder: str) -> dict[str, tuple[int, str]]:
    return {name: value for name, value in digests(tree).items() if name.startswith(f"{folder}/")}


@pytest.mark.parametrize("form", ["gnu", "ustar", "oldgnu", "v7"])
@pytest.mark.parametrize("in_place", [False, True], ids=["packed", "in-place"])
def test_a_member_whose_header_lies_just_before_the_buffer_ends_reads_back(
    tree: Path, tmp_path: Path, form: str, in_place: bool
) -> None:
    """The C loop holds 4 MiB at a time: a member of 4 MiB + 1 whose header starts 512 bytes
    before that ends fits in no buffer the loop could fill, and ``tarfile``'s path takes it."""
    archive = tar_of(tree, "edge", form, tmp_path / "edge.tar")
    with tarfile.open(archive) as tar:
        offsets = {info.name: info.offset for info in tar.getmembers()}
    assert offsets["edge/b-past-the-buffer"] % BUFFER == BUFFER - 512, "the header where it must lie"
    dst = tmp_path / "dst"
    dlfs("pack", archive, dst, *(["--in-place"] if in_place else []))
    with mounted(dst, tmp_path / "mnt") as mnt:
        assert digests(mnt) == _expected(tree, "edge")


@pytest.mark.slow
@pytest.mark.parametrize("form", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT], ids=["base-256", "pax-size"])
def test_a_member_past_8_gib_is_served_in_place_to_its_last_byte(tmp_path: Path, form: int) -> None:
    """GNU tar writes a size past 8 GiB in base-256, pax in a ``size`` record: a crafted header,
    its 9 GiB of bytes a hole of the tar file (no disk), then a last member."""
    size = 9 << 30
    info = tarfile.TarInfo("big.bin")
    info.size, info.mtime = size, 1_600_000_000
    head = info.tobuf(form)
    after = io.BytesIO()
    with tarfile.open(fileobj=after, mode="w", format=form) as out:
        last = tarfile.TarInfo("after.txt")
        last.size = 5
        out.addfile(last, io.BytesIO(b"after"))
    archive = tmp_path / "big.tar"
    with open(archive, "wb") as f:
        f.write(head)
        f.seek(len(head) + size)  # a multiple of 512: the member's padding is nothing
        f.write(after.getvalue())
    dst = tmp_path / "dst"
    dlfs("pack", "--in-place", archive, dst, timeout=600)
    with mounted(dst, tmp_path / "mnt") as mnt:
        big = mnt / "big.bin"
        assert big.stat().st_size == size
        with open(big, "rb") as f:
            f.seek(size - 4096)
            assert f.read() == bytes(4096)
        assert (mnt / "after.txt").read_bytes() == b"after"
