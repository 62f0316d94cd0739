"""Tar members, read in one pass over a stream: Python's ``tarfile`` parses the headers (ustar,
GNU, pax; long and non-UTF-8 names, pax nanosecond mtimes, base-256 sizes, GNU sparse maps), and
the member bytes are read from the stream directly (``streams.Buffered``), which costs a few calls a
member where ``TarFile``'s own member files cost dozens.

With ``expand``, a member ``NAME.tar`` is read as a tar in its turn, on the same pass, and becomes
the folder ``NAME`` holding its members; its members' offsets are offsets in the outermost
stream, and they stay contiguous while every tar around them is.

Where the tar is read from a file, runs of plain members are taken in C (``tarscan``), and only
the other headers take ``tarfile``'s path.

A header's name prefix (bytes 345-500) is read only under POSIX's ``ustar\0`` magic, as GNU tar and
libarchive read it: under GNU's ``ustar  \0`` those bytes hold atime, ctime, a multi-volume offset
and a sparse map (``tar -G`` fills them), which ``tarfile`` would glue onto the name. GNU's other
member types are read as ``tar x`` reads them: a directory dump (``D``, ``tar -G``) is a folder, a
volume label (``V``) and an old names record (``N``) make nothing, and a multi-volume continuation
(``M``) is refused. A GNU sparse member (old GNU, pax 0.0, 0.1, 1.0) keeps its map: its stored
runs lie back to back in the tar, so it is one contiguous range (``Member.sparse``).

A tar ends with a zero block. A stream that ends before one, or a header cut short, is a truncated
archive; a damaged header past the first is an error too (``tarfile.TarFile`` stops quietly at
either, as if the archive had ended there).
"""

from __future__ import annotations

import logging
import os
import stat
import tarfile
from collections.abc import Iterator
from typing import Protocol

from dlfs.core.errors import PackError
from dlfs.pack.archive import members
from dlfs.pack.archive.members import HARDLINK, Member, Refused
from dlfs.pack.archive.streams import Bounded, Buffered
from dlfs.pack.archive.tarscan import FileRun, TarScanner

log = logging.getLogger(__name__)


class Readable(Protocol):
    def read(self, count: int = -1) -> bytes: ...


#: A member's data, read as it is consumed; None for members without data.
Data = Readable | None


#: The magic of a POSIX header (ustar, pax), the only one whose bytes 345-500 are a name prefix.
POSIX_MAGIC = b"ustar\0"
#: GNU tar's member types beyond POSIX's: a directory dump (a folder), a volume label, the old
#: names record, a file continued from the previous volume.
DUMPDIR, VOLUME, NAMES, MULTIVOLUME = b"D", b"V", b"N", b"M"


def _number(field: bytes) -> int:
    """A header's number field as ``tarfile.nti`` reads it, without its string round trip."""
    if field[0] in (0o200, 0o377):
        return tarfile.nti(field)
    end = field.find(b"\0")
    digits = (field if end < 0 else field[:end]).strip()
    return int(digits, 8) if digits else 0


