"""Fixtures of the FUSE layer's tests: datasets on a disk, and the load tests' dataset."""

from __future__ import annotations

from pathlib import Path

import pytest
from readers import pack_soak_dataset
from trees import pack_odd_tree


@pytest.fixture
def packed_on_disk(odd_tree: Path, on_disk: Path) -> Path:
    """``packed`` on a disk, for tests whose reads must wait for storage (``drop_from_memory``):
    where ``/tmp`` is a tmpfs, ``packed`` is in memory for good."""
    return pack_odd_tree(odd_tree, on_disk / "dataset")


@pytest.fixture(scope="session")
def soak_dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(dataset, expected.json) the soak, fault and S3 load tests read (``readers``), packed once:
    none of them changes it."""
    return pack_soak_dataset(tmp_path_factory.mktemp("soak"))
