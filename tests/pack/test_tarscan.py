"""The C loop over plain tar members (``tarscan``) against the Python reader: the same tar read with
and without it gives the same members (paths, attributes, places, checksums) or the same refusal,
on odd headers written on purpose and on mutated archives; and it takes the common member itself."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest
import xxhash
from archives import seal
from hypothesis import given
from hypothesis import strategies as st
from mutations import FUZZ, Seeds, mutate

from dlfs.core.errors import PackError
from dlfs.pack.archive.members import Member
from dlfs.pack.archive.streams import Buffered, reading
from dlfs.pack.archive.tar import Readable, tar_members
from dlfs.pack.archive.tarscan import FileRun, TarScanner

pytestmark = pytest.mark.skipif(not TarScanner.available(), reason="_tarscan.so is not built")

#: What a reader made of a tar: each member as a tuple, how many the C loop took, or the refusal.
Outcome = tuple[list[tuple[object, ...]], int] | str


def read(tar: Path, expand: bool, native: bool) -> Outcome:
    """Every member of ``tar`` as the pass sees it, with or without the C loop."""
    with open(tar, "rb", buffering=0) as file:
        fd = file.fileno()
        scanner = (
            TarScanner(lambda view, at: os.preadv(fd, [view], at), checksum=True, held=False)
            if native
            else None
        )
        members = tar_members(Buffered(file), tar.name, expand, scanner=scanner, end=os.fstat(fd).st_size)
        out: list[tuple[object, ...]] = []
        taken = 0
        try:
            with reading(tar.name, "tar"):
                for item in members:
                    if isinstance(item, FileRun):
                        taken += len(item)
                        out += [_run_member(item, k) for k in range(len(item))]
                        continue
                    member, data = item
                    out.append(_member(member, _digest(data) if data is not None else None))
        except PackError as exc:
            return str(exc)
        finally:
            if scanner is not None:
                scanner.close()
    return out, taken


def _digest(data: Readable) -> int:
    """The checksum of a member's bytes, read a piece at a time (a mutated size may claim 2^63)."""
    hasher = xxhash.xxh3_64()
    while chunk := data.read(1 << 20):
        hasher.update(chunk)
    return hasher.intdigest()


def _member(member: Member, digest: int | None) -> tuple[object, ...]:
    return (
        member.path, member.kind, member.mode, member.uid, member.gid, member.mtime_ns, member.size,
        member.target, member.offset, member.contiguous, member.problem, digest,
    )  # fmt: skip


def _run_member(run: FileRun, k: int) -> tuple[object, ...]:
    return (
        run.path(k), stat.S_IFREG, int(run.modes[k]), int(run.uids[k]), int(run.gids[k]),
        int(run.mtimes_ns[k]), int(run.sizes[k]), b"", int(run.offsets[k]), True, "", int(run.checksums[k]),
    )  # fmt: skip


def agree(tar: Path, expand: bool = True) -> Outcome:
    """What both readers make of ``tar``, which must be the same."""
    python, native = read(tar, expand, native=False), read(tar, expand, native=True)
    if isinstance(python, str) or isinstance(native, str):
        assert native == python
        return native
    assert native[0] == python[0]
    return native


def tar_of(path: Path, *members: tuple[tarfile.TarInfo, bytes], format: int = tarfile.GNU_FORMAT) -> Path:
    with tarfile.open(path, "w", format=format) as tar:
        for info, data in members:
            info.size = len(data) if info.type in tarfile.REGULAR_TYPES else 0
            tar.addfile(info, io.BytesIO(data))
    return path


def info(name: str, kind: bytes = tarfile.REGTYPE, **fields: object) -> tarfile.TarInfo:
    out = tarfile.TarInfo(name)
    out.type, out.mode, out.mtime = kind, 0o644, 1_700_000_000
    for key, value in fields.items():
        setattr(out, key, value)
    return out


def test_plain_members_are_taken_by_the_c_loop(tmp_path: Path) -> None:
    tar = tar_of(tmp_path / "a.tar", *((info(f"./cls/img-{k}.jpg"), os.urandom(k * 700)) for k in range(50)))
    members, taken = agree(tar)  # type: ignore[misc]
    assert taken == 50
    assert members[3][0] == b"cls/img-3.jpg"


def test_names_of_exactly_100_bytes_and_ustar_prefixes_agree(tmp_path: Path) -> None:
    long_folder = "d" * 150
    tar = tar_of(
        tmp_path / "a.tar",
        (info("n" * 100), b"exactly one hundred"),
        (info(f"{long_folder}/{'f' * 99}"), b"prefix and name"),
        (info(f"{long_folder}/./x//y.bin"), b"dots and slashes"),
        format=tarfile.USTAR_FORMAT,
    )
    members, taken = agree(tar)  # type: ignore[misc]
    assert taken == 3
    assert [m[0] for m in members] == [
        b"n" * 100,
        f"{long_folder}/{'f' * 99}".encode(),
        f"{long_folder}/x/y.bin".encode(),
    ]


