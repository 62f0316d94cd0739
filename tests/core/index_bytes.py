"""An index file's bytes taken as they are: loaded without a store, and changed and sealed again
(header length and trailer checksum made to agree) as a careful forger would."""

from __future__ import annotations

from dlfs.core import format as fmt
from dlfs.core.index import Index


def load(raw: bytes) -> Index:
    """What ``Index.load`` does with the bytes of an index file, without a store."""
    decoded = fmt.decode_index(memoryview(raw), "crafted/index.dlfs")
    return Index(decoded.meta, decoded.arrays, "crafted/index.dlfs")


def reseal(raw: bytes | bytearray) -> bytes:
    """Make the header's length and the trailer agree with the bytes, as a careful forger would."""
    out = bytearray(raw[: len(raw) - fmt.TRAILER.size])
    magic, version, reserved, meta_offset, meta_length, _ = fmt.INDEX_HEADER.unpack_from(out)
    length = len(out) + fmt.TRAILER.size
    out[: fmt.INDEX_HEADER.size] = fmt.INDEX_HEADER.pack(
        magic, version, reserved, meta_offset, meta_length, length
    )
    return bytes(out + fmt.TRAILER.pack(fmt.checksum(out)))


def with_meta(raw: bytes, body: bytes) -> bytes:
    """The index with its metadata replaced by ``body`` (any bytes), resealed."""
    _, _, _, meta_offset, _, _ = fmt.INDEX_HEADER.unpack_from(raw)
    out = bytearray(raw[:meta_offset] + body + bytes(fmt.TRAILER.size))
    fmt.INDEX_HEADER.pack_into(out, 0, fmt.INDEX_MAGIC, fmt.FORMAT_VERSION, 0, meta_offset, len(body), 0)
    return reseal(out)
