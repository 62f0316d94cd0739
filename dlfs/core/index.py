"""The in-RAM index: lookup, attributes and listings served from numpy columns.

Nothing here allocates per-file Python objects at load time: the columns are views into the
index's sealed in-memory copy (``dlfs.core.sealed``), and every query touches only the rows it
needs. Rows are in breadth-first order (see ``dlfs.core.format``), so the children of a directory
are the contiguous run of rows whose ``parent`` equals it: one row of the table of runs the load
checks find (``run_parent``, ``run_start``), which the C request threads search too.
"""

from __future__ import annotations

import logging
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from dlfs.core import archive_meta, validate
from dlfs.core import format as fmt
from dlfs.core.errors import DatasetError
from dlfs.core.hardlinks import HardLinks
from dlfs.core.index_copy import local_copy
from dlfs.core.libc import stat_blocks, trim_allocator
from dlfs.core.sparse import SparseFiles
from dlfs.core.store import Descriptors, Store

log = logging.getLogger(__name__)


class Attrs(NamedTuple):
    """What ``stat`` reports for one row; built on demand, never stored."""

    mode: int
    nlink: int
    uid: int
    gid: int
    size: int
    blocks: int
    mtime_ns: int


class Index:
    """Read-only view of a dataset's metadata. Row 0 is the root; inode = row + 1."""

    def __init__(
        self,
        meta: dict[str, Any],
        arrays: dict[str, np.ndarray],
        source: str,
        version: int = fmt.FORMAT_VERSION,
    ) -> None:
        self.meta = meta
        self.source = source
        #: The format version the index was written in.
        self.version = version
        self.dataset_id: str = meta["dataset_id"]
        self.shard_names: list[str] = [name for name, _ in meta["shards"]]
        self.shard_sizes: list[int] = [size for _, size in meta["shards"]]
        #: The tar files an in-place dataset's bytes are read from (``dlfs pack --in-place``): each
        #: one's path, size and mtime when indexed; empty for a packed dataset.
        self.archives: list[dict[str, Any]] = meta.get("archives", [])
        bases = meta.get("windows", [])
        #: Each shard's archive (in-place datasets) and where in it the shard starts: a row's bytes
        #: lie at ``shard_base[shard] + offset`` of the file read (0 for a shard file).
        self.shard_archive = np.array([number for number, _ in bases], dtype=np.int64)
        self.shard_base = np.array([base for _, base in bases] or [0] * len(self.shard_names), dtype=np.int64)
        self.parent = arrays["parent"]
        self.name_off = arrays["name_off"]
        self.names = arrays["names"]
        self.mode = arrays["mode"]
        self.owner = arrays["owner"]
        self.owners = arrays["owners"]
        self.size = arrays["size"]
        self.mtime = arrays["mtime"]
        self.shard = arrays["shard"]
        self.offset = arrays["offset"]
        self.stored = arrays["stored"]
        self.checksum = arrays["checksum"]
        self.flags = arrays["flags"]
        self.links = arrays["links"]
        self.count = int(self.parent.size)
        # Byte view of the names blob: slicing it costs a third of slicing the numpy array, and a
        # LOOKUP compares about log2(entries in the directory) names.
        self._name_bytes = memoryview(self.names)
        self._parent_key = self.parent.dtype.type
        #: Each directory's run of children: rows run_start[k] up to run_start[k + 1] (the last
        #: up to the end) have the parent run_parent[k]. ``children`` and the C request threads
        #: search these, 21,841 runs at ImageNet-21k's shape (262 KiB, in the CPU's cache), not the
        #: parent column (57 MB at 14.2 M rows: a cache and TLB miss for each of a search's last
        #: probes). Daemon CPU per LOOKUP (make bench-bigindex): 16.1 us at 14.2 M rows and 15.7 at
        #: 1.28 M this way, 19.0 and 17.5 searching the column.
        self.run_start = validate.check_rows(meta, arrays, source)
        self.run_parent = self.parent[self.run_start]
        #: (uid, gid) of each owner, the rows ``owner`` numbers: a handful in a real tree.
        self._owner_ids = self.owners.reshape(-1, 2)
        self._owner_list = [(uid, gid) for uid, gid in self._owner_ids.tolist()]
        self.hard_links = HardLinks(arrays["hardlinks"])
        self.sparse = SparseFiles(arrays["sparse"], arrays["sparse_runs"])

    @classmethod
    def load(cls, store: Store, copies: Path | None = None) -> Index:
        """The dataset's index; from a store that is not a local directory, through a local copy
        kept in ``copies`` under the dataset id, so that a remount reads a few hundred bytes of
        the store, not the whole index (90 MiB for ImageNet)."""
        source = f"{store.url}/{fmt.INDEX_NAME}"
        if copies is None or isinstance(store, Descriptors):
            buf = store.map_index(fmt.INDEX_NAME)
            decoded = fmt.decode_index(buf, source)
        else:
            buf = local_copy(store, copies, source)
            try:
                decoded = fmt.decode_index(buf, source)
            except DatasetError:  # a damaged copy: fetch the store's again
                buf = local_copy(store, copies, source, refresh=True)
                decoded = fmt.decode_index(buf, source)
        index = cls(decoded.meta, decoded.arrays, source, decoded.version)
        # The row checks' temporaries (tens of MB at 14.2 M rows) are free now, but the arrays kept
        # from them can pin the heap above them: 12 MiB of RSS at 14.2 M rows until trimmed.
        if trim_allocator is not None:
            trim_allocator()
        # The checksum and the row checks leave every page of the sealed copy mapped, and they stay
        # so: the copy is held whole whether mapped or not, and unmapping it only made each query
        # fault its pages back in. At 14.2 M entries that cost 3 us of daemon CPU per LOOKUP: 19.3
        # unmapped, 16.0 mapped (docs/design.md, the index).
        return index

    @property
    def transform(self) -> str:
        """What the stored bytes went through at pack time, in one line, or "" when they are the
        source files' own: ``resize:256,quality=90 (Pillow-SIMD 12.1.1.post0), 5,812 of 6,000
        files``. Sizes and checksums are of the stored bytes either way."""
        described = self.meta.get("transform")
        if not described:
            return ""
        changed = int(np.count_nonzero(self.flags & fmt.FLAG_TRANSFORMED))
        files = int(np.count_nonzero(self.kinds(slice(None)) == stat.S_IFREG))
        return f"{described['spec']} ({described['codec']}), {changed:,} of {files:,} files"

    @property
    def in_place(self) -> str:
        """The tars an in-place dataset's bytes are read from, in one line, or "" for a packed
        dataset: ``served in place from 2 tar(s): /data/a.tar, /data/b.tar``."""
        if not self.archives:
            return ""
        paths = ", ".join(map(archive_meta.archive_location, self.archives))
        return f"served in place from {len(self.archives)} tar(s): {paths}"

    @property
    def archives_in_s3(self) -> bool:
        """An in-place dataset whose tars are objects in S3 (``archive_meta`` allows no mix)."""
        return bool(self.archives) and "url" in self.archives[0]

    def name(self, row: int) -> bytes:
        off = self.name_off
        return bytes(self._name_bytes[off.item(row) : off.item(row + 1)])

    def kinds(self, rows: slice) -> np.ndarray:
        """The file-type bits of the rows' modes. Computed when asked, not kept: a column of them
        would be 27 MiB of daemon memory at 14.2 M entries."""
        return self.mode[rows] & fmt.TYPE_MASK

    def is_dir(self, row: int) -> bool:
        return stat.S_ISDIR(self.mode.item(row))

    def is_file(self, row: int) -> bool:
        return stat.S_ISREG(self.mode.item(row))

    def is_symlink(self, row: int) -> bool:
        return stat.S_ISLNK(self.mode.item(row))

    def children(self, row: int) -> range:
        """Rows of a directory's entries, sorted by name; empty for non-directories."""
        if not self.is_dir(row):
            return range(0)
        # The key has the table's dtype: a Python int would make numpy cast the whole table per call.
        runs = self.run_parent
        k = int(runs.searchsorted(self._parent_key(row)))
        start = self.run_start.item(k) if k < runs.size else self.count
        if k == runs.size or runs.item(k) != row:  # a folder without children
            return range(start, start)
        return range(start, self.run_start.item(k + 1) if k + 1 < runs.size else self.count)

    def lookup(self, parent: int, name: bytes) -> int | None:
        """Binary search of the parent's sorted children by name bytes."""
        rows = self.children(parent)
        lo, hi = rows.start, rows.stop
        while lo < hi:
            mid = (lo + hi) // 2
            probe = self.name(mid)
            if probe < name:
                lo = mid + 1
            elif probe > name:
                hi = mid
            else:
                return mid
        return None

    def resolve(self, path: bytes) -> int | None:
        """Row of a slash-separated path relative to the root ('' or '/' is the root)."""
        row = fmt.ROOT_ROW
        for part in path.split(b"/"):
            if not part or part == b".":
                continue
            found = self.lookup(row, part)
            if found is None:
                return None
            row = found
        return row

    def path(self, row: int) -> bytes:
        """Path of a row relative to the root, without a leading slash."""
        parts = []
        while row != fmt.ROOT_ROW:
            parts.append(self.name(row))
            row = int(self.parent[row])
        return b"/".join(reversed(parts))

    def listing(self, row: int, recursive: bool = False) -> Iterator[tuple[int, bytes]]:
        """``ls`` of a row, as (row, name shown): a file alone, by its path; a folder's entries by
        name; with ``recursive``, each folder's entries together, then its subfolders' in turn, by
        their paths (what ``ls -R`` lists, without reading a row twice)."""
        if not self.is_dir(row):
            yield row, self.path(row)
            return
        stack = [row]
        while stack:
            folder = stack.pop()
            children = self.children(folder)
            prefix = self.path(folder) + b"/" if recursive and folder != fmt.ROOT_ROW else b""
            for child in children:
                yield child, prefix + self.name(child)
            if recursive:
                stack.extend(child for child in reversed(children) if self.is_dir(child))

    def summary(self) -> dict[str, int]:
        """What the dataset holds: entries of each kind, the files' bytes, what the shards store
        and how many files are stored compressed. Counted from the columns, no row visited."""
        kinds = self.kinds(slice(None))
        files = kinds == stat.S_IFREG
        return {
            "files": int(np.count_nonzero(files)),
            "directories": int(np.count_nonzero(kinds == stat.S_IFDIR)),
            "symlinks": int(np.count_nonzero(kinds == stat.S_IFLNK)),
            "bytes": int(self.size[files].sum()),
            "stored_bytes": self.total_stored,
            "shards": len(self.shard_names),
            "compressed_files": int(np.count_nonzero(self.flags & fmt.FLAG_LZ4)),
        }

    def readlink(self, row: int) -> bytes:
        start = int(self.offset[row])
        return self.links[start : start + int(self.stored[row])].tobytes()

    def attrs(self, row: int) -> Attrs:
        """One entry's attributes, as ``attrs_run`` gives them, read as scalars.

        A LOOKUP answers one entry; the vectorised run costs ~40 µs of numpy call overhead for a
        run of one, scalar reads ~3 µs. Directories (few) still take the run for their link count.
        """
        kind = stat.S_IFMT(self.mode.item(row))
        if kind == stat.S_IFDIR:
            return self.attrs_run(range(row, row + 1))[0]
        used = self.stored.item(row) if kind == stat.S_IFREG else 0
        uid, gid = self._owner_list[self.owner.item(row)]
        return Attrs(
            self.mode.item(row),
            self.hard_links.nlink_of(row),
            uid,
            gid,
            self.size.item(row),
            stat_blocks(used),
            self.mtime.item(row),
        )

    def attrs_columns(self, rows: range) -> tuple[np.ndarray, ...]:
        """Attributes of consecutive rows as arrays, in ``Attrs`` field order: one numpy slice per
        column, not per entry.

        Blocks count the bytes actually stored (compressed, if lz4 was kept), like a compressing
        filesystem reports them; a directory's link count is 2 + its subdirectories.
        """
        window = slice(rows.start, rows.stop)
        kind = self.kinds(window)
        used = np.where(kind == stat.S_IFREG, self.stored[window], 0)
        used = np.where(kind == stat.S_IFDIR, self.size[window], used)
        blocks = stat_blocks(used)
        owners = self._owner_ids[self.owner[window]]
        return (
            self.mode[window],
            self.link_counts(rows),
            owners[:, 0],
            owners[:, 1],
            self.size[window],
            blocks,
            self.mtime[window],
        )

    def link_counts(self, rows: range) -> np.ndarray:
        """Link counts of consecutive rows: 1 for a file (its group's size for a hard-linked one),
        2 + its subdirectories for a directory."""
        nlink = np.ones(len(rows), dtype=np.int64)
        self.hard_links.count_links(rows.start, nlink)
        for offset in np.flatnonzero(self.kinds(slice(rows.start, rows.stop)) == stat.S_IFDIR).tolist():
            children = self.children(rows.start + offset)
            subdirs = self.kinds(slice(children.start, children.stop)) == stat.S_IFDIR
            nlink[offset] = 2 + int(np.count_nonzero(subdirs))
        return nlink

    def attrs_run(self, rows: range) -> list[Attrs]:
        """Attributes of consecutive rows (``attrs_columns``) as one ``Attrs`` per row."""
        columns = (column.tolist() for column in self.attrs_columns(rows))
        return [Attrs(*values) for values in zip(*columns, strict=True)]

    def names_run(self, rows: range) -> list[bytes]:
        """Names of consecutive rows from one slice of the names blob."""
        bounds = self.name_off[rows.start : rows.stop + 1]
        if bounds.size == 0:
            return []
        base = int(bounds[0])
        blob = self.names[base : int(bounds[-1])].tobytes()
        cuts = (bounds - base).tolist()
        return [blob[cuts[k] : cuts[k + 1]] for k in range(len(rows))]

    def paths(self, rows: np.ndarray) -> list[bytes]:
        """Paths of many rows; each directory's path is built once, not once per file."""
        prefixes: dict[int, bytes] = {}
        blob = self.names.tobytes()
        starts = self.name_off[rows].tolist()
        ends = self.name_off[rows + 1].tolist()
        out = []
        for parent, start, end in zip(self.parent[rows].tolist(), starts, ends, strict=True):
            prefix = prefixes.get(parent)
            if prefix is None:
                prefix = prefixes[parent] = self.path(parent) + b"/" if parent != fmt.ROOT_ROW else b""
            out.append(prefix + blob[start:end])
        return out

    def path_lines(self, rows: np.ndarray, chunk: int = 1 << 12) -> bytes:
        """The paths of many rows, each followed by a newline, as one bytes object (unescaped).

        Gathered with numpy, ``chunk`` rows at a time: built path by path in Python, 1.28 M paths
        took 2.8 s, and an order file cannot answer its LOOKUP (which needs its size) before then.
        """
        folders, which = np.unique(self.parent[rows], return_inverse=True)
        prefixes = [self.path(f) + b"/" if f != fmt.ROOT_ROW else b"" for f in folders.tolist()]
        # Each path is three segments of ``source``: its folder's prefix, its name, a newline.
        source = np.frombuffer(b"".join((self.names.tobytes(), b"\n", *prefixes)), dtype=np.uint8)
        newline = self.names.size
        prefix_len = np.fromiter(map(len, prefixes), dtype=np.int64, count=len(prefixes))
        prefix_at = newline + 1 + np.cumsum(prefix_len) - prefix_len
        name_at = self.name_off.astype(np.int64)
        parts = []
        for first in range(0, rows.size, chunk):
            part, folder = rows[first : first + chunk], which[first : first + chunk]
            starts = np.stack((prefix_at[folder], name_at[part], np.full(part.size, newline)), axis=1)
            sizes = np.stack(
                (prefix_len[folder], name_at[part + 1] - name_at[part], np.ones(part.size, np.int64)), axis=1
            )
            ends = np.cumsum(sizes.ravel())
            gather = np.repeat(starts.ravel() - ends + sizes.ravel(), sizes.ravel()) + np.arange(ends[-1])
            parts.append(source[gather].tobytes())
        return b"".join(parts)

    def regular_rows(self) -> np.ndarray:
        """Rows of regular files in row order."""
        return np.flatnonzero(self.kinds(slice(None)) == stat.S_IFREG)

    def file_rows(self) -> np.ndarray:
        """Rows of regular files in storage order (shard, offset): sequential reads for verify."""
        rows = self.regular_rows()
        return rows[np.lexsort((self.offset[rows], self.shard[rows]))]

    @property
    def total_stored(self) -> int:
        return int(sum(self.shard_sizes))

    def shard_of(self, row: int) -> str:
        """The name of the shard holding a file's bytes."""
        return self.shard_names[int(self.shard[row])]

    def location(self, row: int) -> str:
        """Human-readable place of a file's bytes, for error messages."""
        path = self.path(row).decode(errors="replace")
        shard = int(self.shard[row])
        if self.archives:
            archive = archive_meta.archive_location(self.archives[int(self.shard_archive[shard])])
            return f"{path} (archive {archive}, offset {int(self.shard_base[shard]) + int(self.offset[row])})"
        return f"{path} (shard {self.shard_of(row)}, offset {int(self.offset[row])})"
