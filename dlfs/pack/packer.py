"""``dlfs pack``: re-lay a directory tree into shards plus one index.

The walk (``walk``) numbers the rows the way the index wants them. File bytes are read by a thread
pool (``pipeline``: reads release the GIL), checksummed and optionally compressed there, and laid
into shards in placement order (``placement``, ``writers``). A ``--transform`` (``transform``) is
CPU work that holds the GIL, so with one the files are read and transformed by a pool of
processes instead, one per core. The index (``columns``) is published
last with an atomic rename, and shard names carry the new dataset id, so an interrupted or failed
pack never disturbs a dataset that already mounts and never leaves one that does
(``destination``).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from dlfs import __version__
from dlfs.core import format as fmt
from dlfs.core.errors import PackError, writing
from dlfs.core.interpreter import safe_path_children
from dlfs.core.store import Store, WritesInPlace, is_s3, open_store
from dlfs.core.store.local import LocalStore
from dlfs.pack import images
from dlfs.pack.archive.in_place import ArchiveWindows, InPlace
from dlfs.pack.archive.source import Archive, scans
from dlfs.pack.columns import PLACED_COLUMNS, IndexRows, Placed
from dlfs.pack.destination import check_destination, created, locked, remove_leftovers, replaced_dataset
from dlfs.pack.interruption import block_in_thread, hold, interruptible
from dlfs.pack.mapped_tree import remap
from dlfs.pack.objects import ObjectPrefix
from dlfs.pack.options import (
    PLACEMENTS,
    PROGRESS_EVERY,
    PackOptions,
    PackSummary,
    fail_or_skip,
    progress_bar,
    show_files,
)
from dlfs.pack.placement import placement_order
from dlfs.pack.spill import Spill, remove_stale
from dlfs.pack.walk import Tree, walk
from dlfs.pack.writers import InOrderShards, InPlaceShards, ShardSet

log = logging.getLogger(__name__)

#: The index file's write buffer.
INDEX_BUFFER = 1 << 20
#: What a pack reads other than a directory tree (None).
Source = Archive | InPlace | ObjectPrefix | None


def pack(src: str | os.PathLike[str], dst: str | os.PathLike[str], options: PackOptions) -> PackSummary:
    """Pack ``src`` into the dataset directory or ``s3://`` prefix ``dst``; see the module docstring
    for guarantees."""
    if options.placement not in PLACEMENTS:
        raise PackError(f"unknown placement {options.placement!r}; choose one of {', '.join(PLACEMENTS)}")
    if not 4096 <= options.shard_size <= fmt.SHARD_MAX:
        raise PackError("shard size must be at least 4 KiB and at most 4 GiB")
    src_path = Path(src)
    s3_source = is_s3(os.fspath(src))
    if os.fspath(src) != "-" and not s3_source and not src_path.exists():
        raise PackError(f"source {src} does not exist")
    started = time.monotonic()
    tree = not s3_source and os.fspath(src) != "-" and src_path.is_dir()
    objects = s3_source and not options.in_place  # in place, a tar or a prefix of tars in S3
    if tree and options.expand_tars and not options.in_place:
        raise PackError(f"--expand-tars reads archives; the source {src} is a directory")
    if (options.in_place or not tree) and options.placement != "source":
        raise PackError(
            "an archive's members are laid into shards as they arrive; "
            "--placement random needs a directory tree"
        )
    archive = _objects(os.fspath(src), options) if objects else _archive(src, tree, dst, options)
    try:
        with interruptible():
            if is_s3(dst):
                summary = _pack_to_bucket(src_path, archive, str(dst), options)
            else:
                summary = _pack_to_directory(src_path, archive, Path(dst), options)
    finally:
        if archive is not None:
            archive.close()
    summary.seconds = time.monotonic() - started
    return summary


def _objects(src: str, options: PackOptions) -> ObjectPrefix:
    """The objects below the ``s3://`` prefix ``src`` as a source, one per file."""
    if options.expand_tars:
        raise PackError(f"--expand-tars reads archives; the source {src} is a prefix of objects")
    return ObjectPrefix(src, options)


