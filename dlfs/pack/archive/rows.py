"""The ledger's members sorted into the index's rows: the tree breadth-first, each folder's
entries by name bytes, exactly as the directory walk numbers a tree (``walk.Tree``).

Hard links are resolved first: each takes the bytes and attributes of the member its target named
when it arrived (as ``tar x`` links to the file extracted so far), and the rows that end up with
one member's bytes share its inode (``Tree.hard_links``). Then each folder's members are read from
the ledger, sorted and settled: of several members at one path the last wins, whatever their types,
as with ``tar x``; a folder counts as arriving with the last member named at or below it, and one
that loses to a file or symlink takes its subtree with it. The folder being sorted is the only one
whose names are in memory (~200 bytes an entry), plus about 20 bytes a member for the grouping of
members by folder.
"""

from __future__ import annotations

import logging
import stat
from collections import deque

import numpy as np

from dlfs.core import format as fmt
from dlfs.pack.archive.ledger import LEDGER_COLUMNS, Folder, Ledger
from dlfs.pack.archive.members import HARDLINK, show
from dlfs.pack.columns import PLACED_COLUMNS, Placed
from dlfs.pack.options import PackOptions, PackSummary, fail_or_skip
from dlfs.pack.spill import Column, Spill
from dlfs.pack.walk import Directory, Tree

log = logging.getLogger(__name__)

#: Rows whose payloads are placed at a time.
PLACE_CHUNK = 1 << 16
#: What a hard link takes from its target: everything but its own name and folder (a symlink's
#: target too: a hard link to a symlink is a symlink).
TAKEN = [name for name in LEDGER_COLUMNS if name not in ("parent", "name_end")]


class _Groups:
    """The ledger's members grouped by folder, in arrival order within each."""

    def __init__(self, ledger: Ledger) -> None:
        parents = ledger.columns["parent"].read(0, len(ledger))
        self.order = np.argsort(parents, kind="stable")
        self.bounds = np.searchsorted(parents[self.order], np.arange(len(ledger.folders) + 1))

    def members(self, folder: int) -> np.ndarray:
        return self.order[self.bounds[folder] : self.bounds[folder + 1]]


def build(ledger: Ledger, spill: Spill, options: PackOptions, summary: PackSummary) -> tuple[Tree, Placed]:
    """The tree and its placements, ready for ``columns.IndexRows``."""
    tree, file_members = layout(ledger, spill, options, summary)
    placed = Placed(tree, spill)
    for start, stop in tree.files.chunks(PLACE_CHUNK):
        rows = tree.files.read(start, stop).astype(np.int64)
        chosen = file_members.read(start, stop)
        values = {name: ledger.columns[name].gather(chosen) for name in PLACED_COLUMNS if name != "placed"}
        placed.add_many(rows, ledger.columns["size"].gather(chosen), values)
    return tree, placed


def layout(ledger: Ledger, spill: Spill, options: PackOptions, summary: PackSummary) -> tuple[Tree, Column]:
    """The tree, and the member each of its files (``tree.files``) came from."""
    ledger.flush()
    groups = _Groups(ledger)
    sources = _resolve_hard_links(ledger, groups, options, summary)
    linked = set(sources.values())
    tree = Tree(spill)
    file_members = spill.column("file-members", np.int64)
    root = ledger.folders[fmt.ROOT_ROW]
    tree.add_row(fmt.ROOT_ROW, b"", stat.S_IFDIR | root.mode, root.uid, root.gid, 0, root.mtime_ns)
    children: list[list[int]] = [[] for _ in ledger.folders]
    for number, folder in enumerate(ledger.folders[1:], start=1):
        children[folder.parent].append(number)
    queue = deque([(fmt.ROOT_ROW, fmt.ROOT_ROW, b"")])
    while queue:
        folder, row, path = queue.popleft()
        directory = tree.dirs[row] = Directory(path, len(tree))
        entries = _entries(ledger, groups, folder, children, path, options, summary)
        numbers = np.fromiter((entry for _, entry in entries), dtype=np.int64, count=len(entries))
        members = np.flatnonzero(numbers >= 0)
        picked = numbers[members]
        count = len(entries)
        modes, uids, gids = (np.zeros(count, np.int64) for _ in range(3))
        sizes, mtimes = np.zeros(count, np.int64), np.zeros(count, np.int64)
        for column, name in (
            (modes, "mode"),
            (uids, "uid"),
            (gids, "gid"),
            (sizes, "size"),
            (mtimes, "mtime"),
        ):
            column[members] = ledger.columns[name].gather(picked)
        subfolders = np.flatnonzero(numbers < 0)
        for k in subfolders.tolist():
            sub = ledger.folders[-int(numbers[k]) - 1]
            modes[k], uids[k], gids[k], mtimes[k] = stat.S_IFDIR | sub.mode, sub.uid, sub.gid, sub.mtime_ns
        first = tree.add_rows(row, [name for name, _ in entries], modes, uids, gids, sizes, mtimes)
        for k in subfolders.tolist():
            name = entries[k][0]
            queue.append((-int(numbers[k]) - 1, first + k, path + b"/" + name if path else name))
        kinds = modes[members] & fmt.TYPE_MASK
        links = members[kinds == stat.S_IFLNK]
        for k, target in zip(
            links.tolist(), ledger.targets_of(ledger.columns["link"].gather(numbers[links])), strict=True
        ):
            tree.add_link(first + k, target)
        files = members[kinds != stat.S_IFLNK]
        file_members.extend(numbers[files])
        if linked or ledger.sparse:  # the few files that share an inode or have holes
            for k in files.tolist():
                origin = sources.get(int(numbers[k]), int(numbers[k]))
                if origin in linked:
                    tree.hard_links.setdefault(origin, []).append(first + k)
                if origin in ledger.sparse:
                    tree.sparse[first + k] = ledger.sparse[origin]
        directory.count = len(tree) - directory.first
    tree.flush()
    return tree, file_members


