"""A directory tree laid out again through ``--map`` (``path_map``).

The walk numbers the source tree's rows as it finds them; a map moves files between folders, so
the rows are sorted again. The walked rows become members of an archive's ``Ledger``, each moved
by the map, and ``archive.rows`` sorts them into the index's order with the archive's rules (new
folders made 0755, a path both a folder and a file refused). Each file row keeps its walked row,
through which ``Tree.entries`` still reads it from its own path; the rest of the pack (placement,
the parallel reads, in-place shards) is that of any tree.
"""

from __future__ import annotations

import stat

import numpy as np

from dlfs.core import format as fmt
from dlfs.pack.archive import rows
from dlfs.pack.archive.ledger import Folder, Ledger
from dlfs.pack.archive.members import Member
from dlfs.pack.options import PackOptions, PackSummary
from dlfs.pack.pipeline import Payload
from dlfs.pack.spill import Column, Spill
from dlfs.pack.walk import Tree

#: Walked rows read at a time.
ROWS_CHUNK = 1 << 16


def remap(walked: Tree, spill: Spill, options: PackOptions, summary: PackSummary) -> Tree:
    """``walked`` (in columns of its own, not ``spill``'s) with every member where
    ``options.path_map`` places it."""
    owners = {number: owner for owner, number in walked.owners.items()}
    mode, owner, mtime = (int(walked.columns[name].read(0, 1)[0]) for name in ("mode", "owner", "mtime"))
    ledger = Ledger(spill, Folder(fmt.ROOT_ROW, b"", stat.S_IMODE(mode), *owners[owner], mtime))
    skip = len(walked.dirs[fmt.ROOT_ROW].path) + 1  # a walked path past the source's own
    link_rows = walked.link_rows.read(0, len(walked.link_rows)).astype(np.int64)
    for start, stop in walked.columns["parent"].chunks(ROWS_CHUNK):
        columns = {name: walked.columns[name].read(start, stop).tolist() for name in walked.columns}
        names = walked.names.slices(*_bounds(walked.columns["name_end"], start, stop))
        first, last = np.searchsorted(link_rows, [start, stop]).tolist()
        links = walked.links.slices(*_bounds(walked.link_end, first, last))
        targets = dict(zip(link_rows[first:last].tolist(), links, strict=True))
        for offset, name in enumerate(names):
            row = start + offset
            if row == fmt.ROOT_ROW:
                continue
            folder = walked.dirs[columns["parent"][offset]].path[skip:]
            member = Member(
                folder + b"/" + name if folder else name,
                stat.S_IFMT(columns["mode"][offset]),
                stat.S_IMODE(columns["mode"][offset]),
                *owners[columns["owner"][offset]],
                columns["mtime"][offset],
                columns["size"][offset],
                targets.get(row, b""),
                offset=row,
            )
            _record(member, ledger, options, summary)
    tree, file_members = rows.layout(ledger, spill, options, summary)
    origin = spill.column("origin", np.uint64, len(tree))
    for start, stop in tree.files.chunks(ROWS_CHUNK):
        files = tree.files.read(start, stop).astype(np.int64)
        origin.scatter(files, ledger.columns["source"].gather(file_members.read(start, stop)))
    tree.origin = (walked, origin)
    _carry_hard_links(walked, tree, origin)
    return tree


def _carry_hard_links(walked: Tree, tree: Tree, origin: Column) -> None:
    """The walked tree's hard links, at the rows their files have now."""
    keys = {row: key for key, rows in walked.hard_links.items() for row in rows}
    if not keys:
        return
    for start, stop in tree.files.chunks(ROWS_CHUNK):
        files = tree.files.read(start, stop).astype(np.int64)
        for row, walked_row in zip(files.tolist(), origin.gather(files).tolist(), strict=True):
            if walked_row in keys:
                tree.hard_links.setdefault(keys[walked_row], []).append(row)


def _bounds(ends: Column, first: int, last: int) -> tuple[np.ndarray, np.ndarray]:
    """Where items ``first`` up to ``last`` of a blob start and end, from its ``ends`` column."""
    stop = ends.read(first, last).astype(np.int64)
    before = ends.read(first - 1, first).astype(np.int64) if first else np.zeros(1, dtype=np.int64)
    return np.concatenate((before, stop))[:-1], stop


def _record(member: Member, ledger: Ledger, options: PackOptions, summary: PackSummary) -> None:
    """One walked entry into the ledger, where the map places it."""
    if not ledger.admit(member, options, summary):
        return
    if member.kind == stat.S_IFDIR:
        ledger.folder(member)
    else:
        ledger.add(member, Payload(b"", 0, member.size, 0) if member.kind == stat.S_IFREG else None)
