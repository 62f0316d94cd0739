"""The walk of the source tree: every row of the index, in the order the index numbers them.

The walk is breadth-first with each directory's entries sorted by name bytes, which is exactly the
row order the index wants. Special files (devices, sockets, FIFOs) are left out.
"""

from __future__ import annotations

import logging
import os
import stat
from array import array
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from dlfs.core import format as fmt
from dlfs.core.errors import PackError
from dlfs.pack.options import PackOptions, PackSummary, fail_or_skip
from dlfs.pack.spill import Column, Spill, append_buffers

log = logging.getLogger(__name__)


#: Rows the walk holds in memory before appending them to its column files.
FLUSH_ROWS = 1 << 16
#: Rows ``add_rows`` adds one at a time: numpy's cost per call (about 25 us) is that of a dozen
#: ``add_row``s (1.6 us each), and an archive of one-file folders calls it once per folder.
FEW_ROWS = 16
#: The walk's per-row columns and their types (the index's own widths).
ROW_COLUMNS = {"parent": "I", "mode": "H", "owner": "H", "size": "Q", "mtime": "q", "name_end": "Q"}


@dataclass
class Directory:
    """What the later stages need of a directory: its path and where its children's rows are
    (one contiguous run, as the walk numbers them)."""

    path: bytes
    first: int = 0
    count: int = 0


