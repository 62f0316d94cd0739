"""Fuzzing the tar and zip readers: a damaged or crafted archive packs into a sound dataset or is
refused with one ``PackError``; never another exception, a hang, or a dataset half published.

Each example mutates a real archive (bit flips, cuts, inserted bytes, header fields set to values
such as 2^33 or base-256 sizes) written by GNU tar, Python's ``tarfile`` or Info-ZIP, plain or
compressed. What packs must load as an index whose tree is sound and whose files read back.

``make test`` runs ``DEFAULT_EXAMPLES`` examples per test; ``DLFS_FUZZ_EXAMPLES=100000`` runs more.
"""

from __future__ import annotations

import io
import os
import random
import shutil
import stat
import subprocess
import tarfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from archives import seal
from conftest import assert_sound, fuzz_examples, fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

from dlfs.core import format as fmt
from dlfs.core.cache import PayloadCache
from dlfs.core.errors import PackError
from dlfs.core.index import Index
from dlfs.core.reader import Reader
from dlfs.core.store.local import LocalStore
from dlfs.pack import PackOptions, pack
from dlfs.pack.archive.tar import Header, posix_prefix_only

DEFAULT_EXAMPLES = 300
EXAMPLES = fuzz_examples(DEFAULT_EXAMPLES)
SECONDS_PER_EXAMPLE = 5.0
INTERESTING = [0, 1, 7, 8, 511, 512, 513, 2**31, 2**32, 2**33, 2**60, 2**63 - 1]

FUZZ = fuzz_settings(EXAMPLES)
#: The archives the examples start from (``archives``).
SEEDS = [
    "gnu.tar",
    "pax.tar.gz",
    "tarfile.tar",
    "info.zip",
    "stored.zip",
    "incremental-sparse.tar",
    "pax-sparse.tar",
]


def make_tree(root: Path) -> Path:
    """Folders, long and odd names, a symlink and a hard link, files small and larger."""
    rng = random.Random(36)
    for folder in ("cats", "dogs/puppies", "x" * 120 + "/" + "y" * 120):
        (root / folder).mkdir(parents=True)
        for k in range(3):
            (root / folder / f"img-{k}.jpg").write_bytes(rng.randbytes(rng.randint(0, 2000)))
    (root / "readme.txt").write_bytes(b"an archive for fuzzing\n" * 30)
    os.link(root / "readme.txt", root / "cats" / "readme-again.txt")
    (root / "latest").symlink_to("dogs/puppies")
    os.mkfifo(root / "fifo")
    return root


class Seeds(dict[str, bytes]):
    """The archives the examples mutate; named, not dumped, in a failing example's report."""

    def __repr__(self) -> str:
        return f"Seeds({', '.join(self)})"


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> Seeds:
    work = tmp_path_factory.mktemp("archive-fuzz")
    src = make_tree(work / "src")
    out = Seeds()
    for name, flags in {"gnu.tar": ["--format=gnu"], "pax.tar.gz": ["--format=pax", "-z"]}.items():
        subprocess.run(["tar", *flags, "-cf", work / name, "-C", src, "."], check=True, timeout=60)
        out[name] = (work / name).read_bytes()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(src / "cats", arcname="cats")
        tar.add(src / "readme.txt", arcname="/abs/readme.txt")
    out["tarfile.tar"] = buffer.getvalue()
    (src / "fifo").unlink()
    subprocess.run(["zip", "-q", "-r", "-y", work / "info.zip", "."], cwd=src, check=True, timeout=60)
    out["info.zip"] = (work / "info.zip").read_bytes()
    subprocess.run(["zip", "-q", "-r", "-y", "-0", work / "stored.zip", "."], cwd=src, check=True, timeout=60)
    out["stored.zip"] = (work / "stored.zip").read_bytes()
    with open(src / "cats" / "sparse.bin", "wb") as f:  # runs of data between holes
        for at in (5000, 70_000, 200_000):
            f.seek(at)
            f.write(rng_bytes(at))
    for name, flags in {
        "incremental-sparse.tar": ["--format=gnu", "-S", "-g", str(work / "snapshot")],
        "pax-sparse.tar": ["--format=pax", "--sparse", "--sparse-version=1.0"],
    }.items():
        subprocess.run(["tar", *flags, "-cf", work / name, "-C", src, "."], check=True, timeout=60)
        out[name] = (work / name).read_bytes()
    return out


def rng_bytes(seed: int) -> bytes:
    return random.Random(seed).randbytes(3000)


def mutate(raw: bytes, data: st.DataObject) -> bytes:
    """One to three mutations of ``raw``."""
    out = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 3))):
        if not out:
            break
        at = data.draw(st.integers(0, max(len(out) - 1, 0)))
        kind = data.draw(st.sampled_from(["flip", "cut", "insert", "octal", "base256", "byte"]))
        if kind == "flip":
            out[at] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "cut":
            del out[at:]
        elif kind == "insert":
            out[at:at] = data.draw(st.binary(min_size=1, max_size=600))
        elif kind == "byte":
            out[at] = data.draw(st.sampled_from([0, 0x2F, 0x2E, 0x30, 0x35, 0x78, 0x4C, 0xFF]))
        else:  # a tar size or mtime field, or a zip size (at the block's field or anywhere)
            block = at - at % 512 + data.draw(st.sampled_from([100, 108, 116, 124, 136]))
            value = data.draw(st.sampled_from(INTERESTING))
            field = (
                f"{value % 8**11:011o}\0".encode()
                if kind == "octal"
                else b"\x80" + (value % 2**64).to_bytes(11, "big")
            )
            where = block if block + 12 <= len(out) else at
            out[where : where + 12] = field
    return bytes(out)


