"""The S3 store's hint cache (``dlfs.core.store.s3.hints``) without a server: its ``get`` is a
function over an object in memory that records each call."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import pytest
from waits import Asked, wait_for

from dlfs.core.store.s3.hints import HintCache

OBJECT = bytes(range(256)) * 64


class Body(bytes):
    """A response body whose length is computed in Python code: a thread may be switched out
    while it counts, between reading a counter and writing it back."""

    def __len__(self) -> int:
        return bytes.__len__(self)


class Gets:
    """A ``get`` over ``OBJECT``, recording every range asked for; ``gate`` holds each GET."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int, int]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail: Exception | None = None

    def __call__(self, name: str, offset: int, length: int) -> Body:
        self.gate.wait(30)
        self.asked.append((name, offset, length))
        if self.fail is not None:
            raise self.fail
        return Body(OBJECT[offset : offset + length])


@pytest.fixture
def gets() -> Gets:
    return Gets()


@pytest.fixture
def hints(gets: Gets) -> Iterator[HintCache]:
    cache = HintCache(gets, threads=4, budget=4096, ttl=3600.0)
    try:
        yield cache
    finally:
        cache.close()


def test_a_hinted_range_is_read_from_its_get_and_used_up(hints: HintCache, gets: Gets) -> None:
    hints.hint("a", 100, 1000)
    assert bytes(hints.read("a", 100, 1000)) == OBJECT[100:1100]
    assert gets.asked == [("a", 100, 1000)] and hints.held == 0 and hints.hinted() == []
    assert bytes(hints.read("a", 100, 1000)) == OBJECT[100:1100]  # used up: a GET of its own
    assert len(gets.asked) == 2


def test_a_read_inside_a_hint_takes_its_part_of_the_hint(hints: HintCache, gets: Gets) -> None:
    hints.hint("a", 0, 2000)
    hints.hint("b", 0, 10)
    assert bytes(hints.read("a", 500, 100)) == OBJECT[500:600]
    assert hints.hinted() == [("b", 0, 10)] and hints.held == 10
    assert ("a", 500, 100) not in gets.asked


def test_a_hint_past_the_budget_is_dropped_until_an_abandoned_one_is_let_go(gets: Gets) -> None:
    cache = HintCache(gets, threads=2, budget=1000, ttl=0.0)
    try:
        gets.gate.clear()
        cache.hint("a", 0, 800)  # in flight: never let go
        cache.hint("a", 800, 800)  # no room: dropped
        assert cache.hinted() == [("a", 0, 800)] and cache.held == 800
        gets.gate.set()
        assert bytes(cache.read("a", 800, 800)) == OBJECT[800:1600]  # its own GET
        cache.hint("a", 1600, 100)  # room enough: 900 of 1000 held
        assert cache.held == 900

        def hinted_once_the_others_are_done() -> bool:
            cache.hint("a", 2000, 500)  # no room until the unread hints are done (ttl 0): then let go
            return ("a", 2000, 500) in cache.hinted()

        wait_for(hinted_once_the_others_are_done, "room for a hint once the unread ones are done", Asked())
        # The hint done and unread (0-800) was let go for it; the small one may be done or not yet.
        hinted = cache.hinted()
        assert ("a", 0, 800) not in hinted and ("a", 2000, 500) in hinted and cache.held <= 1000
    finally:
        cache.close()


def test_a_failed_get_fails_its_read_and_frees_its_room(hints: HintCache, gets: Gets) -> None:
    gets.fail = OSError("the store said no")
    hints.hint("a", 0, 1000)
    with pytest.raises(OSError, match="said no"):
        hints.read("a", 0, 1000)
    assert hints.held == 0 and hints.hinted() == []
    assert (hints.requests, hints.received) == (0, 0)


def test_the_counts_of_gets_from_many_threads_are_exact(gets: Gets) -> None:
    """The hints' 64 threads and the readers' count at once; not one GET may be lost."""
    cache = HintCache(gets, threads=64, budget=1 << 30)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as they can, as under load
    reads = 300
    try:

        def reader(number: int) -> None:
            for i in range(reads):
                if number % 2:
                    cache.hint(f"t{number}", number, i + 1)  # fetched by one of the hints' threads
                cache.read(f"t{number}", number, i + 1)

        threads = [threading.Thread(target=reader, args=(n,)) for n in range(64)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        sys.setswitchinterval(switch)
        cache.close()
    assert cache.requests == len(gets.asked) == 64 * reads
    assert cache.received == 64 * sum(range(1, reads + 1))
