"""Cursor following: where the reader of one published sequence is, told by the reads that reach
the daemon.

Pushed files are invisible to the daemon, so the reader's position is learned from its sentinels
(files kept back from the page cache, see ``batch.sentinel_spacing``) and from the files the
read-ahead missed. Nothing here does I/O: the engine feeds reads in and acts on what comes out.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from dlfs.core.protocol import Reading


class Move(enum.Enum):
    """What a read of a position in the sequence says about its reader."""

    NONE = enum.auto()  # a file of no followed sequence, or of another reader (see ``Follow.read``)
    BEHIND = enum.auto()  # a slower worker, less than a lead behind the cursor
    ADVANCED = enum.auto()  # the reader got further
    SKIPPED = enum.auto()  # the reader jumped more than a lead past what was fetched
    RESTARTED = enum.auto()  # the epoch started over


#: Reads that show the sequence's own reader at work: they keep its read-ahead going, or resume it.
#: A skip does not: any reader's file lands more than a lead ahead of most sequences' cursors.
READER_MOVES = frozenset({Move.BEHIND, Move.ADVANCED, Move.RESTARTED})


class Seen(NamedTuple):
    move: Move
    #: Files between the old cursor and the read one: read from the page cache (or lost) meanwhile.
    passed: int = 0


@dataclass
class Follow:
    """Where one published sequence stands.

    The reader got to ``cursor``. Every position below ``fetched`` was fetched or passed over; above
    it, ``done`` marks the files fetched early as neighbours of others. ``ahead`` counts the bytes
    fetched at or past the cursor: what the budget bounds.
    """

    reading: Reading
    position: np.ndarray  # row -> first position in the sequence, or -1 (int32: 5 MB per 1.28 M rows)
    sizes: np.ndarray  # cumulative bytes of the sequence, for O(1) lead sizes
    done: np.ndarray  # position -> fetched (meaningful from ``fetched`` on)
    cursor: int = 0
    fetched: int = 0
    ahead: int = 0
    paused: bool = False
    heard: float = 0.0

    @classmethod
    def start(cls, reading: Reading, file_sizes: np.ndarray) -> Follow:
        """Follow ``reading`` from its first file; ``file_sizes``: every row's size."""
        position = np.full(file_sizes.size, -1, dtype=np.int32)
        position[reading.rows[::-1]] = np.arange(reading.rows.size - 1, -1, -1)
        sizes = np.zeros(reading.rows.size + 1, dtype=np.int64)
        np.cumsum(file_sizes[reading.rows], out=sizes[1:])
        return cls(reading, position, sizes, np.zeros(reading.rows.size, dtype=bool))

    @property
    def total(self) -> int:
        return int(self.reading.rows.size)

    def size_at(self, positions: np.ndarray) -> np.ndarray:
        return self.sizes[positions + 1] - self.sizes[positions]

    def lead_files(self, budget: int, sentinel_every: int) -> int:
        """Files the budget holds from the cursor on, and never fewer than one sentinel spacing."""
        ahead = np.searchsorted(self.sizes, self.sizes[self.cursor] + budget)
        return max(int(ahead) - self.cursor, sentinel_every)

    def mark(self, positions: np.ndarray) -> None:
        """These files are being fetched; move ``fetched`` past every fetched position."""
        self.done[positions] = True
        self.ahead += int(self.size_at(positions[positions >= self.cursor]).sum())
        tail = self.done[self.fetched :]
        self.fetched += int(np.argmin(tail)) if not tail.all() else tail.size

    def advance(self, pos: int) -> None:
        """The reader got to ``pos``: what it passed no longer counts against the budget."""
        span = np.arange(self.cursor, pos)
        self.ahead -= int(self.size_at(span[self.done[span]]).sum())
        self.cursor = pos

    def skip_to(self, pos: int) -> None:
        """Fetch from ``pos`` on: a reader jumped there, the files before it are not wanted."""
        span = np.arange(self.fetched, pos)
        self.ahead -= int(self.size_at(span[self.done[span]]).sum())
        self.fetched = pos

    def restart(self, pos: int) -> None:
        self.cursor = self.fetched = pos
        self.done[pos:] = False
        self.ahead = 0

    def resume(self) -> None:
        """The reader of a paused sequence is back, at the cursor: what the kernel lost behind it,
        the reader read before it stopped, so it is not fetched again."""
        self.paused = False
        self.fetched = max(self.fetched, self.cursor)

    def lost(self, positions: np.ndarray) -> None:
        """Fetched files the kernel dropped before the reader came: fetch them again."""
        self.done[positions] = False
        self.ahead -= int(self.size_at(positions).sum())
        self.fetched = min(self.fetched, int(positions.min()))

    def forgotten(self, rows: np.ndarray) -> int:
        """The kernel dropped these rows' pages: those fetched still ahead of the reader are fetched
        again. Returns how many."""
        positions = self.position[rows]
        positions = positions[positions >= self.cursor]
        lost = positions[self.done[positions] | (positions < self.fetched)]
        if lost.size:
            self.lost(lost)
        return int(lost.size)

    def read(self, row: int, budget: int, sentinel_every: int) -> Seen:
        """A read of ``row`` reached the daemon: move the cursor.

        Several readers (DataLoader workers) share one sequence and never quite keep step, so the
        cursor is the furthest position seen. A read behind it is a slower worker, unless it is one
        of the sequence's first two sentinels while the cursor is a lead past it: then the epoch
        restarted. Sentinels are never pushed, so a reader starting over always reaches them; a
        slow worker a lead behind is common, one still at the very start is not. Any other read
        more than a lead behind is another reader's file: every file is in every epoch.

        A read beyond what was fetched moves the fetching there only when it is more than a lead
        ahead (a reader skipped); a nearer one is a fast worker, and the files behind it are exactly
        what the others need next, so they are still fetched. A paused sequence takes no skip: its
        reader comes back where it stopped (a job that starts over elsewhere resolves the order file
        again, which resumes it), and a read far ahead is then another reader's file.
        """
        pos = int(self.position[row])
        if pos < 0:
            return Seen(Move.NONE)
        # The lead (a binary search) only matters for reads past what was fetched or behind the
        # cursor; most reads that reach the daemon are sentinels between the two.
        if pos >= self.cursor:
            move = Move.ADVANCED
            if pos >= self.fetched and pos >= self.fetched + self.lead_files(budget, sentinel_every):
                if self.paused:
                    return Seen(Move.NONE)
                move = Move.SKIPPED
                self.skip_to(pos)
            passed = pos - self.cursor
            self.advance(pos)
            return Seen(move, passed)
        behind = self.cursor - pos
        if behind < self.lead_files(budget, sentinel_every):
            return Seen(Move.BEHIND)
        if pos in (0, sentinel_every):
            self.restart(pos)
            return Seen(Move.RESTARTED)
        return Seen(Move.NONE)

    def summary(self) -> dict[str, int]:
        return {
            "files": self.total,
            "cursor": self.cursor,
            "fetched": self.fetched,
            "lead_files": int(self.done[self.cursor :].sum()),
            "lead_bytes": self.ahead,
            "paused": self.paused,
        }
