"""The on-disk format: one index file plus shard files of concatenated payloads.

Every number that describes the format is named here and nowhere else.

Index file (``index.dlfs``)::

    0   header   magic(8) version(u32) reserved(u32) meta_offset(u64) meta_length(u64) file_length(u64)
    64  sections one numpy array each, 64-byte aligned, little-endian (see ``SECTIONS``)
    ..  meta     UTF-8 JSON: dataset id, build arguments, section table, shard table
    -8  trailer  xxh3-64 of every byte before it

Rows are entries in breadth-first order with each directory's children sorted by name bytes,
so the ``parent`` column never decreases and a directory's children are one contiguous run of rows.
Row 0 is the root; inode = row + 1. Regular files point into a shard (``shard``, ``offset``,
``stored``); symlinks point into the ``links`` blob with the same two columns. Each entry's
``owner`` numbers a (uid, gid) pair of the ``owners`` table.

Two small tables hold what few rows need (version 3; a version 2 index has them empty):
``hardlinks``, the files that share one inode, as (row, inode row) pairs sorted by row, the inode
row being the group's first (inode = inode row + 1, nlink = the group's size); ``sparse``, the
files stored as the runs of a GNU sparse file (``FLAG_SPARSE``), as (row, end of its runs) pairs
sorted by row, their runs (offset in the file, length) back to back in ``sparse_runs``.

Shard file (``<dataset-id>.<NNNNN>.shard``)::

    0   header   magic(8) version(u32) shard_no(u32) dataset_id(16)  (padded to 64)
    64  payloads raw or lz4-block-compressed file bytes, back to back

The index is written last and renamed into place, so a dataset without an index is unfinished.

An in-place dataset (``dlfs pack --in-place``) has no shard files: its metadata lists the tar files
it was indexed from (``archives``: absolute path, size, mtime; or, for objects in S3, URL, size,
ETag; ``archive_meta``) and its shards lie in them (``windows``, the format's key for the bases:
archive number and base offset, one per shard entry, named ``<dataset-id>.<NNNNN>.window``). A
row's ``offset`` is relative to its shard's base, so the 32-bit column addresses archives of any
size; such a shard holds no header, and the archive's identity
takes the place of the shard header's check.
"""

from __future__ import annotations

import io
import json
import struct
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

import lz4.block
import numpy as np
import xxhash

from dlfs.core import archive_meta
from dlfs.core.archive_meta import is_int
from dlfs.core.errors import DatasetError, IntegrityError, ShardError

INDEX_NAME = "index.dlfs"
INDEX_MAGIC = b"DLFSIDX\x00"
SHARD_MAGIC = b"DLFSSHD\x00"
FORMAT_VERSION = 3
#: The versions this dlfs reads: version 2 lacks the sections ``ADDED_IN`` 3, which it reads empty.
READS_VERSIONS = (2, 3)
#: The shard header's own version: shards are laid out as they were in index version 2.
SHARD_VERSION = 2
HEADER_SIZE = 64
ALIGN = 64
TRAILER = struct.Struct("<Q")
INDEX_HEADER = struct.Struct("<8sIIQQQ")
SHARD_HEADER = struct.Struct("<8sII16s")
SHARD_SUFFIX = ".shard"
IN_PLACE_SUFFIX = ".window"

FLAG_LZ4 = 1
#: The stored bytes are a pack-time transform's output (``dlfs pack --transform``), not the source
#: file's; size and checksum are of the stored bytes, so reading needs nothing else.
FLAG_TRANSFORMED = 2
#: The stored bytes are a GNU sparse file's runs of data back to back (its map: ``sparse``); the
#: rest of its ``size`` bytes are holes. Its checksum is of the stored bytes, so that neither a
#: check nor a read ever hashes the holes' zeros.
FLAG_SPARSE = 4
#: Every flag bit this version writes; any other bit means a damaged or foreign index.
KNOWN_FLAGS = FLAG_LZ4 | FLAG_TRANSFORMED | FLAG_SPARSE
#: The flags whose stored bytes a reader must decode before serving them.
ENCODED = FLAG_LZ4 | FLAG_SPARSE
#: The file-type bits of st_mode, as an integer mask that also works on numpy arrays.
TYPE_MASK = 0o170000
#: Files larger than this are stored raw and read by range; smaller ones are read and checked whole.
WHOLE_PAYLOAD_LIMIT = 64 << 20