class Tree:
    """The walk's rows, in column files of a ``Spill``; in memory only a buffer of FLUSH_ROWS rows
    and one ``Directory`` per directory (~250 bytes each). Typed arrays in memory cost ~300 bytes
    a file at pack's peak (1.28 M files: 377 MB); a file count is no bound on this one.

    Columns: ``ROW_COLUMNS`` per row (``name_end``: where row r's name ends in ``names``), the
    ``names`` blob, ``files`` (the rows of regular files, in row order), and the symlinks'
    ``link_rows`` with their targets in ``links`` (target k ends at ``link_end[k]``). ``owners``
    numbers each (uid, gid) pair in the order the walk meets it, as the ``owner`` column does.
    """

    def __init__(self, spill: Spill) -> None:
        self.columns = {name: spill.column(name, np.dtype(code)) for name, code in ROW_COLUMNS.items()}
        self.names = spill.column("names", np.uint8)
        self.files = spill.column("files", np.uint64)
        self.link_rows = spill.column("link_rows", np.uint64)
        self.link_end = spill.column("link_end", np.uint64)
        self.links = spill.column("links", np.uint8)
        self.dirs: dict[int, Directory] = {}
        self.owners: dict[tuple[int, int], int] = {}
        self.count = 0
        #: The regular files' bytes, as the walk saw them.
        self.file_bytes = 0
        self._rows = {name: array(code) for name, code in ROW_COLUMNS.items()}
        self._names = bytearray()
        self._names_length = 0
        self._files = array("Q")
        self._link_rows, self._link_end, self._links = array("Q"), array("Q"), bytearray()
        self._links_length = 0
        #: Laid out again by ``--map`` (``mapped_tree``): the walked tree whose paths the files are
        #: read from, and each row's row in it; None for the walk's own tree.
        self.origin: tuple[Tree, Column] | None = None
        #: The rows of files that may share one inode (hard links), by what they share: (device,
        #: inode) in a walked tree, the member a link named in an archive. A key with one row left
        #: is no hard link. Datasets hold few, so they stay in memory.
        self.hard_links: dict[object, list[int]] = {}
        #: A GNU sparse file's runs of data, by row (``Member.sparse``).
        self.sparse: dict[int, tuple[tuple[int, int], ...]] = {}

    def __len__(self) -> int:
        return self.count

    def add(self, parent: int, name: bytes, st: os.stat_result) -> int:
        return self.add_row(parent, name, st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns)

    def add_row(
        self, parent: int, name: bytes, mode: int, uid: int, gid: int, size: int, mtime_ns: int
    ) -> int:
        """Append a row; its number."""
        row = self.count
        rows = self._rows
        rows["parent"].append(parent)
        self._names += name
        rows["name_end"].append(self._names_length + len(self._names))
        rows["mode"].append(mode)
        rows["owner"].append(self._owner(uid, gid))
        rows["size"].append(size)
        rows["mtime"].append(mtime_ns)
        if stat.S_ISREG(mode):
            self._files.append(row)
            self.file_bytes += size
        self.count += 1
        if len(rows["parent"]) >= FLUSH_ROWS:
            self.flush()
        return row

    def add_rows(
        self,
        parent: int,
        names: list[bytes],
        modes: np.ndarray,
        uids: np.ndarray,
        gids: np.ndarray,
        sizes: np.ndarray,
        mtimes: np.ndarray,
    ) -> int:
        """``add_row`` of many rows of one folder at once, as columns; the first one's number. An
        archive's folder of a thousand entries costs one call, not a thousand (the archive pass
        spent most of its time on 200,000 tiny members here, one row at a time)."""
        first, count = self.count, len(names)
        if count <= FEW_ROWS:
            for k, name in enumerate(names):
                self.add_row(
                    parent, name, int(modes[k]), int(uids[k]), int(gids[k]), int(sizes[k]), int(mtimes[k])
                )
            return first
        rows = self._rows
        lengths = np.fromiter(map(len, names), dtype=np.uint64, count=count)
        self._names += b"".join(names)
        ends = self._names_length + len(self._names) - int(lengths.sum()) + np.cumsum(lengths)
        # A dict lookup per row, in order: numbered as met, like add_row, and np.unique's sort of
        # the pairs cost 150 us a call, most of a one-member folder's time.
        owners = [self._owner(uid, gid) for uid, gid in zip(uids.tolist(), gids.tolist(), strict=True)]
        columns = {
            "parent": np.full(count, parent),
            "mode": modes,
            "owner": owners,
            "size": sizes,
            "mtime": mtimes,
            "name_end": ends,
        }
        for name, code in ROW_COLUMNS.items():
            rows[name].frombytes(np.asarray(columns[name], dtype=code).tobytes())
        regular = np.flatnonzero((modes & fmt.TYPE_MASK) == stat.S_IFREG)
        self._files.frombytes((first + regular).astype(np.uint64).tobytes())
        self.file_bytes += int(np.asarray(sizes)[regular].sum())
        self.count += count
        if len(rows["parent"]) >= FLUSH_ROWS:
            self.flush()
        return first

    def _owner(self, uid: int, gid: int) -> int:
        """The number of the (uid, gid) pair, numbered in the order the tree meets it."""
        owner = self.owners.get((uid, gid))
        return self._new_owner(uid, gid) if owner is None else owner

    def _new_owner(self, uid: int, gid: int) -> int:
        if len(self.owners) == fmt.OWNERS_MAX:
            raise PackError(
                f"the source tree has more than {fmt.OWNERS_MAX:,} distinct (uid, gid) owners, more than "
                "one index holds; pack its folders as separate datasets"
            )
        owner = self.owners[uid, gid] = len(self.owners)
        return owner

    def add_link(self, row: int, target: bytes) -> None:
        self._link_rows.append(row)
        self._links += target
        self._link_end.append(self._links_length + len(self._links))

    def flush(self) -> None:
        """Append the buffered rows to the column files."""
        append_buffers((self.columns[name], values) for name, values in self._rows.items())
        self._names_length += len(self._names)
        self._links_length += len(self._links)
        for what, length in (("names", self._names_length), ("symlink targets", self._links_length)):
            if length > fmt.BLOB_MAX:
                raise PackError(
                    f"the {what} in the source tree take more than 4 GiB, more than one index holds; "
                    "pack its folders as separate datasets"
                )
        append_buffers(
            (
                (self.names, self._names),
                (self.files, self._files),
                (self.link_rows, self._link_rows),
                (self.link_end, self._link_end),
                (self.links, self._links),
            )
        )

    def entries(self, rows: np.ndarray) -> list[tuple[int, bytes, int]]:
        """``(row, path, size)`` of each row (files, in the order given); ``path`` is where the
        file is read from."""
        if not len(rows):
            return []
        if self.origin is not None:
            walked, origin = self.origin
            found = walked.entries(origin.gather(rows).astype(np.int64))
            return [(row, path, size) for row, (_, path, size) in zip(rows.tolist(), found, strict=True)]
        ends = self.columns["name_end"].gather(rows)
        starts = self.columns["name_end"].gather(np.maximum(rows, 1) - 1)
        starts[rows == fmt.ROOT_ROW] = 0
        names = self.names.slices(starts, ends)
        parents = self.columns["parent"].gather(rows).tolist()
        sizes = self.columns["size"].gather(rows).tolist()
        return [
            (row, self.dirs[parent].path + b"/" + name, size)
            for row, parent, name, size in zip(rows.tolist(), parents, names, sizes, strict=True)
        ]


