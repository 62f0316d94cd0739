"""An archive member as the pack sees it, and the rules an untrusted member's names must pass.

The rules are GNU tar's for names that could leave the tree, and ``tar x``'s for what a mount
shows: leading slashes are stripped (with one warning); a name with a ``..`` component is refused
whatever it resolves to, as is a hard link to a name the archive has not stored before it; setuid
and setgid bits are dropped. Symlinks are kept as they are, absolute, dangling and pointing out
of the tree alike, as ``tar x``, mksquashfs and ratarmount keep them: on a read-only mount a
symlink is only text, which the reader's kernel resolves with the reader's own rights, and
nothing is ever written through it, so the extraction threat that ``tarfile.data_filter`` (PEP 706)
guards against does not arise. What still matters is refused or contained: a member whose path
runs through a symlink member (``ledger``), device nodes and FIFOs (left out), and names the tree
cannot hold. A member refused here carries its ``problem``, and the pack stops on it or, with
``--skip-errors``, leaves it out with a warning.
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
#: A symlink's permissions, whatever its archive says: Linux ignores them and gives every symlink
#: these, so ``tar x`` and ``unzip`` do too.
SYMLINK_MODE = 0o777
#: The most a zip's members may expand to, as a multiple of the bytes they take in it: deflate
#: cannot expand a stream more than about 1,032 times, so a zip that claims more lies about its
#: sizes or overlaps them. (A GNU sparse tar member expands nothing: its holes are never written.)
EXPANSION_MAX = 1032


class Refused(Exception):
    """A member name or link that breaks a rule (the message says which)."""


@dataclass
class Member:
    """One member: ``path`` relative to the tree's root (b"" is the root), components joined by
    ``/``; ``kind`` a ``stat.S_IF*`` type or HARDLINK; ``target`` a symlink's target or a hard
    link's target path. ``offset`` is where the member's bytes start in the uncompressed stream of
    the outermost archive, and ``contiguous`` says they lie there as one run (not inside a compressed
    zip member), so they could be served from the archive itself."""

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
    #: A GNU sparse file's runs of data, (offset in the file, length), ascending; its bytes in the
    #: archive (``stored`` of them at ``offset``) are these runs back to back, the rest of its
    #: ``size`` bytes are holes (zeros). None for any other member.
    sparse: tuple[tuple[int, int], ...] | None = None

    @property
    def stored(self) -> int:
        """The bytes the member's data takes in the archive."""
        return self.size if self.sparse is None else sum(length for _, length in self.sparse)


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
    """Refuse a symlink whose target no file system holds: empty, overlong or with a NUL byte.
    Any other target is kept as it is (the module docstring says why)."""
    if not target or b"\0" in target or len(target) > fmt.LINK_MAX:
        raise Refused(f"symlink {show(path)} has an empty, overlong or NUL-bearing target")


def check_owner(path: bytes, uid: int, gid: int) -> None:
    """Refuse ids past what a file system (and the index) holds: 32 bits."""
    if not (0 <= uid < 1 << 32 and 0 <= gid < 1 << 32):
        raise Refused(f"member {show(path)} has an owner id past 32 bits ({uid}:{gid})")


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