ROOT_ROW = 0
#: Longest name of one entry, in bytes (Linux's NAME_MAX).
NAME_MAX = 255
#: Longest symlink target, in bytes (Linux's PATH_MAX less its NUL).
LINK_MAX = 4095
#: Dataset ids are ``uuid4().hex``; the shard header holds them as 16 raw bytes.
DATASET_ID_HEX = 32

#: Per-entry columns and blobs: name -> dtype. ``name_off`` has one extra element (an end fence).
#:
#: The index is held in RAM whole for the life of a mount, so every byte of a row is daemon memory:
#: 53 bytes an entry plus its name. Hence the narrow columns: ``mode`` is st_mode's 16 bits; an
#: entry's uid and gid are one 16-bit ``owner``, a row of the ``owners`` table (uid, gid pairs: a
#: tree has a handful); the names and links blobs and a file's offset in its shard are bounded by
#: ``BLOB_MAX`` and ``SHARD_MAX`` so that 32 bits address them. A uid and a gid per row and 64-bit
#: offsets took 16 bytes an entry more: 227 MB at ImageNet-21k's 14.2 M files (make bench-bigindex).
SECTIONS: dict[str, str] = {
    "parent": "<u4",
    "name_off": "<u4",
    "names": "u1",
    "mode": "<u2",
    "owner": "<u2",
    "size": "<u8",
    "mtime": "<i8",
    "shard": "<u4",
    "offset": "<u4",
    "stored": "<u8",
    "checksum": "<u8",
    "flags": "u1",
    "links": "u1",
    "owners": "<u4",
    "hardlinks": "<u4",
    "sparse": "<u8",
    "sparse_runs": "<u8",
}
#: Sections that are byte blobs or tables addressed by other columns; every other section has one
#: element per entry, except ``name_off`` (one more).
BLOBS = ("names", "links", "owners", "hardlinks", "sparse", "sparse_runs")
#: The version each section first appeared in; an index of an earlier one has it empty.
ADDED_IN = {"hardlinks": 3, "sparse": 3, "sparse_runs": 3}
#: Most bytes of names, or of symlink targets, one index holds (32-bit offsets address them):
#: about 200 M ImageNet-style names. A larger tree is packed as several datasets.
BLOB_MAX = (1 << 32) - 1
#: Largest shard size ``dlfs pack --shard-size`` accepts: every file starts below the target (a shard
#: that reaches it takes no more files, empty ones included), so a 32-bit ``offset`` addresses it; a
#: larger file still gets a shard of its own, starting after the header.
SHARD_MAX = 1 << 32
#: Most distinct (uid, gid) pairs one index holds (16-bit ``owner``).
OWNERS_MAX = 1 << 16


def checksum(data: bytes | memoryview) -> int:
    """The per-file checksum: xxh3-64 of the original (uncompressed) bytes."""
    return xxhash.xxh3_64_intdigest(data)


def new_dataset_id() -> str:
    return uuid.uuid4().hex


def shard_name(dataset_id: str, shard_no: int) -> str:
    """Shard names carry the dataset id so a re-pack never overwrites shards a live index uses."""
    return f"{dataset_id}.{shard_no:05d}{SHARD_SUFFIX}"


def in_place_shard_name(dataset_id: str, shard_no: int) -> str:
    """The name an in-place dataset's shard entry (bytes that lie in an archive) goes by."""
    return f"{dataset_id}.{shard_no:05d}{IN_PLACE_SUFFIX}"


def shard_header(dataset_id: str, shard_no: int) -> bytes:
    raw = SHARD_HEADER.pack(SHARD_MAGIC, SHARD_VERSION, shard_no, bytes.fromhex(dataset_id))
    return raw.ljust(HEADER_SIZE, b"\x00")