def _entries(
    ledger: Ledger,
    groups: _Groups,
    folder: int,
    children: list[list[int]],
    path: bytes,
    options: PackOptions,
    summary: PackSummary,
) -> list[tuple[bytes, int]]:
    """A folder's entries sorted by name: (name, member number), or (name, -1 - folder number). Of
    members at one name the last to arrive wins, and so does a folder against a member that
    arrived before everything named at or below it (``_last_arrival``). Under ``--map`` a folder
    and a file at one path are refused instead: a map is strict where ``tar x`` is lenient
    (``path_map``), since a map that places members below a file is the likelier mistake."""
    members = groups.members(folder)
    members = members[ledger.columns["mode"].gather(members) != 0]
    by_name: dict[bytes, int] = {}
    for name, member in zip(ledger.name_of(members), members.tolist(), strict=True):
        if name in by_name:
            _replaced(_join(path, name), summary)
        by_name[name] = member
    for number in children[folder]:
        name = ledger.folders[number].name
        if name in by_name and options.path_map is not None:
            del by_name[name]
            fail_or_skip(
                f"{show(_join(path, name))} is both a folder and a file or symlink once --map places them",
                options,
                summary,
                _join(path, name),
            )
        elif name in by_name:
            member = by_name[name]
            _replaced(_join(path, name), summary)
            if _arrival(member) > _last_arrival(ledger, groups, children, number):
                continue  # the file or symlink came later: the folder and all below it go
        by_name[name] = -1 - number
    return sorted(by_name.items())


def _replaced(path: bytes, summary: PackSummary) -> None:
    log.warning("%s is in the archive more than once; the last one is kept, as tar x keeps it", show(path))
    summary.duplicates += 1


def _arrival(member: int) -> int:
    """When member number ``member`` arrived, on the clock ``_last_arrival`` reads: a folder
    member named when ``n`` members had arrived came at ``2 n``, between members ``n - 1`` and
    ``n``."""
    return 2 * member + 1


def _last_arrival(ledger: Ledger, groups: _Groups, children: list[list[int]], folder: int) -> int:
    """When a folder last arrived (``_arrival``'s clock): with the last member named at or below it."""
    last, stack = -1, [folder]
    while stack:
        number = stack.pop()
        named = ledger.folders[number].named_at
        last = max(
            last, 2 * named if named >= 0 else -1, _arrival(int(groups.members(number).max(initial=-1)))
        )
        stack.extend(children[number])
    return last


def _join(path: bytes, name: bytes) -> bytes:
    return path + b"/" + name if path else name


def _folder_path(folders: list[Folder], number: int) -> bytes:
    parts = []
    while number != fmt.ROOT_ROW:
        parts.append(folders[number].name)
        number = folders[number].parent
    return b"/".join(reversed(parts))


def _resolve_hard_links(
    ledger: Ledger, groups: _Groups, options: PackOptions, summary: PackSummary
) -> dict[int, int]:
    """Give every hard link the bytes and attributes of the member its target named when it
    arrived (a hard link in its turn: that one's own); refuse one whose target the archive did not
    hold as a file or symlink before it. Returns each link's source member."""
    mode = ledger.columns["mode"]
    found = [
        start + np.flatnonzero((mode.read(start, stop) & fmt.TYPE_MASK) == HARDLINK)
        for start, stop in mode.chunks(PLACE_CHUNK)
    ]
    links = np.concatenate(found) if found else np.zeros(0, dtype=np.int64)
    if not len(links):
        return {}
    parsed = []
    wanted: dict[int, set[bytes]] = {}
    for member, target in zip(
        links.tolist(), ledger.targets_of(ledger.columns["link"].gather(links)), strict=True
    ):
        folder_path, _, name = target.rpartition(b"/")
        folder = ledger.folder_ids.get(folder_path)
        parsed.append((member, target, folder, name))
        if folder is not None:
            wanted.setdefault(folder, set()).add(name)
    candidates: dict[tuple[int, bytes], list[int]] = {}
    for folder, names in wanted.items():
        members = groups.members(folder)
        for name, member in zip(ledger.name_of(members), members.tolist(), strict=True):
            if name in names:
                candidates.setdefault((folder, name), []).append(member)
    is_link = set(links.tolist())
    sources: dict[int, int] = {}
    for member, target, folder, name in parsed:
        earlier = [c for c in candidates.get((folder, name), []) if c < member]
        source = earlier[-1] if earlier else None
        if source in is_link:
            source = sources.get(source)  # None: that link had no source either
        kind = None if source is None else int(mode.gather(np.array([source]))[0]) & fmt.TYPE_MASK
        if kind not in (stat.S_IFREG, stat.S_IFLNK):
            mine = _join(
                _folder_path(ledger.folders, int(ledger.columns["parent"].gather(np.array([member]))[0])),
                ledger.name_of(np.array([member]))[0],
            )
            fail_or_skip(
                f"hard link {show(mine)} points at {show(target)}, which the archive does not hold as a "
                "file before it",
                options,
                summary,
                mine,
            )
            mode.scatter(np.array([member]), np.zeros(1, dtype=np.uint16))
            continue
        assert source is not None
        sources[member] = source
    if sources:
        to, source_rows = (
            np.array(list(sources), dtype=np.int64),
            np.array(list(sources.values()), dtype=np.int64),
        )
        for name in TAKEN:
            ledger.columns[name].scatter(to, ledger.columns[name].gather(source_rows))
    return sources
