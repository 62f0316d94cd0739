"""A dataset's file set: described, announced chunk by chunk, assembled and checked by the mount."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dlfs.core.fileset import CHUNK, KEEP_SETS, Announced, FileSet


def _announce(announced: Announced, fileset: FileSet) -> list[str | None]:
    return [announced.receive(name.encode()) for name in fileset.announcements()]


@settings(max_examples=200, deadline=None)
@given(
    count=st.integers(1, 5000),
    keep=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**32),
)
def test_an_announced_set_is_assembled_into_exactly_its_positions(count: int, keep: float, seed: int) -> None:
    chosen = np.flatnonzero(np.random.default_rng(seed).random(count) < keep)
    fileset = FileSet(chosen)
    announced = Announced(count)
    results = _announce(announced, fileset)
    assert results == [None] * (len(results) - 1) + [fileset.digest]
    found = announced.get(fileset.digest)
    assert found is not None and np.array_equal(found.positions, chosen)


def test_a_dataset_rooted_at_a_folder_with_stray_files_takes_one_lookup() -> None:
    count = 1_300_000
    positions = np.arange(40_000, 1_320_000 - 50_000)
    positions = np.delete(positions, [17, 90_000, 600_000, 1_000_001])
    names = FileSet(positions).announcements()
    assert len(names) == 1 and len(names[0].encode()) <= 255
    announced = Announced(count)
    assert announced.receive(names[0].encode()) == FileSet(positions).digest


def test_chunks_may_come_in_any_order_and_again() -> None:
    positions = np.flatnonzero(np.random.default_rng(1).random(20_000) < 0.5)
    fileset = FileSet(positions)
    names = fileset.announcements()
    assert len(names) > 3
    announced = Announced(20_000)
    for name in reversed(names[1:]):
        assert announced.receive(name.encode()) is None
    assert announced.receive(names[-1].encode()) is None
    assert announced.receive(names[0].encode()) == fileset.digest
    assert len(f"{'0' * 32}.{10**9 - 1}-of-{10**9 - 1}.{'A' * CHUNK}") <= 255


def test_a_set_that_does_not_fit_the_mount_or_its_digest_is_refused() -> None:
    fileset = FileSet(np.arange(10, 20))
    assert _announce(Announced(19), fileset)[-1] is None
    assert _announce(Announced(20), fileset)[-1] == fileset.digest
    (name,) = fileset.announcements()
    other = FileSet(np.arange(10, 21)).digest
    assert Announced(100).receive((other + name[32:]).encode()) is None
    for bad in (b"nothing", b"x" * 32, name[:32].encode() + b".1-of-1.AAAA", name[:-4].encode() + b"!!!!"):
        assert Announced(100).receive(bad) is None


def test_the_mount_keeps_a_bounded_number_of_sets() -> None:
    announced = Announced(1000)
    sets = [FileSet(np.arange(k, 1000)) for k in range(KEEP_SETS + 3)]
    for fileset in sets:
        _announce(announced, fileset)
    assert announced.get(sets[0].digest) is None
    assert all(announced.get(fileset.digest) is not None for fileset in sets[-KEEP_SETS:])
