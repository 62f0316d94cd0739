"""What a file is from its first bytes: an archive of one of the kinds ``dlfs pack`` reads, or not.

The pack tells its sources apart with it, and every command that takes a dataset tells a user who
named an archive instead (the natural first mistake: ``dlfs mount train.tar mnt``) what to run.
"""

from __future__ import annotations

import re
import tarfile

#: Bytes sniffed: a tar header's magic sits at 257.
SNIFF = 512
#: The suffixes an archive's name ends in, which the dataset suggested in its place goes without.
ARCHIVE_SUFFIX = re.compile(r"(\.tar)?(\.(gz|tgz|bz2|tbz2|xz|txz|zst|tzst|zip))?$")
#: Kinds by their first bytes.
MAGIC = {
    b"\x1f\x8b": "gzip",
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
    b"PK\x03\x04": "zip",
    b"PK\x05\x06": "zip",
}


def sniff(head: bytes) -> str:
    """The kind of an archive from its first bytes: one of MAGIC's, or ``tar``; "" if neither."""
    for magic, kind in MAGIC.items():
        if head.startswith(magic):
            return kind
    if len(head) >= SNIFF and (_is_tar_header(head[:SNIFF]) or not head[:SNIFF].strip(b"\0")):
        return "tar"  # a header, or the end-of-archive marker of an empty tar
    return ""


def _is_tar_header(block: bytes) -> bool:
    """A ustar, GNU or old (v7) header: its checksum field matches its bytes."""
    try:
        tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
    except tarfile.HeaderError:
        return False
    return True


def instead_of_a_dataset(path: str) -> str:
    """What to tell a user who gave the file ``path`` where a dataset goes: what it is, and the
    ``dlfs pack`` that makes a dataset of it."""
    try:
        with open(path, "rb") as f:
            kind = sniff(f.read(SNIFF))
    except OSError:
        kind = ""
    dataset = ARCHIVE_SUFFIX.sub("", path, count=1) + ".dlfs"
    if kind == "tar":
        return (
            f"{path} is a tar, not a dlfs dataset; index it to serve it in place: "
            f"dlfs pack --in-place {path} {dataset} (then use {dataset})"
        )
    if kind:
        return f"{path} is a {kind} archive, not a dlfs dataset; pack it first: dlfs pack {path} {dataset}"
    return f"{path} is a file, not a dlfs dataset (a directory that dlfs pack wrote)"
