"""``dlfs pack --map FILE``: a list of (source path, tree path) pairs that places members where
training code expects them, e.g. ImageNet's flat validation tar into ``val/<wnid>/`` folders.

The mapping itself is a pure function of a member's path (``moved``), so it applies to every
source the same way: a tree's relative paths, an archive's member paths after normalisation (with
``--expand-tars``, ``NAME/member``; in place from a folder of tars, ``shard/member``). Only files,
symlinks and hard links move; a folder is never moved (a map naming one is refused) and a moved
member's missing folders are made as an archive's unnamed folders are. Tree paths are untrusted
like member names and pass the same rules (``members.normalize``); a symlink moves with its target
as it is, like any symlink member.

The file is CSV, or TSV where its first entry line holds a tab, read with ``csv`` so that quoted
names may hold the delimiter; blank lines and lines starting with ``#`` are skipped, and there is
no header line. Each source is named once and each tree path given once (else one line naming
the lines), and a member left in place at a path the map gives another one is refused: a map
that would silently replace members is a wrong map, not the last-one-wins of ``tar x``.

Memory: no Python object per entry. Both columns' bytes lie in two blobs, with a sorted array of
64-bit hashes for each (searched with ``bisect``, the bytes compared on a match), about 45 bytes
an entry beside the names themselves (docs/design.md has the figure at ImageNet scale).
"""

from __future__ import annotations

import csv
import logging
import os
import stat
from array import array
from bisect import bisect_left
from collections.abc import Iterator

import numpy as np
import xxhash

from dlfs.core.errors import PackError
from dlfs.pack.archive import members
from dlfs.pack.archive.members import HARDLINK, Member, Refused, show

log = logging.getLogger(__name__)

#: Map entries that named no member, shown in the warning that counts them.
UNUSED_SHOWN = 3


class _Column:
    """One column of the map: every entry's path in one blob, and its entries sorted by hash."""

    def __init__(self) -> None:
        self.blob = bytearray()
        self._ends = array("Q")
        self._hashes = array("Q")

    def append(self, path: bytes) -> None:
        self.blob += path
        self._ends.append(len(self.blob))
        self._hashes.append(xxhash.xxh3_64_intdigest(path))

    def seal(self) -> None:
        """Sort the entries by hash, for ``find``; the unsorted hashes are dropped. The sorted
        arrays are ``array`` s, which ``bisect`` searches in C without a numpy scalar per step."""
        hashes = np.frombuffer(self._hashes, dtype=np.uint64)
        order = np.argsort(hashes, kind="stable")
        self.order, self.sorted = array("I"), array("Q")
        self.order.frombytes(memoryview(order.astype(np.uint32)).cast("B"))
        self.sorted.frombytes(memoryview(hashes[order]).cast("B"))
        del hashes, self._hashes

    def __getitem__(self, entry: int) -> bytes:
        start = self._ends[entry - 1] if entry else 0
        return bytes(self.blob[start : self._ends[entry]])

    def find(self, path: bytes) -> int:
        """The entry holding ``path``, or -1."""
        key = xxhash.xxh3_64_intdigest(path)
        at = bisect_left(self.sorted, key)
        while at < len(self.sorted) and self.sorted[at] == key:
            entry = self.order[at]
            if self[entry] == path:
                return entry
            at += 1
        return -1

    def repeated(self) -> Iterator[tuple[int, int]]:
        """(earlier, later) entries holding the same path."""
        hashes = np.frombuffer(self.sorted, dtype=np.uint64)
        for at in np.flatnonzero(hashes[1:] == hashes[:-1]).tolist():
            first, second = sorted((self.order[at], self.order[at + 1]))
            if self[first] == self[second]:
                yield first, second