def _list_dir(path: bytes) -> list[tuple[bytes, os.stat_result]] | OSError:
    """One directory's entries, sorted by name bytes, with lstat results (a pool task). The
    largest directory's listing is in memory whole while it is sorted, ~200 bytes an entry."""
    try:
        with os.scandir(path) as it:
            entries = sorted(it, key=lambda e: e.name)
        return [(e.name, e.stat(follow_symlinks=False)) for e in entries]
    except OSError as exc:
        return exc


def _listings(
    pool: ThreadPoolExecutor, paths: list[bytes], ahead: int
) -> Iterator[list[tuple[bytes, os.stat_result]] | OSError]:
    """``_list_dir`` of each path, in order, at most ``ahead`` listings ahead of the caller: a
    level of ImageNet-21k's tree is all its 14.2 M files, and ``pool.map`` would hold every
    listing the walk had not yet consumed."""
    pending: deque[Future[list[tuple[bytes, os.stat_result]] | OSError]] = deque()
    for path in paths:
        pending.append(pool.submit(_list_dir, path))
        if len(pending) >= ahead:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def walk(
    src: bytes, spill: Spill, options: PackOptions, summary: PackSummary, pool: ThreadPoolExecutor
) -> Tree:
    """Breadth-first, one level at a time, the level's directories listed in parallel.

    Results are consumed in row order, so rows come out exactly as a sequential BFS would number
    them; the pool only overlaps the ``lstat`` calls, which dominate on a cold tree.
    """
    tree = Tree(spill)
    tree.add(fmt.ROOT_ROW, b"", os.lstat(src))
    tree.dirs[fmt.ROOT_ROW] = Directory(src)
    level = [fmt.ROOT_ROW]
    while level:
        next_level = []
        listings = _listings(pool, [tree.dirs[row].path for row in level], 2 * options.threads)
        for row, listing in zip(level, listings, strict=True):
            directory = tree.dirs[row]
            path = directory.path
            if isinstance(listing, OSError):
                fail_or_skip(f"cannot list {os.fsdecode(path)}: {listing.strerror}", options, summary, path)
                continue
            directory.first = len(tree)
            for name, st in listing:
                kind = stat.S_IFMT(st.st_mode)
                child_path = path + b"/" + name
                if kind not in (stat.S_IFREG, stat.S_IFDIR, stat.S_IFLNK):
                    log.warning("skipping special file %s", os.fsdecode(child_path))
                    summary.skipped_special += 1
                    continue
                child = tree.add(row, name, st)
                if kind == stat.S_IFREG and st.st_nlink > 1:
                    tree.hard_links.setdefault((st.st_dev, st.st_ino), []).append(child)
                if kind == stat.S_IFDIR:
                    tree.dirs[child] = Directory(child_path)
                    next_level.append(child)
                elif kind == stat.S_IFLNK:
                    tree.add_link(child, os.readlink(child_path))
            directory.count = len(tree) - directory.first
        level = next_level
    tree.flush()
    return tree