class Header(tarfile.TarInfo):
    """``TarInfo`` with a faster ``frombuf`` for the common header (checksum and numbers in
    octal; not an old GNU sparse header), without ``tarfile``'s string round trip per number field,
    the larger part of a tiny member's cost. Anything else goes to ``tarfile``'s own, which raises
    its own errors; the two agree on every header (``tests/pack/test_archive_fuzz.py``)."""

    __slots__ = ()

    @classmethod
    def frombuf(cls, buf: bytes, encoding: str, errors: str) -> tarfile.TarInfo:
        if len(buf) != tarfile.BLOCKSIZE or buf[156:157] == tarfile.GNUTYPE_SPARSE:
            return posix_prefix_only(super().frombuf(buf, encoding, errors), buf, encoding, errors)
        try:
            chksum = _number(buf[148:156])
            if chksum != 256 + sum(buf[:148]) + sum(buf[156:]):  # a signed sum, or a bad header
                return posix_prefix_only(super().frombuf(buf, encoding, errors), buf, encoding, errors)
            mode, uid, gid, size, mtime, devmajor, devminor = map(
                _number,
                (
                    buf[100:108],
                    buf[108:116],
                    buf[116:124],
                    buf[124:136],
                    buf[136:148],
                    buf[329:337],
                    buf[337:345],
                ),
            )
        except ValueError:
            return posix_prefix_only(super().frombuf(buf, encoding, errors), buf, encoding, errors)
        obj = cls()
        obj.name = tarfile.nts(buf[0:100], encoding, errors)
        obj.mode, obj.uid, obj.gid, obj.size, obj.mtime, obj.chksum = mode, uid, gid, size, mtime, chksum
        obj.type = buf[156:157]
        obj.linkname = tarfile.nts(buf[157:257], encoding, errors)
        obj.uname = tarfile.nts(buf[265:297], encoding, errors)
        obj.gname = tarfile.nts(buf[297:329], encoding, errors)
        obj.devmajor, obj.devminor = devmajor, devminor
        prefix = tarfile.nts(buf[345:500], encoding, errors) if buf[257:263] == POSIX_MAGIC else ""
        if obj.type == tarfile.AREGTYPE and obj.name.endswith("/"):
            obj.type = tarfile.DIRTYPE
        if obj.isdir():
            obj.name = obj.name.rstrip("/")
        if prefix and obj.type not in tarfile.GNU_TYPES:
            obj.name = prefix + "/" + obj.name
        return obj


def posix_prefix_only(info: tarfile.TarInfo, buf: bytes, encoding: str, errors: str) -> tarfile.TarInfo:
    """``info`` as ``tarfile`` read it, its name without the prefix ``tarfile`` takes from a header
    that is not POSIX's (the module docstring says why)."""
    if buf[257:263] != POSIX_MAGIC and info.type not in tarfile.GNU_TYPES and buf[345:500].strip(b"\0"):
        name = tarfile.nts(buf[0:100], encoding, errors)
        info.name = name.rstrip("/") if info.isdir() else name
    return info


class _Headers:
    """What ``tarfile.TarInfo.fromtarfile`` reads headers through: the stream, where the next
    header starts (``offset``), the name encoding, and the pax global headers met so far."""

    encoding = "utf-8"
    errors = "surrogateescape"

    def __init__(self, fileobj: Buffered) -> None:
        self.fileobj = fileobj
        self.offset = 0
        self.pax_headers: dict[str, str] = {}


def tar_members(
    stream: Buffered,
    name: str,
    expand: bool,
    prefix: bytes = b"",
    base: int = 0,
    contiguous: bool = True,
    scanner: TarScanner | None = None,
    end: int = 0,
    nested: bool = False,
) -> Iterator[tuple[Member, Data] | FileRun]:
    """Every member of the tar in ``stream`` (``name`` for messages), its path under ``prefix``,
    each with its data to read before the next is asked for. With a ``scanner`` (the stream is a
    file's, the tar's bytes lie in it from ``base`` to ``end``), runs of plain members come as
    ``FileRun``s, their bytes not read from the stream. ``nested``: the tar is a member named
    ``NAME.tar`` of another archive, which may be no tar at all."""
    headers = _Headers(stream)
    while True:
        if scanner is not None and contiguous and not headers.pax_headers:  # global pax headers apply to all
            run, after = scanner.run(base + headers.offset, end, prefix, expand)
            if run is not None:
                headers.offset = after - base
                yield run
                continue
        stream.skip_to(headers.offset)
        info = _next_header(headers, name, nested)
        if info is None:
            return
        member = _member(info, prefix, base, contiguous, base + headers.offset)
        if member is None:
            continue
        regular = member.kind == stat.S_IFREG and not member.problem
        data = Bounded(stream, member.stored) if regular else None
        folder = members.expanded_folder(member.path) if expand and member.sparse is None else None
        if folder is not None and data is not None:
            yield members.folder_of(member, folder), None
            inner = Buffered(data)  # type: ignore[arg-type]
            label = f"{name}: {members.show(member.path)}"
            yield from tar_members(
                inner,
                label,
                expand,
                folder,
                member.offset,
                member.contiguous,
                scanner,
                member.offset + info.size,
                nested=True,
            )
            continue
        yield member, data