def check_shard_header(raw: bytes, dataset_id: str, shard_no: int, name: str) -> None:
    """Refuse a shard that is not the one the index was built with."""
    if len(raw) < SHARD_HEADER.size:
        raise ShardError(f"shard {name} is truncated; re-run dlfs pack or restore the shard")
    magic, version, number, ident = SHARD_HEADER.unpack_from(raw)
    if magic != SHARD_MAGIC or number != shard_no or ident.hex() != dataset_id or version != SHARD_VERSION:
        raise ShardError(
            f"shard {name} does not belong to this dataset (index {dataset_id}); "
            "restore the original shard or re-run dlfs pack"
        )


def encode_payload(data: bytes, compress: bool) -> tuple[bytes, int]:
    """Return (stored bytes, flags); lz4 is kept only where it actually saves space."""
    if compress and data:
        packed = lz4.block.compress(data, store_size=False)
        if len(packed) < len(data):
            return packed, FLAG_LZ4
    return data, 0


def decode_payload(
    stored: bytes | memoryview, flags: int, size: int, expected: int, runs: np.ndarray | None = None
) -> bytes | memoryview:
    """Turn stored bytes back into the original file, or raise IntegrityError; never wrong bytes.
    ``runs``: a sparse file's map (``FLAG_SPARSE``).

    The message names no file: building a path costs more than the check, so callers add it only
    when something is wrong.
    """
    if flags & FLAG_SPARSE:
        if checksum(stored) != expected or runs is None or len(stored) != int(runs[:, 1].sum()):
            raise IntegrityError("checksum mismatch")
        return expand_sparse(stored, runs, 0, size)
    try:
        data = lz4.block.decompress(stored, uncompressed_size=size) if flags & FLAG_LZ4 else stored
    except lz4.block.LZ4BlockError as exc:
        raise IntegrityError(f"lz4 payload is corrupt ({exc})") from exc
    if len(data) != size or checksum(data) != expected:
        raise IntegrityError("checksum mismatch")
    return data


def expand_sparse(stored: bytes | memoryview, runs: np.ndarray, start: int, length: int) -> bytes:
    """Bytes ``start`` to ``start + length`` of a sparse file whose runs of data (``runs``: offset
    in the file, length; ascending) are ``stored`` back to back: zeros between them."""
    out = bytearray(length)
    at = 0
    for offset, run in runs.tolist():
        lo, hi = max(offset, start), min(offset + run, start + length)
        if lo < hi:
            out[lo - start : hi - start] = stored[at + lo - offset : at + hi - offset]
        at += run
    return bytes(out)


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


#: One section for ``write_index``: its element count, and its values in chunks.
Section = tuple[int, Iterable[np.ndarray]]


def write_index(out: BinaryIO, sections: Mapping[str, Section], meta: dict[str, Any]) -> int:
    """Write an index file to ``out``, one section after another, each from its chunks; return
    its length. The counts fix the layout and the metadata up front, so nothing is written twice
    and no section need be in memory whole (pack writes 1.2 GB indexes at 14.2 M files); the
    trailer's checksum is computed as the bytes go out."""
    table: dict[str, list[int]] = {}
    end = HEADER_SIZE
    for name, dtype in SECTIONS.items():
        start = _align(end)
        table[name] = [start, sections[name][0]]
        end = start + sections[name][0] * np.dtype(dtype).itemsize
    body = json.dumps({**meta, "sections": table}, sort_keys=True).encode()
    meta_offset = _align(end)
    file_length = meta_offset + len(body) + TRAILER.size
    hasher = xxhash.xxh3_64()

    def emit(data: bytes | memoryview) -> None:
        hasher.update(data)
        out.write(data)

    header = INDEX_HEADER.pack(INDEX_MAGIC, FORMAT_VERSION, 0, meta_offset, len(body), file_length)
    emit(header.ljust(HEADER_SIZE, b"\x00"))
    position = HEADER_SIZE
    for name, dtype in SECTIONS.items():
        start, count = table[name]
        emit(bytes(start - position))
        written = 0
        for chunk in sections[name][1]:
            values = np.ascontiguousarray(chunk).astype(dtype, casting="unsafe", copy=False)
            if values.dtype != chunk.dtype and not np.array_equal(values, chunk):
                raise ValueError(f"index section {name}: values out of range for {dtype}")
            emit(memoryview(values).cast("B"))
            written += values.size
        if written != count:
            raise ValueError(f"index section {name}: {written} values written, {count} announced")
        position = start + count * np.dtype(dtype).itemsize
    emit(bytes(meta_offset - position))
    emit(body)
    out.write(TRAILER.pack(hasher.intdigest()))
    return file_length


