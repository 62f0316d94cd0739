"""What an in-place index records of the archives it serves from, and the rules a loaded one's
records must pass: the files a mount opens and the objects it fetches are named by the index, so
a crafted one must not name a path outside what ``dlfs pack --in-place`` would write."""

from __future__ import annotations

import os
import re
from typing import Any

#: Longest archive path an in-place index may name, in bytes (Linux's PATH_MAX less its NUL).
ARCHIVE_PATH_MAX = 4095
#: Longest S3 object key, in bytes of UTF-8 (S3's own limit).
S3_KEY_MAX = 1024


def is_int(value: object) -> bool:
    """A JSON integer (not a boolean, which Python counts as one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_archive_path(path: object) -> bool:
    """An archive path an in-place index may name: absolute and normalised (no ``.``, ``..``,
    empty or doubled components, no trailing slash), without NUL, at most ``ARCHIVE_PATH_MAX``
    bytes. That it names a regular file is checked when it is opened (``store.archives``)."""
    if not isinstance(path, str) or not path.startswith("/") or path.startswith("//"):
        return False
    try:
        raw = os.fsencode(path)
    except UnicodeEncodeError:
        return False
    return b"\0" not in raw and len(raw) <= ARCHIVE_PATH_MAX and os.path.normpath(path) == path


def is_s3_archive_url(url: object) -> bool:
    """An S3 archive an in-place index may name: ``s3://BUCKET/KEY`` with a bucket name S3 allows
    and a key of at most ``S3_KEY_MAX`` bytes, without NUL, empty, ``.`` or ``..`` components
    (``s3://b/a/../x`` would be ``x`` to some clients and not to others)."""
    if not isinstance(url, str) or not url.startswith(S3_SCHEME):
        return False
    bucket, _, key = url[len(S3_SCHEME) :].partition("/")
    parts = key.split("/")
    return (
        _S3_BUCKET.fullmatch(bucket) is not None
        and 0 < len(key.encode("utf-8", "surrogatepass")) <= S3_KEY_MAX
        and "\0" not in key
        and all(part not in ("", ".", "..") for part in parts)
    )


def archive_location(archive: dict[str, Any]) -> str:
    """Where an in-place index's archive is: its path, or its ``s3://`` URL."""
    return str(archive["url"] if "url" in archive else archive["path"])


def _is_archive(archive: object) -> bool:
    """An archive entry: a local file's identity (``ARCHIVE_KEYS``) or an S3 object's
    (``S3_ARCHIVE_KEYS``)."""
    if not (isinstance(archive, dict) and is_int(archive.get("size")) and 0 <= archive["size"] < 1 << 63):
        return False
    if set(archive) == S3_ARCHIVE_KEYS:
        etag = archive["etag"]
        return (
            is_s3_archive_url(archive["url"])
            and isinstance(etag, str)
            and 0 < len(etag) <= ETAG_MAX
            and etag.isascii()
            and etag.isprintable()
        )
    return (
        set(archive) == ARCHIVE_KEYS
        and is_archive_path(archive["path"])
        and is_int(archive["mtime_ns"])
        and -(1 << 63) <= archive["mtime_ns"] < 1 << 63
    )


def problem(meta: dict[str, Any]) -> str:
    """What is wrong with an in-place index's archive and shard-base tables ("" when nothing): its
    archives are identities, local (path, size, mtime) with paths that pass ``is_archive_path`` or
    all in one S3 bucket (URL, size, ETag) with URLs that pass ``is_s3_archive_url``, each named
    once; each shard entry has a base (archive number, offset) and lies inside its archive."""
    archives, bases = meta.get("archives"), meta.get("windows")
    if not isinstance(archives, list) or not isinstance(bases, list) or len(bases) != len(meta["shards"]):
        return "its archive and shard-base tables do not match its shard list"
    for number, archive in enumerate(archives):
        if not _is_archive(archive):
            return f"archive entry {number} is malformed or names a path not allowed"
    if len({archive_location(archive) for archive in archives}) != len(archives):
        return "it names an archive twice"
    kinds = {archive_location(archive).split("/", 3)[2] if "url" in archive else "" for archive in archives}
    if len(kinds) > 1:
        return "its archives are not all local files or all in one S3 bucket"
    for number, (place, (_, size)) in enumerate(zip(bases, meta["shards"], strict=True)):
        if not (isinstance(place, list) and len(place) == 2 and all(map(is_int, place))):
            return f"the base of shard {number} is malformed"
        archive, base = place
        if not 0 <= archive < len(archives):
            return f"shard {number} names no archive"
        if not 0 <= base <= base + size <= archives[archive]["size"]:
            return f"shard {number} lies outside its archive"
    return ""


#: The fields of an archive an in-place index depends on: where it is and what it was like when it
#: was indexed (a file that differs in either is refused at mount).
ARCHIVE_KEYS = frozenset({"path", "size", "mtime_ns"})
#: The same of an object in S3: its ETag changes whenever it is written again, which its time and
#: size need not. An older dlfs finds no ``path`` and refuses the index in one line.
S3_ARCHIVE_KEYS = frozenset({"url", "size", "etag"})
S3_SCHEME = "s3://"
#: Longest ETag an index may record (S3's are 34 or so characters; a multipart one a few more).
ETAG_MAX = 256
#: A bucket name as S3 allows it (3-63 lowercase letters, digits, dots and hyphens).
_S3_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