def test_base_256_numbers_agree(tmp_path: Path) -> None:
    tar = bytearray(
        tar_of(tmp_path / "a.tar", (info("big.bin"), b"x" * 1000), (info("after"), b"y")).read_bytes()
    )
    tar[124:136] = b"\x80" + (1000).to_bytes(11, "big")  # the size in base-256, as GNU tar writes a large one
    tar[136:148] = b"\x80" + (2**33).to_bytes(11, "big")  # an mtime in base-256 too
    seal(tar, 0)
    (tmp_path / "a.tar").write_bytes(tar)
    members, taken = agree(tmp_path / "a.tar")  # type: ignore[misc]
    assert taken == 2 and members[0][5] == 2**33 * 10**9


def test_pax_records_and_odd_members_go_to_the_python_reader(tmp_path: Path) -> None:
    nanosecond = info("pax/exact.bin")
    nanosecond.pax_headers = {"mtime": "1700000000.123456789"}
    link = info("pax/link", tarfile.SYMTYPE, linkname="exact.bin")
    tar = tar_of(
        tmp_path / "a.tar",
        (info("pax", tarfile.DIRTYPE), b""),
        (nanosecond, b"pax"),
        (info("p" * 300), b"a pax path"),
        (link, b""),
        (info("pax/plain.bin"), b"plain"),
        (info("/abs.bin"), b"a leading slash"),
        (info("up/../x.bin"), b"dot dot"),
        format=tarfile.PAX_FORMAT,
    )
    members, taken = agree(tar)  # type: ignore[misc]
    assert [m[0] for m in members][:5] == [
        b"pax",
        b"pax/exact.bin",
        b"p" * 300,
        b"pax/link",
        b"pax/plain.bin",
    ]
    assert members[1][5] == 1_700_000_000_123_456_789
    assert taken == 1  # pax/plain.bin: the others need pax records, a warning or a refusal


def test_nested_tars_are_read_by_both(tmp_path: Path) -> None:
    inner = tar_of(tmp_path / "inner.tar", *((info(f"img-{k}.jpg"), os.urandom(300)) for k in range(5)))
    tar = tar_of(tmp_path / "a.tar", (info("cls.tar"), inner.read_bytes()), (info("top.txt"), b"top"))
    members, taken = agree(tar)  # type: ignore[misc]
    assert taken == 6 and members[1][0] == b"cls/img-0.jpg"
    assert members[1][8] == 512 + 512  # its bytes after two headers in the outer tar


def test_a_damaged_header_or_cut_data_is_refused_as_before(tmp_path: Path) -> None:
    raw = tar_of(tmp_path / "a.tar", *((info(f"f{k}"), b"z" * 600) for k in range(3))).read_bytes()
    damaged = bytearray(raw)
    damaged[1536 + 10] ^= 0xFF  # the second header's name, its checksum left as it was
    (tmp_path / "damaged.tar").write_bytes(damaged)
    assert "damaged header" in agree(tmp_path / "damaged.tar")  # type: ignore[operator]
    (tmp_path / "cut.tar").write_bytes(raw[: 1536 + 512 + 100])
    assert "cut short" in agree(tmp_path / "cut.tar")  # type: ignore[operator]


@FUZZ
@given(data=st.data())
def test_the_c_loop_agrees_with_the_python_reader_on_mutated_tars(
    archives: Seeds,
    tmp_path: Path,
    data: st.DataObject,
) -> None:
    raw = bytearray(mutate(archives[data.draw(st.sampled_from(["gnu.tar", "tarfile.tar"]))], data))
    if data.draw(st.booleans()):  # reseal the headers, so that mutated fields get past the checksum
        for at in range(0, len(raw) - 511, 512):
            if raw[at + 257 : at + 262] == b"ustar":
                seal(raw, at)
    tar = tmp_path / "fuzz.tar"
    tar.write_bytes(raw)
    agree(tar, data.draw(st.booleans()))


@pytest.mark.parametrize("magic", [b"ustar  \0", b"\0" * 8], ids=["gnu", "v7"])
def test_a_name_prefix_is_read_only_under_posix_magic(tmp_path: Path, magic: bytes) -> None:
    """Bytes 345-500 are a name prefix only under ``ustar\\0``: under GNU's magic they hold times
    (``tar -G``), under none (v7) nothing; both readers then take the name field alone."""
    tar = bytearray(
        tar_of(tmp_path / "a.tar", (info("dir/file"), b"data"), (info("other"), b"o")).read_bytes()
    )
    for at in (0, 1024):
        tar[at + 257 : at + 265] = magic
        tar[at + 345 : at + 357] = b"14130613451\0"
        seal(tar, at)
    (tmp_path / "a.tar").write_bytes(tar)
    members, taken = agree(tmp_path / "a.tar")  # type: ignore[misc]
    assert taken == 2 and [m[0] for m in members] == [b"dir/file", b"other"]