def encode_index(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> bytes:
    """The bytes of one index file holding ``arrays`` (tests and tools; pack streams its sections);
    a table ``ADDED_IN`` a later version may be left out, for an index with none of its rows."""
    out = io.BytesIO()
    empty = np.zeros(0, dtype=np.uint8)
    columns = {name: arrays.get(name, empty if name in ADDED_IN else arrays[name]) for name in SECTIONS}
    write_index(out, {name: (int(column.size), [column]) for name, column in columns.items()}, meta)
    return out.getvalue()


@dataclass(frozen=True)
class DecodedIndex:
    meta: dict[str, Any]
    arrays: dict[str, np.ndarray]
    #: The format version it was written in (one of ``READS_VERSIONS``).
    version: int = FORMAT_VERSION


def index_header(
    buf: bytes | memoryview, source: str, any_version: bool = False
) -> tuple[int, int, int, int]:
    """(version, meta offset, meta length, file length) from an index's first ``HEADER_SIZE``
    bytes, checked to lie inside the file the header describes (so no reader asks for more).
    ``any_version``: also of an index of a format version this dlfs does not read (the header and
    the metadata's ``dataset_id`` are laid out alike in every version), to learn which shards are
    its."""
    if len(buf) < HEADER_SIZE:
        raise DatasetError(f"{source} is too short to be a dlfs index; re-run dlfs pack")
    magic, version, _, meta_offset, meta_length, file_length = INDEX_HEADER.unpack_from(buf)
    if magic != INDEX_MAGIC:
        raise DatasetError(f"{source} is not a dlfs index (bad magic); point dlfs at a packed dataset")
    if version not in READS_VERSIONS and not any_version:
        if version > FORMAT_VERSION:
            raise DatasetError(
                f"{source} has format version {version}, newer than this dlfs reads ({FORMAT_VERSION}); "
                "upgrade dlfs"
            )
        raise DatasetError(f"{source} has unsupported format version {version}; re-run dlfs pack")
    if not HEADER_SIZE <= meta_offset <= meta_offset + meta_length <= file_length - TRAILER.size:
        raise invalid_index(source, "its header places the metadata outside the file")
    return version, meta_offset, meta_length, file_length


def invalid_index(source: str, problem: str) -> DatasetError:
    """The error for an index whose checksum holds but whose contents break the format's rules:
    written by something other than ``dlfs pack``, or crafted."""
    return DatasetError(f"{source} is not a valid dlfs index ({problem}); re-run dlfs pack to rebuild it")


def decode_index(buf: memoryview, source: str) -> DecodedIndex:
    """Check the header, length and trailer, the metadata's shape and that every section lies
    inside the file with the length the entry count implies, then view each column in place (no
    copies). The rows themselves are checked by ``dlfs.core.validate``."""
    if len(buf) < HEADER_SIZE + TRAILER.size:
        raise DatasetError(f"{source} is too short to be a dlfs index; re-run dlfs pack")
    version, meta_offset, meta_length, file_length = index_header(buf, source)
    if file_length != len(buf):
        raise DatasetError(
            f"{source} is truncated or padded ({len(buf)} bytes, header says {file_length}); re-run dlfs pack"
        )
    (stored,) = TRAILER.unpack_from(buf, len(buf) - TRAILER.size)
    if checksum(buf[: len(buf) - TRAILER.size]) != stored:
        raise DatasetError(f"{source} is corrupt (checksum mismatch); re-run dlfs pack")
    try:
        meta = json.loads(bytes(buf[meta_offset : meta_offset + meta_length]))
    except (ValueError, RecursionError) as exc:
        raise invalid_index(source, "its metadata is not JSON") from exc
    _check_meta(meta, source)
    table = _section_table(meta.get("sections"), meta_offset, version, source)
    arrays = {
        name: np.frombuffer(buf, dtype=dtype, count=table[name][1], offset=table[name][0])
        if name in table
        else np.zeros(0, dtype=dtype)
        for name, dtype in SECTIONS.items()
    }
    return DecodedIndex(meta=meta, arrays=arrays, version=version)


def _check_meta(meta: object, source: str) -> None:
    """The metadata fields a reader uses have the types and values ``dlfs pack`` writes.

    Shard names must be exactly the ones this dataset id gives: a name is a path in the store, and
    one like ``../x`` would read outside the dataset.
    """
    if not isinstance(meta, dict):
        raise invalid_index(source, "its metadata is not an object")
    dataset_id = meta.get("dataset_id")
    if not (
        isinstance(dataset_id, str)
        and len(dataset_id) == DATASET_ID_HEX
        and all(c in "0123456789abcdef" for c in dataset_id)
    ):
        raise invalid_index(source, "malformed dataset id")
    shards = meta.get("shards")
    if not isinstance(shards, list):
        raise invalid_index(source, "no shard list")
    in_place = "archives" in meta or "windows" in meta
    named, smallest = (in_place_shard_name, 0) if in_place else (shard_name, HEADER_SIZE)
    for number, entry in enumerate(shards):
        if not (isinstance(entry, list) and len(entry) == 2 and is_int(entry[1])):
            raise invalid_index(source, f"shard entry {number} is malformed")
        name, size = entry
        if name != named(dataset_id, number):
            raise invalid_index(source, f"shard entry {number} is not named {named(dataset_id, number)}")
        if not smallest <= size < 1 << 63:
            raise invalid_index(source, f"shard {name} has an impossible size {size}")
    problem = archive_meta.problem(meta) if in_place else ""
    if problem:
        raise invalid_index(source, problem)
    for key, valid in _OPTIONAL_META.items():
        if key in meta and not valid(meta[key]):
            raise invalid_index(source, f"metadata field {key} is malformed")


#: Metadata that ``dlfs info`` and ``.dlfs/config`` show when present, and the type each must have.
_OPTIONAL_META: dict[str, Any] = {
    "created_ns": is_int,
    "dlfs_version": lambda value: isinstance(value, str),
    "build": lambda value: isinstance(value, dict),
    "transform": lambda value: (
        isinstance(value, dict) and all(isinstance(value.get(key), str) for key in ("spec", "codec"))
    ),
}


def _section_table(table: object, meta_offset: int, version: int, source: str) -> dict[str, tuple[int, int]]:
    """(offset, element count) of every section of a ``version`` index, checked before any array
    is made: each lies between the header and the metadata, 64-byte aligned, and the per-entry
    columns agree on the entry count. A count claiming 2^60 elements is refused here, never
    allocated or mapped."""
    known = {name: dtype for name, dtype in SECTIONS.items() if ADDED_IN.get(name, 0) <= version}
    if not isinstance(table, dict) or set(table) != set(known):
        raise invalid_index(source, "its section table does not list exactly the known sections")
    out: dict[str, tuple[int, int]] = {}
    for name, dtype in known.items():
        entry = table[name]
        if not (isinstance(entry, list) and len(entry) == 2 and all(map(is_int, entry))):
            raise invalid_index(source, f"section {name} is malformed")
        offset, count = entry
        if offset < HEADER_SIZE or offset % ALIGN or count < 0:
            raise invalid_index(source, f"section {name} has an impossible place")
        if offset + count * np.dtype(dtype).itemsize > meta_offset:
            raise invalid_index(source, f"section {name} runs past the columns")
        out[name] = (offset, count)
    entries = out["parent"][1]
    for name, (_, count) in out.items():
        expected = entries + 1 if name == "name_off" else entries
        if name not in BLOBS and count != expected:
            raise invalid_index(source, f"section {name} has {count} elements for {entries} entries")
    return out
