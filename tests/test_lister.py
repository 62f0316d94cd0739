"""The folder lister without a mount: when it lists, what it lists, and when it lists again."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
from conftest import wait_until

from dlfs.index import Index
from dlfs.lister import FolderLister
from dlfs.store import open_store


def test_a_folder_is_listed_once_after_enough_misses_and_again_once_forgotten(packed: Path) -> None:
    index = Index.load(open_store(packed))
    many = index.resolve(b"many")
    assert many is not None
    listed: list[int] = []
    done = threading.Semaphore(0)

    def reveal(row: int) -> None:
        listed.append(row)
        done.release()

    lister = FolderLister(index, reveal, misses=3)
    for _ in range(2):
        lister.looked_up(many)
    assert not done.acquire(timeout=0.2) and listed == []
    for _ in range(5):  # the third miss lists it; later ones are answered by the kernel, or ignored
        lister.looked_up(many)
    assert done.acquire(timeout=5) and listed == [many]
    assert not done.acquire(timeout=0.2)

    children = index.children(many)
    lister.forgotten(np.arange(children.start, children.start + 2))
    for _ in range(3):
        lister.looked_up(many)
    assert done.acquire(timeout=5) and listed == [many, many]
    assert wait_until(lambda: lister.listed == 2, 5)
