"""An archive member as the pack sees it, and the rules an untrusted member's names must pass.

The rules are those of Python's ``tarfile.data_filter`` (PEP 706) for what can leave the tree, and
GNU tar's for ``..``: leading slashes are stripped (with one warning); a name with a ``..``
component is refused whatever it resolves to; a symlink whose target is absolute or climbs out of
the tree is refused, as is a hard link to a name the archive has not stored before it; setuid and
setgid bits are dropped. A member refused here carries its ``problem``, and the pack stops on it or,
with ``--skip-errors``, leaves it out with a warning. Nothing is ever extracted, so no rule guards a
write outside the destination; they keep the mounted tree what ``tar x`` would have made of it.
"""

from __future__ import annotations

import stat
from contextlib import suppress
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from dlfs.core import format as fmt

#: A hard link: a member whose bytes are another member's (``target``).
HARDLINK = 0o110000
#: Permission bits kept: setuid and setgid are dropped, as ``data_filter`` does.
KEPT_MODE = 0o1777
#: The most an archive's members may expand to, as a multiple of the bytes they take in it.
#: Deflate cannot expand a stream more than about 1,032 times, so a zip that claims more lies about
#: its sizes or overlaps them; a GNU sparse tar member is held to the same bound, counting its
#: headers and stored runs, since its holes are written out as zeros and a map of a few bytes can
#: declare terabytes of them.
EXPANSION_MAX = 1032


class Refused(Exception):
    """A member name or link that breaks a rule (the message says which)."""


@dataclass
class Member:
    """One member: ``path`` relative to the tree's root (b"" is the root), components joined by
    ``/``; ``kind`` a ``stat.S_IF*`` type or HARDLINK; ``target`` a symlink's target or a hard
    link's target path. ``offset`` is where the member's bytes start in the uncompressed stream of
    the outermost archive, and ``contiguous`` says they lie there as one run (not a GNU sparse
    file, nor inside a compressed zip member), so they could be served from the archive itself."""

    path: bytes
    kind: int
    mode: int
    uid: int
    gid: int
    mtime_ns: int
    size: int = 0
    target: bytes = b""
    offset: int = 0
    contiguous: bool = True
    #: Why the member is refused; empty when it is not.
    problem: str = ""


def show(path: bytes) -> str:
    """A member path for a message (undecodable bytes escaped)."""
    return path.decode("utf-8", "backslashreplace") or "/"


def normalize(raw: bytes, what: str = "member") -> bytes:
    """The member's path in the tree: leading slashes and ``.`` components dropped. ``what`` names
    the thing in a refusal (``object`` for an object store's key)."""
    if b"\0" in raw:
        raise Refused(f"{what} {show(raw)!r} has a NUL byte in its name")
    parts = [part for part in raw.split(b"/") if part not in (b"", b".")]
    if b".." in parts:
        raise Refused(f"{what} {show(raw)} has a '..' in its path, which could leave the tree")
    for part in parts:
        if len(part) > fmt.NAME_MAX:
            raise Refused(f"{what} {show(raw)} has a name longer than {fmt.NAME_MAX} bytes")
    return b"/".join(parts)


def check_symlink(path: bytes, target: bytes) -> None:
    """Refuse a symlink that points at an absolute path or, from its folder, out of the tree."""
    if not target or b"\0" in target or len(target) > fmt.LINK_MAX:
        raise Refused(f"symlink {show(path)} has an empty, overlong or NUL-bearing target")
    if target.startswith(b"/"):
        raise Refused(f"symlink {show(path)} points at the absolute path {show(target)}")
    depth = path.count(b"/")
    for part in target.split(b"/"):
        if part == b"..":
            depth -= 1
            if depth < 0:
                raise Refused(f"symlink {show(path)} points out of the tree ({show(target)})")
        elif part not in (b"", b"."):
            depth += 1


def check_owner(path: bytes, uid: int, gid: int) -> None:
    """Refuse ids past what a file system (and the index) holds: 32 bits."""
    if not (0 <= uid < 1 << 32 and 0 <= gid < 1 << 32):
        raise Refused(f"member {show(path)} has an owner id past 32 bits ({uid}:{gid})")


def check_expansion(path: bytes, size: int, stored: int) -> None:
    """Refuse a member of ``size`` bytes that takes ``stored`` bytes in its archive (a GNU sparse
    file) if it expands past EXPANSION_MAX times that."""
    if size > EXPANSION_MAX * max(stored, 1):
        raise Refused(
            f"sparse member {show(path)} expands {stored:,} stored bytes to {size:,}, more than "
            f"{EXPANSION_MAX:,} times: an archive bomb, or a sparse file to extract (tar x) and pack as a "
            "folder"
        )


def permissions(mode: int) -> int:
    return mode & KEPT_MODE


def folder_mode(mode: int) -> int:
    """A folder's permissions from a file's (a tar made into a folder): searchable where readable."""
    perms = permissions(mode)
    return perms | ((perms & 0o444) >> 2)


def expanded_folder(path: bytes) -> bytes | None:
    """The folder ``--expand-tars`` makes of a member ``NAME.tar`` (``NAME``), or None for any
    other name: ``.tar`` alone would leave a folder with an empty name."""
    name = path.rpartition(b"/")[2]
    return path[: -len(b".tar")] if len(name) > len(b".tar") and name.endswith(b".tar") else None


def folder_of(member: Member, path: bytes) -> Member:
    """The folder ``path`` that an archive member (``NAME.tar``) becomes."""
    return Member(
        path,
        stat.S_IFDIR,
        folder_mode(member.mode),
        member.uid,
        member.gid,
        member.mtime_ns,
        offset=member.offset,
        contiguous=member.contiguous,
    )


def mtime_ns(seconds: float | Decimal, exact: str | None = None) -> int:
    """Nanoseconds since the epoch; ``exact``: a pax ``mtime`` record, kept to the nanosecond."""
    if exact is not None:
        with suppress(InvalidOperation, ValueError):
            seconds = Decimal(exact)
    try:
        ns = int(Decimal(seconds).scaleb(9).to_integral_value())
    except (InvalidOperation, ValueError, OverflowError):
        return 0
    return max(-(1 << 63), min(ns, (1 << 63) - 1))