def _next_header(headers: _Headers, name: str, nested: bool) -> tarfile.TarInfo | None:
    """The next member's header; None at the end-of-archive marker. The first one of a ``nested``
    tar that does not parse says it is no tar."""
    at = headers.offset
    try:
        return Header.fromtarfile(headers)  # type: ignore[arg-type]
    except tarfile.EOFHeaderError:
        return None
    except (tarfile.EmptyHeaderError, tarfile.TruncatedHeaderError):
        raise PackError(
            f"{name} ends without tar's end-of-archive marker: it is cut short (download it again)"
        ) from None
    except (tarfile.HeaderError, ValueError, UnicodeError, OverflowError) as exc:
        # tarfile's parse of a damaged header or its pax records raises more than HeaderError: a
        # GNU sparse map that is not numbers (ValueError), a record that is not UTF-8.
        if at == 0 and nested:
            raise PackError(
                f"{name} is not a tar ({exc}); pack without --expand-tars to keep it a file"
            ) from None
        raise PackError(f"{name} has a damaged header at byte {at:,} ({exc}); download it again") from None


def _member(
    info: tarfile.TarInfo, prefix: bytes, base: int, contiguous: bool, data_end: int
) -> Member | None:
    """The member ``info`` describes, under ``prefix``, its data region ending at ``data_end`` in the
    stream; None for a device or FIFO (left out, as the directory walk leaves them) and for the GNU
    records that make nothing (``VOLUME``, ``NAMES``)."""
    if info.ischr() or info.isblk() or info.isfifo():
        log.warning("skipping special file %s", info.name)
        return None
    if info.type in (VOLUME, NAMES):
        log.info(
            "skipping GNU tar's %s record %s", "volume label" if info.type == VOLUME else "names", info.name
        )
        return None
    raw = os.fsencode(info.name)
    kind = (
        stat.S_IFDIR
        if info.isdir() or info.type == DUMPDIR
        else stat.S_IFLNK
        if info.issym()
        else HARDLINK
        if info.islnk()
        else stat.S_IFREG
    )
    member = Member(
        b"",
        kind,
        members.SYMLINK_MODE if kind == stat.S_IFLNK else members.permissions(info.mode),
        info.uid,
        info.gid,
        members.mtime_ns(info.mtime, info.pax_headers.get("mtime")),
        info.size if kind == stat.S_IFREG else 0,
        offset=base + info.offset_data,
        contiguous=contiguous,
    )
    try:
        if info.type == MULTIVOLUME:
            raise Refused(
                f"member {members.show(raw)} continues a file from the previous volume of a multi-volume "
                "archive; join the volumes (tar --multi-volume -x, then tar -c) and pack the result"
            )
        path = members.normalize(raw)
        if raw.startswith(b"/"):
            log.warning("removing the leading '/' from member %s", members.show(raw))
        if kind == stat.S_IFLNK:
            member.target = os.fsencode(info.linkname)
            members.check_symlink(path, member.target)
        elif kind == HARDLINK:
            member.target = _join(prefix, members.normalize(os.fsencode(info.linkname)))
        members.check_owner(path, info.uid, info.gid)
        if info.sparse is not None and kind == stat.S_IFREG:
            member.sparse = _sparse_map(path, info.sparse, info.size, data_end - info.offset_data)
        if not path and kind != stat.S_IFDIR:
            raise Refused(f"member {info.name!r} names the root of the tree but is not a directory")
    except Refused as exc:
        member.problem = str(exc)
        path = raw
    member.path = _join(prefix, path)
    return member


def _sparse_map(
    path: bytes, runs: list[tuple[int, int]], size: int, room: int
) -> tuple[tuple[int, int], ...]:
    """A GNU sparse member's runs of data (offset in the file, length), without the empty ones GNU tar
    ends a map with; refused unless they ascend without overlap inside the file and their bytes fit
    the ``room`` its data region has in the tar."""
    kept = tuple((offset, length) for offset, length in runs if length)
    end = 0
    for offset, length in kept:
        if offset < end or offset + length > size:
            raise Refused(
                f"sparse member {members.show(path)} has a damaged map (its runs overlap or leave the file)"
            )
        end = offset + length
    if sum(length for _, length in kept) > room:
        raise Refused(f"sparse member {members.show(path)} maps more bytes than the tar holds for it")
    return kept


def _join(prefix: bytes, path: bytes) -> bytes:
    return prefix + b"/" + path if prefix and path else prefix or path
