"""The folder lister without a mount: when it lists, what it lists, and when it lists again."""

from __future__ import annotations

import threading
from pathlib import Path

from waits import HANG, Asked, bound, wait_for

from dlfs.core.index import Index
from dlfs.core.store import open_store
from dlfs.fuse.lister import FolderLister


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
    assert lister.pending == 0 and listed == [], "two misses queue no listing"
    for _ in range(5):  # the third miss lists it; later ones are answered by the kernel, or ignored
        lister.looked_up(many)
    assert done.acquire(timeout=bound(HANG)), "the folder was never listed"
    wait_for(lambda: lister.pending == 0, "the lister's queue to empty", Asked())
    assert listed == [many]

    lister.forgotten([many])
    for _ in range(3):
        lister.looked_up(many)
    assert done.acquire(timeout=bound(HANG)), "the forgotten folder was never listed again"
    wait_for(lambda: lister.listed == 2, "the lister to count its second listing", Asked())
    assert listed == [many, many]


def test_once_a_scan_listed_every_folder_all_are_listed_again(packed: Path) -> None:
    """Listings without file attributes of every folder holding files (``--readdirplus auto``) make
    the lister list them all once more; folders listed already (by the read-ahead) are skipped, and
    only folders with forgotten entries are listed again after the next whole scan."""
    index = Index.load(open_store(packed))
    folders = sorted(set(index.parent[index.regular_rows()].tolist()))
    directories = [row for row in range(index.count) if index.is_dir(row)]
    assert len(folders) >= 3 and len(directories) > len(folders), "some folders hold no files"
    listed: list[int] = []

    def reveal(row: int) -> None:
        listed.append(row)

    idle = FolderLister(index, reveal, after_scans=False)  # no read-ahead: nobody needs the inodes
    for row in folders:
        idle.scanned(row)
    assert idle.pending == 0 and listed == [], "listed without a read-ahead to serve"

    lister = FolderLister(index, reveal)
    assert lister.reveal_once(folders[1]) and not lister.reveal_once(folders[1])
    for row in directories:
        if row != folders[-1]:
            lister.scanned(row)
    lister.scanned(folders[0])  # listed twice: still one folder
    assert lister.pending == 0 and len(listed) == 1, "a partial scan lists nothing"
    lister.scanned(folders[-1])
    wait_for(lambda: lister.pending == 0, "the relisting of the whole tree to end", Asked())
    assert sorted(listed) == folders and lister.listed == len(folders) - 1

    lister.forgotten([folders[0]])
    for row in folders:
        lister.scanned(row)
    wait_for(lambda: lister.pending == 0, "the relisting of the forgotten folder to end", Asked())
    assert len(listed) == len(folders) + 1 and listed.count(folders[0]) == 2, listed


def test_a_folder_being_listed_is_waited_for_not_listed_again(packed: Path) -> None:
    index = Index.load(open_store(packed))
    many = index.resolve(b"many")
    assert many is not None
    started, release = threading.Event(), threading.Event()
    listed: list[int] = []

    def reveal(row: int) -> None:
        listed.append(row)
        started.set()
        assert release.wait(bound(HANG))

    lister = FolderLister(index, reveal)
    first = threading.Thread(target=lister.reveal_once, args=(many,))
    first.start()
    assert started.wait(bound(HANG))
    second: list[bool] = []
    waiter = threading.Thread(target=lambda: second.append(lister.reveal_once(many)))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive(), "the second caller waits for the listing in progress"
    release.set()
    first.join(bound(HANG))
    waiter.join(bound(HANG))
    assert second == [False] and listed == [many]
