"""What an index's rows must satisfy before a mount serves them, checked once at load.

The checksum trailer catches bit rot, not an index written by something other than ``dlfs pack``:
a crafted index whose checksum holds could otherwise name an entry ``..`` or ``a/b``, list one name
twice, hang a file under a file, loop, or point the C request threads past a blob or a shard. Every
check is numpy over whole columns or blocks of rows (ImageNet's index has 1.28 M rows), never a
Python loop over rows; the order below matters, as later checks rely on what earlier ones
established (names free of NUL compare correctly when zero-padded; a shard number in range can
index the size table).
"""

from __future__ import annotations

import stat
from typing import Any

import numpy as np

from dlfs.core import format as fmt

#: ``_WORD_MASKS[k]`` keeps the first ``k`` bytes of a big-endian 8-byte word of a name.
_WORD_MASKS = np.array([0] + [((1 << 8 * k) - 1) << (64 - 8 * k) for k in range(1, 9)], dtype=np.uint64)
_SLASH, _DOT = ord("/"), ord(".")
#: Rows whose names and places are checked at once: the block's temporaries (about 60 bytes a row)
#: stay in the CPU's cache. Whole-column temporaries are fresh memory to fault in: at 1.28 M rows the
#: name checks cost 32 ms over whole columns, 6 ms in blocks.
BLOCK = 1 << 15


def check_rows(meta: dict[str, Any], arrays: dict[str, np.ndarray], source: str) -> np.ndarray:
    """Raise ``DatasetError`` (via ``format.invalid_index``) at the first rule the rows break.
    Returns the first row of each directory's run of children (int64, increasing), which the tree
    check finds anyway and the index keeps (``Index.run_start``).

    Column lengths were checked by ``format.decode_index``.
    """
    parent, name_off, names = arrays["parent"], arrays["name_off"], arrays["names"]
    kind = arrays["mode"] & fmt.TYPE_MASK
    count = parent.size
    if count == 0 or kind[fmt.ROOT_ROW] != stat.S_IFDIR or parent[fmt.ROOT_ROW] != fmt.ROOT_ROW:
        raise fmt.invalid_index(source, "no root directory")
    is_file, is_dir, is_link = kind == stat.S_IFREG, kind == stat.S_IFDIR, kind == stat.S_IFLNK
    _first(source, ~(is_file | is_dir | is_link), "is neither a file, a directory nor a symlink")
    runs = _check_tree(parent, is_dir, source)
    _check_names(parent, name_off, names, source)
    _check_files(meta, arrays, is_file, source)
    _check_links(arrays, is_link, source)
    _check_owners(arrays, source)
    _check_hard_links(arrays, is_file, source)
    _check_sparse(arrays, is_file, source)
    return runs


def _first(source: str, bad: np.ndarray, problem: str, rows: np.ndarray | None = None, base: int = 0) -> None:
    """Refuse the index if ``bad`` holds anywhere, naming the first such entry: its row is
    ``rows[k] + base`` for the first true ``bad[k]`` (``k + base`` without ``rows``)."""
    if bad.any():
        at = int(np.argmax(bad))
        row = (at if rows is None else int(rows[at])) + base
        raise fmt.invalid_index(source, f"entry {row} {problem}")


def _check_tree(parent: np.ndarray, is_dir: np.ndarray, source: str) -> np.ndarray:
    """Rows are numbered breadth-first: parents never decrease, and a directory's first child
    comes after it. Then following parents from any row strictly descends to the root (no cycle,
    nothing outside the tree), and every directory's children are one run of rows, which starts
    at a row returned."""
    if parent.size == 1:
        return np.zeros(0, dtype=np.int64)
    below = parent[1:]
    _first(source, below[1:] < below[:-1], "has a parent listed before its predecessor's", base=2)
    runs = 1 + np.flatnonzero(np.concatenate(([True], below[1:] != below[:-1])))  # each parent's first child
    parents = parent[runs]
    _first(source, parents >= runs, "is listed before its parent directory", runs)
    _first(source, ~is_dir[parents], "has a parent that is not a directory", runs)
    return runs


