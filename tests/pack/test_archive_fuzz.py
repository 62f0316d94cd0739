"""Fuzzing the tar and zip readers: a damaged or crafted archive packs into a sound dataset or is
refused with one ``PackError``; never another exception, a hang, or a dataset half published.

Each example mutates a real archive (``mutations``: bit flips, cuts, inserted bytes, header fields
set to values such as 2^33 or base-256 sizes) written by GNU tar, Python's ``tarfile`` or Info-ZIP,
plain or compressed. What packs must load as an index whose tree is sound and whose files read back.
"""

from __future__ import annotations

import shutil
import stat
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
from archives import seal
from hypothesis import given
from hypothesis import strategies as st
from index_checks import assert_sound
from mutations import FUZZ, OUTCOMES, SECONDS_PER_EXAMPLE, SEEDS, Seeds, mutate
from waits import bound

from dlfs.core import format as fmt
from dlfs.core.errors import PackError
from dlfs.core.file_bytes import FileBytes
from dlfs.core.index import Index
from dlfs.core.ram_cache import RamCache
from dlfs.core.store.local import LocalStore
from dlfs.pack import PackOptions, pack
from dlfs.pack.archive.tar import Header, posix_prefix_only


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
    assert time.monotonic() - started < bound(SECONDS_PER_EXAMPLE)
    return packed


def assert_readable(dst: Path) -> None:
    """The dataset loads, its tree is sound (``assert_sound``), and every file reads back intact."""
    store = LocalStore(dst)
    try:
        index = Index.load(store)
        file_bytes = FileBytes(index, store, RamCache(1 << 20))
        assert_sound(index)
        for row in np.flatnonzero(index.mode & fmt.TYPE_MASK == stat.S_IFREG).tolist():
            assert len(file_bytes.load(row)) == int(index.size[row])
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