def _archive(
    src: str | os.PathLike[str], tree: bool, dst: str | os.PathLike[str], options: PackOptions
) -> Archive | InPlace | None:
    """The archive source opened, or None for a directory ``tree``."""
    if not options.in_place:
        return None if tree else Archive(os.fspath(src), read_ahead=not scans(os.fspath(src), options))
    if options.compress or options.transform is not None:
        raise PackError("--in-place serves the tars' own bytes; it takes neither --compress nor --transform")
    if is_s3(dst) and not is_s3(src):
        raise PackError(
            "--in-place of local tars writes only an index, to a local directory; give a directory as DST"
        )
    return InPlace(os.fspath(src), options.store)


def _pack_to_directory(src: Path, archive: Source, dst: Path, options: PackOptions) -> PackSummary:
    store = LocalStore(dst, durable=options.sync)
    try:
        with created(dst):
            old_id = check_destination(src, dst, store, options)
            with locked(dst):
                return _replace(src, archive, store, old_id, dst, options)
    finally:
        store.close()


def _pack_to_bucket(src: Path, archive: Source, dst: str, options: PackOptions) -> PackSummary:
    """Shards stream up as multipart uploads and the index goes up last, so the prefix never
    holds a mountable half. Unlike a directory, a prefix has no lock: two packs into one prefix at
    once are not detected. The column files go in the temporary folder (``TMPDIR``)."""
    store = open_store(dst, options=options.store)
    try:
        return _replace(
            src,
            archive,
            store,
            replaced_dataset(store, options, "prefix"),
            Path(tempfile.gettempdir()),
            options,
        )
    finally:
        store.close()


def _replace(
    src: Path,
    archive: Source,
    store: Store,
    old_id: str | None,
    spill_in: Path,
    options: PackOptions,
) -> PackSummary:
    """Pack the tree ``src``, or ``archive``, into ``store`` in place of dataset ``old_id``,
    removing what earlier runs left, with its column files in a ``Spill`` under ``spill_in``."""
    remove_leftovers(store, old_id)
    remove_stale(spill_in)
    spill = _spill(spill_in)
    try:
        summary = _pack_locked(os.fsencode(src), archive, store, spill, options)
    finally:
        spill.close()
    if old_id:
        remove_leftovers(store, summary.dataset_id)
    return summary


def _spill(parent: Path) -> Spill:
    try:
        return Spill(parent)
    except OSError as exc:
        raise PackError(
            f"cannot create pack's temporary folder in {parent}: {exc.strerror}; "
            "make it writable (for an s3:// destination, point TMPDIR at a local disk)"
        ) from exc


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


@contextmanager
def _transform_pool(options: PackOptions, summary: PackSummary) -> Iterator[Executor | None]:
    """Worker processes for ``--transform``, one per core (at most ``--readers``), started fresh
    (spawn) so each can load the fastest codec before anything imports ``PIL``; None without one."""
    if options.transform is None:
        yield None
        return
    workers = max(1, min(options.readers, len(os.sched_getaffinity(0))))
    context = multiprocessing.get_context("spawn")
    with (
        safe_path_children(),
        ProcessPoolExecutor(workers, mp_context=context, initializer=images.use_fastest_codec) as pool,
    ):
        summary.transform = options.transform.spec
        try:
            summary.codec = pool.submit(images.codec_version).result()
        except ImportError:
            raise PackError(
                "--transform needs Pillow: pip install 'dlfs-data[images]' "
                "(make install also builds Pillow-SIMD)"
            ) from None
        try:
            yield pool
        except BrokenProcessPool:
            raise PackError(
                "a --transform worker process died (killed, or out of memory?); see the log, lower --readers "
                "and pack again"
            ) from None


