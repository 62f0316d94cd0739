"""Fixtures of the pack tests: the fuzz tests' seed archives, and their report of outcomes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from mutations import EXAMPLES, OUTCOMES, Seeds, seed_archives


@pytest.fixture(scope="session")
def archives(tmp_path_factory: pytest.TempPathFactory) -> Seeds:
    """``mutations.seed_archives``, written once: the examples mutate copies of their bytes."""
    return seed_archives(tmp_path_factory.mktemp("archive-fuzz"))


@pytest.fixture
def report(request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]) -> Iterator[None]:
    """Print how many examples packed and how many were refused; fail if too few ran."""
    OUTCOMES.clear()
    yield
    with capsys.disabled():
        print(f"\n{request.node.name}: {OUTCOMES['packed']} packed, {OUTCOMES['refused']} refused")
    assert OUTCOMES.total() >= min(EXAMPLES, 50)
