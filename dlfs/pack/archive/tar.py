"""Tar members, read in one pass over a stream with Python's ``tarfile`` (ustar, GNU, pax; long
and non-UTF-8 names, pax nanosecond mtimes, base-256 sizes, GNU sparse files).

With ``expand``, a member ``NAME.tar`` is read as a tar in its turn, on the same pass, and becomes
the folder ``NAME`` holding its members; its members' offsets are offsets in the outermost
stream, and they stay contiguous while every tar around them is.
"""

from __future__ import annotations

import logging
import os
import stat
import tarfile
from collections.abc import Iterator
from typing import BinaryIO

from dlfs.core.errors import PackError
from dlfs.pack.archive import members
from dlfs.pack.archive.members import HARDLINK, Member, Refused
from dlfs.pack.archive.streams import Counted

log = logging.getLogger(__name__)

#: A member's data, read as it is consumed; None for members without data.
Data = BinaryIO | None


def tar_members(
    stream: Counted, name: str, expand: bool, prefix: bytes = b"", base: int = 0, contiguous: bool = True
) -> Iterator[tuple[Member, Data]]:
    """Every member of the tar in ``stream`` (``name`` for messages), its path under ``prefix``,
    each with its data to read before the next is asked for."""
    try:
        archive = tarfile.open(fileobj=stream, mode="r|", encoding="utf-8", errors="surrogateescape")
    except tarfile.ReadError as exc:
        raise PackError(f"{name} is not a tar ({exc}); pack the file it came in instead") from None
    with archive:
        while (info := archive.next()) is not None:
            archive.members.clear()  # tarfile keeps every member it read; a pass needs none of them
            member = _member(info, prefix, base, contiguous and not info.issparse())
            if member is None:
                continue
            data = archive.extractfile(info) if info.isreg() else None
            if expand and data is not None and not member.problem and member.path.endswith(b".tar"):
                folder = member.path[: -len(b".tar")]
                yield members.folder_of(member, folder), None
                inner = Counted(data)  # type: ignore[arg-type]
                yield from tar_members(
                    inner,
                    f"{name}: {members.show(member.path)}",
                    expand,
                    folder,
                    member.offset,
                    member.contiguous,
                )
                continue
            yield member, data
        _check_ended(stream, archive.offset, name)


def _check_ended(stream: Counted, offset: int, name: str) -> None:
    """``tarfile`` stops quietly at a header cut short or at the end of the stream; a whole tar
    ends with a zero block, which it read past ``offset``."""
    if stream.position < offset + tarfile.BLOCKSIZE:
        raise PackError(
            f"{name} ends without tar's end-of-archive marker: it is cut short (download it again)"
        )


def _member(info: tarfile.TarInfo, prefix: bytes, base: int, contiguous: bool) -> Member | None:
    """The member ``info`` describes, under ``prefix``; None for a device or FIFO (left out, as
    the directory walk leaves them)."""
    if info.ischr() or info.isblk() or info.isfifo():
        log.warning("skipping special file %s", info.name)
        return None
    raw = os.fsencode(info.name)
    kind = (
        stat.S_IFDIR
        if info.isdir()
        else stat.S_IFLNK
        if info.issym()
        else HARDLINK
        if info.islnk()
        else stat.S_IFREG
    )
    member = Member(
        b"",
        kind,
        members.permissions(info.mode),
        info.uid,
        info.gid,
        members.mtime_ns(info.mtime, info.pax_headers.get("mtime")),
        info.size if kind == stat.S_IFREG else 0,
        offset=base + info.offset_data,
        contiguous=contiguous,
    )
    try:
        path = members.normalize(raw)
        if raw.startswith(b"/"):
            log.warning("removing the leading '/' from member %s", members.show(raw))
        if kind == stat.S_IFLNK:
            member.target = os.fsencode(info.linkname)
            members.check_symlink(path, member.target)
        elif kind == HARDLINK:
            member.target = _join(prefix, members.normalize(os.fsencode(info.linkname)))
        members.check_owner(path, info.uid, info.gid)
        if not path and kind != stat.S_IFDIR:
            raise Refused(f"member {info.name!r} names the root of the tree but is not a directory")
    except Refused as exc:
        member.problem = str(exc)
        path = raw
    member.path = _join(prefix, path)
    return member


def _join(prefix: bytes, path: bytes) -> bytes:
    return prefix + b"/" + path if prefix and path else prefix or path