def _walk(
    src: bytes, spill: Spill, options: PackOptions, summary: PackSummary, pool: ThreadPoolExecutor
) -> Tree:
    """The tree's rows, laid out again where ``--map`` moves its files."""
    if options.path_map is None:
        return walk(src, spill, options, summary, pool)
    walked = walk(src, spill.inner(), options, summary, pool)
    return remap(walked, spill, options, summary)


def _pack_locked(
    src: bytes, archive: Source, store: Store, spill: Spill, options: PackOptions
) -> PackSummary:
    summary = PackSummary(dataset_id=fmt.new_dataset_id())
    # In place where the store takes writes at any offset and stored sizes are known from the walk
    # (no lz4, no transform, not an archive). An in-place archive (``--in-place``) writes no shards.
    shards: ShardSet[Any] | ArchiveWindows
    in_place = archive is None and not options.compress and options.transform is None
    if isinstance(archive, InPlace):
        shards = archive.windows(summary.dataset_id)
    elif in_place and isinstance(store, WritesInPlace):
        shards = InPlaceShards(store, summary.dataset_id, options.shard_size)
    else:
        shards = InOrderShards(store, summary.dataset_id, options.shard_size)
    with (
        ThreadPoolExecutor(
            options.readers, thread_name_prefix="dlfs-pack", initializer=block_in_thread
        ) as pool,
        _transform_pool(options, summary) as transforms,
    ):
        try:
            if archive is None:
                tree = _walk(src, spill, options, summary, pool)
                placed = Placed(tree, spill)
                _write_payloads(transforms or pool, tree, placed, shards, options, summary)
            elif isinstance(archive, InPlace):
                assert isinstance(shards, ArchiveWindows)
                tree, placed = archive.pack(shards, spill, options, summary)
            else:
                assert isinstance(shards, InOrderShards)
                tree, placed = archive.pack(shards, spill, options, summary, transforms or pool)
            shard_list = shards.finish()
            rows = IndexRows(tree, placed)
            meta = {
                "dataset_id": summary.dataset_id,
                "created_ns": time.time_ns(),
                "dlfs_version": __version__,
                "build": {
                    "source": os.fsdecode(src) if archive is None else archive.name,
                    "source_kind": "directory" if archive is None else archive.kind,
                    "shard_size": options.shard_size,
                    "compress": "lz4" if options.compress else "none",
                    "placement": options.placement,
                    "seed": options.seed,
                    "transform": summary.transform or "none",
                },
                "shards": shard_list,
            }
            if isinstance(shards, ArchiveWindows):
                meta.update(shards.meta())
            if options.transform is not None:
                meta["transform"] = options.transform.describe(summary.codec)
            index_path = spill.path(fmt.INDEX_NAME)
            with writing(index_path), open(index_path, "wb", buffering=INDEX_BUFFER) as out:
                summary.index_bytes = fmt.write_index(out, rows.sections(), meta)
            hold()  # publishing: from here the pack finishes, whatever signal comes
            store.put_file(fmt.INDEX_NAME, index_path)
        except BaseException as exc:
            hold()  # undoing: a second signal must not stop it half-way
            if isinstance(exc, KeyboardInterrupt):
                log.info("interrupted: removing what this pack wrote to %s", store.url)
            pool.shutdown(wait=True, cancel_futures=True)
            if transforms is not None:
                transforms.shutdown(wait=True, cancel_futures=True)
            shards.abort()
            raise
    if options.path_map is not None:
        summary.mapped, summary.unmapped, summary.map_unused = options.path_map.report()
    totals = rows.totals()
    summary.files = totals["files"]
    summary.directories = totals["directories"]
    summary.symlinks = totals["symlinks"]
    summary.bytes = totals["bytes"]
    summary.stored_bytes = sum(size for _, size in shard_list)
    summary.shards = len(shard_list)
    return summary