#: Outcomes of the examples of the running test.
OUTCOMES: Counter[str] = Counter()


@pytest.fixture
def report(request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]) -> Iterator[None]:
    """Print how many examples packed and how many were refused; fail if too few ran."""
    OUTCOMES.clear()
    yield
    with capsys.disabled():
        print(f"\n{request.node.name}: {OUTCOMES['packed']} packed, {OUTCOMES['refused']} refused")
    assert OUTCOMES.total() >= min(EXAMPLES, 50)


def pack_or_refuse(raw: bytes, name: str, work: Path, skip_errors: bool, expand: bool) -> bool:
    """Pack ``raw``; it must give a sound dataset or a one-line PackError and nothing published.
    Whether it packed."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    src, dst = work / name, work / "dst"
    src.write_bytes(raw)
    started = time.monotonic()
    try:
        pack(
            src,
            dst,
            PackOptions(progress=False, shard_size=4096, skip_errors=skip_errors, expand_tars=expand),
        )
    except PackError as exc:  # anything else is a bug: an InternalError fails the example
        assert "\n" not in str(exc)
        assert not dst.exists(), "a refused pack leaves nothing behind"
        packed = False
    else:
        assert_readable(dst)
        packed = True
    OUTCOMES["packed" if packed else "refused"] += 1
    assert {p.name for p in work.iterdir()} <= {name, "dst"}
    assert time.monotonic() - started < SECONDS_PER_EXAMPLE
    return packed


def assert_readable(dst: Path) -> None:
    """The dataset loads, its tree is sound (``assert_sound``), and every file reads back intact."""
    store = LocalStore(dst)
    try:
        index = Index.load(store)
        reader = Reader(index, store, PayloadCache(1 << 20))
        assert_sound(index)
        for row in np.flatnonzero(index.mode & fmt.TYPE_MASK == stat.S_IFREG).tolist():
            assert len(reader.load(row)) == int(index.size[row])
    finally:
        store.close()


@pytest.mark.parametrize("name", SEEDS)
@FUZZ
@given(data=st.data())
def test_a_mutated_archive_packs_soundly_or_is_refused_in_one_line(
    archives: Seeds, tmp_path: Path, report: None, name: str, data: st.DataObject
) -> None:
    raw = mutate(archives[name], data)
    pack_or_refuse(raw, name, tmp_path / "work", data.draw(st.booleans()), data.draw(st.booleans()))


def test_the_unmutated_archives_pack(archives: Seeds, tmp_path: Path) -> None:
    """The seeds themselves pack (so the fuzz starts from archives that work)."""
    for name, raw in archives.items():
        assert pack_or_refuse(raw, name, tmp_path / name.replace(".", "-"), False, False), name


def header_of(info: tarfile.TarInfo | None, error: Exception | None) -> object:
    """What a header parse gave: its attributes, or its error's type."""
    if error is not None:
        return type(error)
    assert info is not None
    return {name: getattr(info, name, None) for name in tarfile.TarInfo.__slots__}, getattr(
        info, "_sparse_structs", None
    )


def parse(parser: type[tarfile.TarInfo], buf: bytes) -> object:
    try:
        return header_of(parser.frombuf(buf, "utf-8", "surrogateescape"), None)
    except Exception as exc:
        return header_of(None, exc)


@FUZZ
@given(data=st.data())
def test_the_fast_header_parser_agrees_with_tarfile_on_every_header(
    archives: Seeds, data: st.DataObject
) -> None:
    raw = archives[data.draw(st.sampled_from(["gnu.tar", "tarfile.tar", "incremental-sparse.tar"]))]
    blocks = [raw[at : at + 512] for at in range(0, len(raw), 512) if raw[at : at + 512].strip(b"\0")]
    buf = mutate(data.draw(st.sampled_from(blocks)), data)[:512]
    if data.draw(st.booleans()):  # reseal, so that the parse gets past the checksum
        fixed = bytearray(buf.ljust(512, b"\0"))
        seal(fixed, 0)
        buf = bytes(fixed)
    assert parse(Header, buf) == parse(PosixPrefixOnly, buf)


class PosixPrefixOnly(tarfile.TarInfo):
    """``tarfile``'s own parse, with the one rule dlfs reads differently (``tar.posix_prefix_only``)."""

    @classmethod
    def frombuf(cls, buf: bytes, encoding: str, errors: str) -> tarfile.TarInfo:
        return posix_prefix_only(tarfile.TarInfo.frombuf(buf, encoding, errors), buf, encoding, errors)