class PathMap:
    """A ``--map`` file, read and checked; ``place`` moves members as a pack meets them, and
    counts them for its summary (one ``PathMap`` serves one pack)."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.sources, self.targets = _Column(), _Column()
        #: The line each entry ends on, for messages.
        self.lines = array("I")
        try:
            self._read()
        except OSError as exc:
            raise PackError(f"cannot read the map {file}: {exc.strerror}") from None
        self.sources.seal()
        self.targets.seal()
        for first, second in self.sources.repeated():
            raise PackError(
                f"{self._at(second)}: {show(self.sources[second])} is mapped already on line "
                f"{self.lines[first]}; name each member once"
            )
        for first, second in self.targets.repeated():
            raise PackError(
                f"{self._at(second)}: {show(self.targets[second])} is where line {self.lines[first]} places "
                f"{show(self.sources[first])} already; give each member a path of its own"
            )
        self.used = np.zeros(len(self.lines), dtype=bool)
        #: Entries whose tree path a member that does not move holds.
        self.occupied: set[int] = set()
        self.mapped = self.unmapped = 0

    def __len__(self) -> int:
        return len(self.lines)

    def _at(self, entry: int) -> str:
        return f"{self.file}, line {self.lines[entry]}"

    def _read(self) -> None:
        with open(self.file, encoding="utf-8", errors="surrogateescape", newline="") as f:
            first = next((line for line in _entry_lines(f) if line.strip()), "")
            delimiter = "\t" if "\t" in first else ","
            f.seek(0)
            reader = csv.reader(_entry_lines(f), delimiter=delimiter, strict=True)
            try:
                for row in reader:
                    if len(row) <= 1 and not "".join(row).strip():
                        continue
                    self._add(row, reader.line_num)
            except csv.Error as exc:
                raise PackError(f"{self.file}, line {reader.line_num}: {exc}") from None

    def _add(self, row: list[str], line: int) -> None:
        where = f"{self.file}, line {line}"
        if len(row) != 2:
            raise PackError(
                f"{where}: {len(row)} fields where two are wanted: the path in the source, then the path "
                "in the tree"
            )
        source, target = (os.fsencode(field) for field in row)
        try:
            source = members.normalize(source)
            placed = members.normalize(target)
        except Refused as exc:
            raise PackError(f"{where}: {exc}") from None
        if not source:
            raise PackError(f"{where}: the source path is empty; name a member")
        if placed != target or not placed:
            raise PackError(
                f"{where}: {show(target)!r} is not a plain relative path (absolute, empty, or with an "
                "empty or '.' component); write it as the path below the tree's root"
            )
        self.sources.append(source)
        self.targets.append(placed)
        self.lines.append(line)

    def moved(self, path: bytes) -> bytes | None:
        """Where the map places the member at ``path``; None where it stays."""
        entry = self.sources.find(path)
        return None if entry < 0 else self.targets[entry]

    def place(self, member: Member) -> None:
        """Move ``member`` to its tree path and count it; a moved symlink that no longer stays in
        the tree gets its ``problem``. A hard link follows its target where the map moves it."""
        entry = self.sources.find(member.path)
        if member.kind == stat.S_IFDIR:
            if entry >= 0:
                raise PackError(
                    f"{self._at(entry)}: {show(member.path)} is a folder, which the map does not move; "
                    "name its files instead"
                )
            return
        if member.kind == HARDLINK:
            member.target = self.moved(member.target) or member.target
        if entry < 0:
            self.unmapped += 1
            taken = self.targets.find(member.path)
            if taken >= 0:
                self.occupied.add(taken)
                self._check_free(taken)
            return
        self.used[entry] = True
        self.mapped += 1
        self._check_free(entry)
        member.path = self.targets[entry]

    def _check_free(self, entry: int) -> None:
        """Refuse a member placed where one that does not move lies."""
        if self.used[entry] and entry in self.occupied:
            raise PackError(
                f"{self._at(entry)} places {show(self.sources[entry])} at {show(self.targets[entry])}, "
                "where a member the map does not move lies; move that one too, or place this one elsewhere"
            )

    def report(self) -> tuple[int, int, int]:
        """(members moved, members left in place, entries that named no member); the last are
        warned of, with the first few."""
        unused = np.flatnonzero(~self.used)
        if len(unused):
            shown = ", ".join(show(self.sources[int(entry)]) for entry in unused[:UNUSED_SHOWN])
            log.warning(
                "%d map entries named no member, e.g. %s; check the paths in %s against dlfs ls",
                len(unused),
                shown,
                self.file,
            )
        return self.mapped, self.unmapped, len(unused)


def _entry_lines(lines: Iterator[str]) -> Iterator[str]:
    """The file's lines with every comment line made blank (so line numbers still count them)."""
    for line in lines:
        yield "\n" if line.startswith("#") else line
