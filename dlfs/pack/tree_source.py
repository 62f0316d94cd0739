"""A directory tree as a pack source: walked (``walk``), laid out again where ``--map`` moves its
files (``mapped_tree``), then read by a thread pool in placement order (``placement``,
``pipeline``: reads release the GIL), checksummed and optionally compressed there, and laid into
the shards (``writers``): each file written into its slot by the thread that read it, where the
store takes writes at any offset and no lz4 or transform changes its size. A ``--transform`` is
CPU work that holds the GIL, so with one the files are read and transformed by a pool of
processes instead (the packer's ``encoders``). The files of a hard-linked group are read once.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dlfs.core import format as fmt
from dlfs.core.store import Store, WritesInPlace
from dlfs.pack import images
from dlfs.pack.columns import PLACED_COLUMNS, Placed
from dlfs.pack.mapped_tree import remap
from dlfs.pack.options import PROGRESS_EVERY, PackOptions, PackSummary, fail_or_skip, progress_bar, show_files
from dlfs.pack.placement import placement_order
from dlfs.pack.spill import Spill
from dlfs.pack.walk import Tree, walk
from dlfs.pack.writers import InOrderShards, InPlaceShards, ShardSet

if TYPE_CHECKING:
    from dlfs.pack.source import Pools


class TreeSource:
    """A directory tree, read where it lies."""

    kind = "directory"

    def __init__(self, path: str) -> None:
        self.name = path
        self.local_folder = Path(path)

    def shards(self, store: Store, dataset_id: str, options: PackOptions) -> ShardSet[Any]:
        """In place where the store takes writes at any offset and the walk's sizes are the stored
        ones (no lz4, no transform); in order otherwise."""
        if isinstance(store, WritesInPlace) and not options.compress and options.transform is None:
            return InPlaceShards(store, dataset_id, options.shard_size)
        return InOrderShards(store, dataset_id, options.shard_size)

    def pack(
        self, shards: Any, spill: Spill, options: PackOptions, summary: PackSummary, pools: Pools
    ) -> tuple[Tree, Placed]:
        tree = _walk(os.fsencode(self.local_folder), spill, options, summary, pools.threads)
        placed = Placed(tree, spill)
        _write_payloads(pools.encoders, tree, placed, shards, options, summary)
        return tree, placed

    def close(self) -> None:
        """Nothing is held open."""


def _walk(
    src: bytes, spill: Spill, options: PackOptions, summary: PackSummary, pool: ThreadPoolExecutor
) -> Tree:
    """The tree's rows, laid out again where ``--map`` moves its files."""
    if options.path_map is None:
        return walk(src, spill, options, summary, pool)
    walked = walk(src, spill.inner(), options, summary, pool)
    return remap(walked, spill, options, summary)


def _write_payloads(
    pool: Executor,
    tree: Tree,
    placed: Placed,
    shards: ShardSet[Any],
    options: PackOptions,
    summary: PackSummary,
) -> None:
    """Write every file into the shards in placement order. Skipped files are simply not placed
    (in place, their slots stay holes)."""
    started = time.monotonic()
    total = summary.source_bytes = tree.file_bytes
    leaders, followers = _hard_link_rows(tree)
    files = (
        tree.entries(rows[~np.isin(rows, followers)] if followers.size else rows)
        for rows in placement_order(tree, options.placement, options.seed)
    )
    reads = shards.reads(pool, files, options)
    with progress_bar(options, total) as bar:
        for file, slot, outcome in reads:
            row, path, size = file
            try:
                if isinstance(outcome, OSError):
                    raise outcome
                payload, shard, offset = shards.put(file, slot, outcome)
            except OSError as exc:
                fail_or_skip(f"cannot read {os.fsdecode(path)}: {exc.strerror}", options, summary, path)
                continue
            # Stored bytes: the payload's, or the file's own where it went straight to its place.
            placed.add(row, payload, shard, offset, len(payload.stored) if payload.stored else payload.size)
            summary.compressed_files += bool(payload.flags & fmt.FLAG_LZ4)
            if options.transform is not None:
                _count_transformed(summary, payload.kept if outcome is not None else images.Kept.TOO_LARGE)
            if len(placed) % PROGRESS_EVERY == 0:
                show_files(bar, len(placed), started)
            bar.update(size)
        show_files(bar, len(placed), started)  # the bar's last line counts every file, as the summary
    if followers.size:
        _share_placements(tree, placed, leaders, followers)


def _hard_link_rows(tree: Tree) -> tuple[np.ndarray, np.ndarray]:
    """The rows of hard-linked files whose bytes are read once, for the first of their group (the
    leader), and each other row with its leader: (leaders, followers), one pair per follower."""
    pairs = [
        (rows[0], row) for group in tree.hard_links.values() for rows in [sorted(group)] for row in rows[1:]
    ]
    table = np.array(pairs, dtype=np.int64).reshape(-1, 2)
    return table[:, 0], table[:, 1]


def _share_placements(tree: Tree, placed: Placed, leaders: np.ndarray, followers: np.ndarray) -> None:
    """Each follower takes its leader's bytes and size; one whose leader could not be read (with
    ``--skip-errors``) is left out with it."""
    placed.flush()
    kept = placed.columns["placed"].gather(leaders) == 1
    leaders, followers = leaders[kept], followers[kept]
    values = {name: placed.columns[name].gather(leaders) for name in PLACED_COLUMNS if name != "placed"}
    placed.add_many(followers, tree.columns["size"].gather(leaders), values)


def _count_transformed(summary: PackSummary, kept: images.Kept | None) -> None:
    if kept is None:
        summary.transformed_files += 1
    else:
        summary.kept_files[kept.value] = summary.kept_files.get(kept.value, 0) + 1
