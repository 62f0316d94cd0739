"""Zip members, read with Python's ``zipfile`` in the order their bytes lie in the file.

A zip is untrusted like a tar, and has its own lies to tell: sizes in its directory that its data
does not match (each member's bytes are counted and checked against its CRC), members whose data
overlap (the way a small zip expands into petabytes), and a total that expands past EXPANSION_MAX
times the file. Modes, symlinks and the UTC mtime come from the Unix fields Info-ZIP writes;
without them a member's time is its local DOS time, as ``unzip`` reads it.
"""

from __future__ import annotations

import os
import stat
import struct
import time
import zipfile
from collections.abc import Iterator
from typing import BinaryIO

from dlfs.core import format as fmt
from dlfs.core.errors import PackError
from dlfs.pack.archive import members
from dlfs.pack.archive.members import EXPANSION_MAX, Member, Refused
from dlfs.pack.archive.streams import Buffered, checked_read
from dlfs.pack.archive.tar import tar_members

#: A local file header's fixed part, and the field where its name's length starts.
LOCAL_HEADER = struct.Struct("<4s22xHH")
#: Info-ZIP's extended timestamp extra field.
EXTENDED_TIME = 0x5455
#: The flag of a member whose name is UTF-8.
UTF8_NAME = 0x800
#: ``create_system`` of a zip written on Unix, whose ``external_attr`` holds a mode.
UNIX = 3


def zip_members(
    file: BinaryIO, name: str, uid: int, gid: int, expand: bool
) -> Iterator[tuple[Member, BinaryIO | None]]:
    """Every member of the zip ``file``, owned by ``uid``:``gid`` (a zip records no owners that
    ``unzip`` restores by default), each with its data to read before the next is asked for; with
    ``expand``, a member ``NAME.tar`` is read as the folder ``NAME`` (``tar.tar_members``)."""
    try:
        archive = zipfile.ZipFile(file)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, struct.error) as exc:
        raise PackError(f"cannot read {name} as zip: {exc}; the archive is damaged or cut short") from None
    with archive:
        infos = sorted(archive.infolist(), key=lambda info: info.header_offset)
        _check_sizes(infos, file, name)
        for info in infos:
            member = _member(info, file, uid, gid)
            if member.problem or member.kind == stat.S_IFDIR:
                yield member, None
                continue
            if info.flag_bits & 0x1:
                raise PackError(f"{name}: member {info.filename} is encrypted; unzip it and pack the folder")
            try:
                data = archive.open(info)
            except NotImplementedError as exc:
                raise PackError(
                    f"{name}: member {info.filename}: {exc}; unzip it and pack the folder"
                ) from None
            folder = members.expanded_folder(member.path) if expand else None
            if member.kind == stat.S_IFLNK:
                if info.file_size > fmt.LINK_MAX:  # never read a "target" of any size into memory
                    member.problem = f"symlink {members.show(member.path)} has an overlong target"
                else:
                    member.target = checked_read(data, info.file_size, info.filename, name)
                    try:
                        members.check_symlink(member.path, member.target)
                    except Refused as exc:
                        member.problem = str(exc)
                yield member, None
            elif folder is not None:
                yield members.folder_of(member, folder), None
                label = f"{name}: {info.filename}"
                yield from tar_members(
                    Buffered(data), label, True, folder, member.offset, member.contiguous, nested=True
                )
            else:
                yield member, data


def _check_sizes(infos: list[zipfile.ZipInfo], file: BinaryIO, name: str) -> None:
    """Refuse members whose data overlap and a total expansion past EXPANSION_MAX."""
    length = os.fstat(file.fileno()).st_size
    total = sum(info.file_size for info in infos)
    if total > EXPANSION_MAX * max(length, 1):
        raise PackError(
            f"{name} claims {total:,} bytes from a {length:,}-byte file, more than any zip expands to; "
            "it is damaged or a zip bomb"
        )
    end = 0
    for info in infos:
        if info.header_offset < end:
            raise PackError(
                f"{name}: the data of member {info.filename} overlaps another's; it is a zip bomb or damaged"
            )
        end = _data_offset(info, file) + info.compress_size


def _data_offset(info: zipfile.ZipInfo, file: BinaryIO) -> int:
    header = os.pread(file.fileno(), LOCAL_HEADER.size, info.header_offset)
    if len(header) < LOCAL_HEADER.size or header[:4] != b"PK\x03\x04":
        raise PackError(f"member {info.filename}'s local header is missing; the zip is damaged")
    _, name_length, extra_length = LOCAL_HEADER.unpack(header)
    return info.header_offset + LOCAL_HEADER.size + name_length + extra_length


def _member(info: zipfile.ZipInfo, file: BinaryIO, uid: int, gid: int) -> Member:
    mode = info.external_attr >> 16 if info.create_system == UNIX else 0
    is_dir = info.is_dir() or stat.S_ISDIR(mode)
    kind = stat.S_IFDIR if is_dir else stat.S_IFLNK if stat.S_ISLNK(mode) else stat.S_IFREG
    default = 0o755 if is_dir else 0o644
    member = Member(
        b"",
        kind,
        members.SYMLINK_MODE
        if kind == stat.S_IFLNK
        else members.permissions(mode)
        if mode & 0o7777
        else default,
        uid,
        gid,
        members.mtime_ns(_mtime(info)),
        info.file_size if kind == stat.S_IFREG else 0,
        offset=_data_offset(info, file),
        contiguous=info.compress_type == zipfile.ZIP_STORED,
    )
    # The name's own bytes, as ``unzip`` names the file: UTF-8 where the zip flags it so, else
    # whatever the writer's system used (``zipfile`` read them as cp437, which maps every byte).
    raw = info.filename.encode("utf-8" if info.flag_bits & UTF8_NAME else "cp437", "surrogateescape")
    try:
        member.path = members.normalize(raw)
        if not member.path and kind != stat.S_IFDIR:
            raise Refused(f"member {info.filename!r} names the root of the tree but is not a directory")
    except Refused as exc:
        member.problem, member.path = str(exc), raw
    return member


def _mtime(info: zipfile.ZipInfo) -> float:
    """Info-ZIP's UTC mtime when the member has one; else its DOS time, read as local time."""
    extra = info.extra
    while len(extra) >= 4:
        kind, length = struct.unpack_from("<HH", extra)
        body = extra[4 : 4 + length]
        if kind == EXTENDED_TIME and len(body) >= 5 and body[0] & 1:
            return float(struct.unpack_from("<i", body, 1)[0])
        extra = extra[4 + length :]
    return time.mktime((*info.date_time, 0, 0, -1))