def _check_names(parent: np.ndarray, name_off: np.ndarray, names: np.ndarray, source: str) -> None:
    """Every name lies in the blob and is a single path component (1 to 255 bytes, no ``/``, no
    NUL, not ``.`` or ``..``; the root's name is empty), and each directory's children are sorted
    by name bytes, strictly: no name twice, and the binary search of ``Index.lookup`` finds every
    entry. Lengths of 1 to 255 from a first offset of 0 also make the offsets increase."""
    if name_off[0] != 0 or name_off[-1] != names.size:
        raise fmt.invalid_index(source, "its name offsets do not span the names blob")
    if name_off[1] != 0:
        raise fmt.invalid_index(source, "the root has a name")
    for first in range(1, parent.size, BLOCK):
        _check_name_block(names, name_off[first : first + BLOCK + 1], first, source)
    siblings = parent[2:] == parent[1:-1]  # pair k: rows k + 1 and k + 2
    for first in range(1, parent.size, BLOCK):
        pairs = siblings[first - 1 : first + BLOCK - 1]  # of each row in the block and the next
        if pairs.size:
            rows = slice(first, first + pairs.size + 2)
            _check_sibling_block(names, name_off[rows], pairs, first + 1, source)


def _check_name_block(names: np.ndarray, offsets: np.ndarray, first: int, source: str) -> None:
    """``_check_names``'s rules of one name each, for the rows from ``first`` whose names start
    at ``offsets`` (one more offset than rows)."""
    lengths = np.diff(offsets)
    _first(
        source,
        lengths - np.uint64(1) >= fmt.NAME_MAX,
        "has an empty name, one over 255 bytes or one out of place",
        base=first,
    )
    blob = names[int(offsets[0]) : int(offsets[-1])]
    if blob.size and (blob.min() == 0 or (blob == _SLASH).any()):
        at = int(np.flatnonzero((blob == 0) | (blob == _SLASH))[0]) + int(offsets[0])
        row = first + int(np.searchsorted(offsets, at, side="right")) - 1
        raise fmt.invalid_index(source, f"entry {row} has a name containing '/' or NUL")
    starts = offsets[:-1]
    single = np.flatnonzero(lengths == 1)
    _first(source, names[starts[single]] == _DOT, "is named '.'", single, first)
    double = np.flatnonzero(lengths == 2)
    at = starts[double]
    _first(source, (names[at] == _DOT) & (names[at + 1] == _DOT), "is named '..'", double, first)


def _words(names: np.ndarray, at: np.ndarray, lengths: np.ndarray, depth: int) -> np.ndarray:
    """Bytes ``depth`` to ``depth + 16`` of the names starting at ``at`` (increasing) with
    ``lengths``, as two big-endian uint64 columns padded with zeros past each name's end: comparing
    the columns in turn compares the names' bytes in order, and (names hold no NUL) a name that
    ends sorts before one that goes on. One gather of 16-byte items costs what one of 8 does."""
    size = names.size
    full = max(size - 15 - depth, 0)  # names whose 16 bytes at ``depth`` are all in the blob
    inside = int(np.searchsorted(at, full))
    gathered = np.empty(0, dtype="V16")
    if inside:
        view = np.ndarray((full,), dtype="V16", buffer=names, offset=depth, strides=(1,))
        gathered = view[at[:inside]]
    if inside < at.size:  # the last few names: read from a zero-padded copy of the blob's end
        base = int(at[inside])
        padded = np.zeros(size - base + depth + 16, dtype=np.uint8)
        padded[: size - base] = names[base:]
        view = np.ndarray((size - base + 1,), dtype="V16", buffer=padded, offset=depth, strides=(1,))
        gathered = np.concatenate((gathered, view[at[inside:] - np.uint64(base)]))
    words = gathered.view("<u8").reshape(-1, 2)
    words.byteswap(inplace=True)
    ending = lengths < depth + 16
    rows = np.flatnonzero(ending) if 16 * np.count_nonzero(ending) < ending.size else slice(None)
    left = np.maximum(lengths[rows] - depth, 0)
    words[rows, 0] &= _WORD_MASKS[np.minimum(left, 8)]
    words[rows, 1] &= _WORD_MASKS[np.minimum(np.maximum(left - 8, 0), 8)]
    return words


