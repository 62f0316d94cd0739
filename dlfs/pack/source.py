"""What a pack reads: one interface (``Source``) that every kind of input implements, and the one
place that tells the kinds apart, from the command line's SRC (``open_source``).

A source lays its members, with their metadata, into the shards it is given: a directory tree
(``tree_source``: walked, then read by a pool in placement order), an archive read in one pass (a
tar or zip file, or a tar on standard input: ``archive.archive_source``), tars served in place
(``archive.in_place``), or a prefix of objects (``objects``). The packer asks a source where its
bytes go (``shards``), has it pack (``pack``), and writes and publishes the index with what the
shards record of where they lie (``Shards.meta``); it never asks which kind it has. The interface
stops at "lay your members out", not at "hand me each member", because the kinds are fastest driven
differently: a tree's files are read by many threads, each writing its file into a slot laid out ahead from
the walk, where an archive is one stream read in order. A new kind (a zip in an object store, a
version's changed files) implements ``Source`` and is opened here; the packer stays as it is.
"""

from __future__ import annotations

import os
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from dlfs.core.errors import PackError
from dlfs.core.store import Store, is_s3
from dlfs.pack.archive.archive_source import ArchiveSource, scans
from dlfs.pack.archive.in_place import InPlaceSource
from dlfs.pack.columns import Placed
from dlfs.pack.objects import ObjectSource
from dlfs.pack.options import PackOptions, PackSummary
from dlfs.pack.spill import Spill
from dlfs.pack.tree_source import TreeSource
from dlfs.pack.walk import Tree


class Shards(Protocol):
    """Where a source's bytes go: shards written into the store (``writers``), or shards that
    lie in the tars the bytes already are in (``in_place.TarShards``)."""

    def finish(self) -> list[tuple[str, int]]:
        """The index's shard list, (name, size) each, once every byte is written."""

    def abort(self) -> None:
        """Remove what was written (a failed or interrupted pack)."""

    def meta(self) -> dict[str, Any]:
        """What the index records of where the shards lie besides their list: the tars and bases
        of an in-place dataset, nothing for shard files."""


@dataclass(frozen=True)
class Pools:
    """The pack's workers: ``threads`` for reads and walks, ``encoders`` for checksums, lz4 and a
    ``--transform`` (the same threads, or processes with a transform)."""

    threads: ThreadPoolExecutor
    encoders: Executor


class Source(Protocol):
    """An input of ``dlfs pack``, opened."""

    #: Where it is, for messages and the index's build record: a path, ``standard input``, a URL.
    name: str
    #: What it is, for the same: ``directory``, ``tar``, ``tar.gz``, ``zip``, ``tar folder``, ...
    kind: str
    #: The local folder it is, which the destination must not lie inside; None for any other.
    local_folder: Path | None

    def shards(self, store: Store, dataset_id: str, options: PackOptions) -> Shards:
        """Where its bytes go, in ``store``, for the dataset ``dataset_id``."""

    def pack(
        self, shards: Any, spill: Spill, options: PackOptions, summary: PackSummary, pools: Pools
    ) -> tuple[Tree, Placed]:
        """Lay every member into ``shards`` (what ``shards`` gave); the tree of rows and where each
        file went, for the index. Column files go in ``spill``."""

    def close(self) -> None:
        """Release what it holds open (files, clients)."""


def open_source(src: str, dst: str, options: PackOptions) -> Source:
    """The source SRC names, opened, with the options each kind refuses refused in one line."""
    s3 = is_s3(src)
    if src != "-" and not s3 and not os.path.exists(src):
        raise PackError(f"source {src} does not exist")
    tree = src != "-" and not s3 and os.path.isdir(src)
    if (options.in_place or not tree) and options.placement != "tree":
        raise PackError(
            "an archive's members are laid into shards as they arrive; "
            "--placement random needs a directory tree"
        )
    if options.in_place:
        if options.compress or options.transform is not None:
            raise PackError(
                "--in-place serves the tars' own bytes; it takes neither --compress nor --transform"
            )
        if is_s3(dst) and not s3:
            raise PackError(
                "--in-place of local tars writes only an index, to a local directory; give a directory as DST"
            )
        return InPlaceSource(src, options.store)
    if tree or s3:
        if options.expand_tars:
            what = "a directory" if tree else "a prefix of objects"
            raise PackError(f"--expand-tars reads archives; the source {src} is {what}")
        return TreeSource(src) if tree else ObjectSource(src, options)
    return ArchiveSource(src, prefetch=not scans(src, options))
