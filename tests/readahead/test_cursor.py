"""Cursor following without a mount: what a read that reaches the daemon says about its reader."""

from __future__ import annotations

import numpy as np

from dlfs.core.protocol import Reading
from dlfs.readahead.cursor import Follow, Move

FILES = 1000
SIZE = 1000
#: The lead: the budget holds 100 files; sentinels every 13.
BUDGET = 100 * SIZE
EVERY = 13


def _follow(fetched: int = 0) -> Follow:
    """A sequence of ``FILES`` rows in reverse order (row r at position FILES - 1 - r), of which
    the first ``fetched`` positions were fetched."""
    rows = np.arange(FILES - 1, -1, -1)
    follow = Follow.start(Reading(epoch=0, world_size=1, rank=0, rows=rows), np.full(FILES + 5, SIZE))
    if fetched:
        follow.mark(np.arange(fetched))
    return follow


def _row(position: int) -> int:
    return FILES - 1 - position


def test_the_cursor_is_the_furthest_position_read() -> None:
    follow = _follow(fetched=80)
    assert follow.ahead == 80 * SIZE
    assert follow.read(_row(50), BUDGET, EVERY) == (Move.ADVANCED, 50)
    assert follow.cursor == 50 and follow.ahead == 30 * SIZE, "what the reader passed leaves the budget"
    assert follow.read(_row(40), BUDGET, EVERY).move is Move.BEHIND, "a slower worker"
    assert follow.read(_row(60), BUDGET, EVERY) == (Move.ADVANCED, 10)
    assert (follow.cursor, follow.fetched) == (60, 80)


def test_rows_of_no_followed_sequence_move_nothing() -> None:
    follow = _follow(fetched=10)
    assert follow.read(FILES + 2, BUDGET, EVERY).move is Move.NONE
    assert (follow.cursor, follow.fetched, follow.ahead) == (0, 10, 10 * SIZE)


def test_a_read_of_the_first_sentinels_a_lead_behind_restarts_the_epoch() -> None:
    for sentinel in (0, EVERY):
        follow = _follow(fetched=300)
        follow.read(_row(250), BUDGET, EVERY)
        assert follow.read(_row(sentinel), BUDGET, EVERY).move is Move.RESTARTED
        assert (follow.cursor, follow.fetched, follow.ahead) == (sentinel, sentinel, 0)
        assert not follow.done[sentinel:].any(), "everything from there is fetched again"


def test_a_slow_worker_near_the_start_is_no_restart() -> None:
    follow = _follow(fetched=150)
    follow.read(_row(90), BUDGET, EVERY)  # less than a lead (100 files) past position 0
    assert follow.read(_row(0), BUDGET, EVERY).move is Move.BEHIND
    assert follow.cursor == 90
    follow.read(_row(140), BUDGET, EVERY)
    assert follow.read(_row(7), BUDGET, EVERY).move is Move.NONE, "not its reader's"


def test_a_read_more_than_a_lead_past_what_was_fetched_is_a_skip() -> None:
    follow = _follow(fetched=50)
    assert follow.read(_row(120), BUDGET, EVERY).move is Move.ADVANCED, "a fast worker, not a skip"
    assert follow.fetched == 50, "the files behind a fast worker are still fetched"
    follow = _follow(fetched=50)
    assert follow.read(_row(151), BUDGET, EVERY) == (Move.SKIPPED, 151)
    assert (follow.cursor, follow.fetched, follow.ahead) == (151, 151, 0)


def test_a_paused_sequence_takes_no_skip() -> None:
    """A read far ahead of a paused sequence is another reader's file: nothing moves. Its own
    reader, back where it stopped, is seen as such."""
    follow = _follow(fetched=50)
    follow.paused = True
    assert follow.read(_row(151), BUDGET, EVERY).move is Move.NONE
    assert (follow.cursor, follow.fetched, follow.ahead) == (0, 50, 50 * SIZE)
    assert follow.read(_row(30), BUDGET, EVERY) == (Move.ADVANCED, 30)


def test_files_the_kernel_forgot_ahead_of_the_reader_are_fetched_again() -> None:
    follow = _follow(fetched=100)
    follow.read(_row(40), BUDGET, EVERY)
    forgotten = np.array([_row(p) for p in (10, 60, 70, 500)])  # behind, two ahead, never fetched
    assert follow.forgotten(forgotten) == 2
    assert follow.fetched == 60 and follow.ahead == 58 * SIZE
    assert not follow.done[[60, 70]].any() and follow.done[61:70].all()


def test_marking_moves_fetched_past_every_fetched_position() -> None:
    follow = _follow()
    follow.mark(np.array([0, 1, 5]))
    assert follow.fetched == 2
    follow.mark(np.array([2, 3, 4]))
    assert follow.fetched == 6 and follow.ahead == 6 * SIZE
    assert follow.summary() == {
        "files": FILES,
        "cursor": 0,
        "fetched": 6,
        "lead_files": 6,
        "lead_bytes": 6000,
        "paused": False,
    }