def _order(left: np.ndarray, right: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(left > right, left == right) of two arrays of ``_words``, row by row."""
    after, equal = left > right, left == right
    return after[:, 0] | (equal[:, 0] & after[:, 1]), equal[:, 0] & equal[:, 1]


def _check_sibling_block(
    names: np.ndarray, offsets: np.ndarray, tied: np.ndarray, base: int, source: str
) -> None:
    """The sibling order of ``_check_names`` for consecutive rows whose names start at
    ``offsets`` (one more than rows): pair k, rows ``base + k - 1`` and ``base + k``, are siblings
    where ``tied`` holds. Neighbours are compared 16 bytes a round: over the whole block while most
    pairs are still equal so far (the first bytes of ImageNet's names are their folder's), then
    only over the pairs that are."""
    starts = offsets[:-1]
    sizes = np.diff(offsets).astype(np.int64)
    longer = np.maximum(sizes[:-1], sizes[1:])  # of each row and the next
    depth = 0
    while 4 * np.count_nonzero(tied) > tied.size:
        words = _words(names, starts, sizes, depth)
        after, equal = _order(words[:-1], words[1:])
        _first(source, after & tied, "is out of name order among its siblings", base=base)
        tied = tied & equal
        _first(source, tied & (longer <= depth + 16), "has the same name as the entry before it", base=base)
        depth += 16
    pairs = np.flatnonzero(tied)
    while pairs.size:
        after, equal = _order(
            _words(names, starts[pairs], sizes[pairs], depth),
            _words(names, starts[pairs + 1], sizes[pairs + 1], depth),
        )
        _first(source, after, "is out of name order among its siblings", pairs, base)
        pairs = pairs[equal]
        _first(source, longer[pairs] <= depth + 16, "has the same name as the entry before it", pairs, base)
        depth += 16


def _check_files(
    meta: dict[str, Any], arrays: dict[str, np.ndarray], is_file: np.ndarray, source: str
) -> None:
    """Each file's stored bytes lie inside its shard's recorded size, after the header (an
    in-place dataset's shards have none); raw files
    store exactly their size; lz4 files decompress to at most ``WHOLE_PAYLOAD_LIMIT`` (the most a
    read allocates for one file); no flag this version does not know. ``dlfs pack`` writes shard 0
    and no flags for directories and symlinks, so those two are checked on every row, with one
    reduction each; the rest goes in blocks of rows, like the names."""
    shard, offset, stored = arrays["shard"], arrays["offset"], arrays["stored"]
    size, flags = arrays["size"], arrays["flags"]
    sizes = np.array([size for _, size in meta["shards"]], dtype=np.uint64)
    if not sizes.size:
        _first(source, is_file, "is a file in a dataset without shards")
        return
    if int(shard.max()) >= sizes.size:
        _first(source, shard >= sizes.size, "names a shard past the shard list")
    floor = 0 if "windows" in meta else fmt.HEADER_SIZE
    used = int(np.bitwise_or.reduce(flags))
    if used & ~fmt.KNOWN_FLAGS:
        _first(source, (flags & ~np.uint8(fmt.KNOWN_FLAGS)) != 0, "has flags this dlfs does not know")
    for first in range(0, shard.size, BLOCK):
        rows = slice(first, first + BLOCK)
        files, start, length = is_file[rows], offset[rows], stored[rows]
        limit = sizes[0] if sizes.size == 1 else sizes[shard[rows]]
        # ``limit - start`` wraps round only where ``start > limit``, which is refused already.
        outside = (start < floor) | (start > limit) | (length > limit - start)
        _first(source, files & outside, "has bytes outside its shard", base=first)
        raw = files
        if used & fmt.ENCODED:
            encoded = flags[rows] & np.uint8(fmt.ENCODED)
            lz4, sparse = files & (encoded == fmt.FLAG_LZ4), files & (encoded == fmt.FLAG_SPARSE)
            raw = files & (encoded == 0)
            _first(source, files & (encoded == fmt.ENCODED), "is both lz4 and sparse", base=first)
            impossible = (length == 0) | (size[rows] > fmt.WHOLE_PAYLOAD_LIMIT)
            _first(source, lz4 & impossible, "has an impossible lz4 size", base=first)
            _first(
                source, sparse & (length > size[rows]), "stores more bytes than its sparse size", base=first
            )
        _first(
            source,
            raw & (size[rows] != length),
            "stores a different number of bytes than its size",
            base=first,
        )


def _check_links(arrays: dict[str, np.ndarray], is_link: np.ndarray, source: str) -> None:
    """Each symlink's target lies in the links blob, is 1 to 4095 bytes and has no NUL."""
    rows = np.flatnonzero(is_link)
    offset, stored, links = arrays["offset"][rows], arrays["stored"][rows], arrays["links"]
    bad = (stored == 0) | (stored > fmt.LINK_MAX) | (offset > links.size) | (offset + stored > links.size)
    _first(source, bad, "has a symlink target outside the links blob, empty or over 4095 bytes", rows)
    if links.size and links.min() == 0:
        raise fmt.invalid_index(source, "a symlink target contains NUL")


def _check_owners(arrays: dict[str, np.ndarray], source: str) -> None:
    """The owners table is (uid, gid) pairs, no more than a 16-bit ``owner`` can number (the index
    makes a Python pair of each), and every entry's ``owner`` is one of its rows."""
    owner, owners = arrays["owner"], arrays["owners"]
    if owners.size % 2 or owners.size > 2 * fmt.OWNERS_MAX:
        raise fmt.invalid_index(source, "its owners table is not at most 65,536 (uid, gid) pairs")
    if int(owner.max()) >= owners.size // 2:
        _first(source, owner >= owners.size // 2, "names an owner past the owners table")


def _pairs(arrays: dict[str, np.ndarray], name: str, source: str) -> tuple[np.ndarray, np.ndarray]:
    """A table of pairs, as its two columns (int64); refused if it is not pairs."""
    table = arrays[name]
    if table.size % 2:
        raise fmt.invalid_index(source, f"its {name} table is not pairs")
    pairs = table.astype(np.int64).reshape(-1, 2)
    return pairs[:, 0], pairs[:, 1]


def _check_hard_links(arrays: dict[str, np.ndarray], is_file: np.ndarray, source: str) -> None:
    """The hard-link table is (row, inode row) pairs, rows increasing, each one a file; each group
    of rows sharing an inode row has two or more, the inode row being its first, and its files
    store the same bytes: a mount serves every one of them from the inode row."""
    rows, inodes = _pairs(arrays, "hardlinks", source)
    if not rows.size:
        return
    if rows.max() >= is_file.size or inodes.max() >= is_file.size or rows.min() < 0 or inodes.min() < 0:
        raise fmt.invalid_index(source, "its hard-link table names a row past the entries")
    _first(source, np.diff(rows) <= 0, "is out of order in the hard-link table", rows[1:])
    _first(source, ~is_file[rows], "is a hard link but not a file", rows)
    found = np.minimum(np.searchsorted(rows, inodes), rows.size - 1)
    heads = (rows[found] == inodes) & (inodes[found] == inodes) & (inodes <= rows)
    _first(source, ~heads, "shares the inode of a row that is not its group's first", rows)
    _first(source, np.bincount(found)[found] < 2, "is a hard link alone in its group", rows)
    for column in ("shard", "offset", "stored", "size", "checksum", "flags"):
        values = arrays[column]
        _first(source, values[rows] != values[inodes], f"is a hard link whose {column} differs", rows)


def _check_sparse(arrays: dict[str, np.ndarray], is_file: np.ndarray, source: str) -> None:
    """The sparse table lists exactly the files flagged ``FLAG_SPARSE``, by row, each with where
    its runs end in ``sparse_runs`` (increasing); each file's runs are non-empty, ascend without
    overlap inside its size, and add up to the bytes it stores."""
    rows, ends = _pairs(arrays, "sparse", source)
    flagged = np.flatnonzero(is_file & ((arrays["flags"] & np.uint8(fmt.FLAG_SPARSE)) != 0))
    if not np.array_equal(rows, flagged):
        raise fmt.invalid_index(source, "its sparse table does not list exactly its sparse files")
    offsets, lengths = _pairs(arrays, "sparse_runs", source)
    if not rows.size:
        if offsets.size:
            raise fmt.invalid_index(source, "it has sparse runs but no sparse files")
        return
    starts = np.concatenate(([0], ends[:-1]))
    if (ends < starts).any() or ends[-1] != offsets.size:
        raise fmt.invalid_index(source, "its sparse table's runs do not span its run list")
    owner = np.repeat(rows, ends - starts)
    size = arrays["size"].astype(np.int64)[owner]
    if offsets.min(initial=0) < 0 or lengths.min(initial=1) < 1:  # uint64 read as int64: past 2^63
        raise fmt.invalid_index(source, "a sparse run is empty or starts past 2^63")
    _first(source, (offsets > size) | (lengths > size - offsets), "has a sparse run outside its size", owner)
    later = np.flatnonzero(owner[1:] == owner[:-1]) + 1  # runs after one of the same file
    overlap = offsets[later] < offsets[later - 1] + lengths[later - 1]
    _first(source, overlap, "has sparse runs out of order or overlapping", owner[later])
    sums = np.concatenate(([0], np.cumsum(lengths)))
    totals = sums[ends] - sums[starts]
    stored = arrays["stored"].astype(np.int64)[rows]
    _first(source, totals != stored, "stores other than its sparse runs' bytes", rows)
