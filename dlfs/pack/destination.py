"""Destination safety: what ``dlfs pack`` may write into, one pack at a time, nothing left over.

A destination is an empty directory or a dlfs dataset (replaced only with ``--force``), never the
source or a folder inside it. A lock keeps a second pack out while one writes. Shards and
temporary index files of an interrupted pack are removed; the live dataset's shards stay until
the new index is published.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dlfs.core import format as fmt
from dlfs.core.errors import DatasetError, PackError
from dlfs.core.index_copy import stored_dataset_id
from dlfs.core.store import Store, StoreOptions, open_store
from dlfs.core.store.local import LocalStore
from dlfs.pack.options import PackOptions

log = logging.getLogger(__name__)


def check_destination(src: Path | None, dst: Path, store: LocalStore, options: PackOptions) -> str | None:
    """Return the id of the dataset being replaced (None if none); refuse unsafe destinations: one
    inside the source folder ``src`` (None: the source is no folder). The destination directory
    must exist (``created``)."""
    if src is not None:
        real_src, real_dst = src.resolve(), dst.resolve()
        if real_dst == real_src or real_src in real_dst.parents:
            raise PackError(f"destination {dst} is inside the source {src}; choose a destination outside it")
    return replaced_dataset(store, options, "directory")


@contextmanager
def created(dst: Path) -> Iterator[None]:
    """The destination directory, made with its missing parents; a pack that fails or is
    interrupted removes those it made again, where nothing else came into them."""
    if dst.exists() and not dst.is_dir():
        raise PackError(f"destination {dst} exists and is not a directory")
    made = [parent for parent in (dst, *dst.parents) if not parent.exists()]
    try:
        dst.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PackError(f"cannot create the destination {dst}: {exc.strerror}") from None
    try:
        yield
    except BaseException:
        for folder in made:  # the deepest first
            try:
                folder.rmdir()
            except OSError:
                break  # not empty (or not ours to remove): it and its parents stay
        raise


def replaced_dataset(store: Store, options: PackOptions, kind: str) -> str | None:
    """The id of the dataset a pack into ``store`` replaces (None if none); refuse a store that
    holds anything else, or a dataset without ``--force``. ``kind``: what to call the place."""
    names = store.names()
    foreign = [n for n in names if n != fmt.INDEX_NAME and not n.endswith(fmt.SHARD_SUFFIX)]
    foreign = [n for n in foreign if not n.startswith(f".{fmt.INDEX_NAME}.tmp")]
    if foreign:
        raise PackError(
            f"destination {store.url} is not empty and is not a dlfs dataset (it holds {foreign[0]}); "
            f"use an empty {kind}"
        )
    if fmt.INDEX_NAME not in names:
        return None
    if not options.force:
        raise PackError(f"destination {store.url} already holds a dlfs dataset; pass --force to replace it")
    try:  # of any format version: an older dlfs may still be serving it
        return stored_dataset_id(store, any_version=True)[0]
    except DatasetError:  # an unreadable old index protects nothing; it is replaced like any leftover
        return None


@contextmanager
def locked(dst: str | os.PathLike[str]) -> Iterator[None]:
    """Hold the destination's lock, or refuse at once when another pack holds it."""
    lock_fd = os.open(dst, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise PackError(f"another dlfs pack is writing {dst}; wait for it to finish") from exc
        yield
    finally:
        os.close(lock_fd)


@dataclass(frozen=True)
class Leftovers:
    """What packs that were killed (SIGKILL, a crash, a lost node) left in a destination."""

    #: Shards of no dataset the index names, and temporary index files.
    objects: list[str]
    #: Objects whose uploads stayed open (S3's multipart uploads: stored, and billed, until
    #: aborted).
    uploads: list[str]

    def names(self) -> list[str]:
        return [*self.objects, *(f"{name} (unfinished upload)" for name in self.uploads)]


def leftovers(store: Store, keep_id: str | None) -> Leftovers:
    """What interrupted packs left in ``store``, beside the dataset ``keep_id`` (None: no
    dataset)."""
    objects = [
        name
        for name in store.names()
        if (name.endswith(fmt.SHARD_SUFFIX) and not (keep_id and name.startswith(keep_id + ".")))
        or name.startswith(f".{fmt.INDEX_NAME}.tmp")
    ]
    return Leftovers(objects, store.unfinished_uploads())


def leftovers_at(location: str, options: StoreOptions, keep_id: str | None) -> Leftovers:
    store = open_store(location, options=options)
    try:
        return leftovers(store, keep_id)
    finally:
        store.close()


def remove_leftovers(store: Store, keep_id: str | None) -> None:
    """Delete shards, temp files and open uploads from interrupted runs; keep the live dataset's
    shards."""
    store.abort_uploads()
    for name in leftovers(store, keep_id).objects:
        log.info("removing leftover %s from an interrupted pack", name)
        store.delete(name)
