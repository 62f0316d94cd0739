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

from tqdm import tqdm

from dlfs import __version__
from dlfs.core import format as fmt
from dlfs.core.errors import PackError
from dlfs.core.store import LocalStore, Store, WritesInPlace, is_s3, open_store
from dlfs.pack import images
from dlfs.pack.columns import IndexRows, Placed
from dlfs.pack.destination import check_destination, locked, remove_leftovers, replaced_dataset
from dlfs.pack.interruption import block_in_thread, hold, interruptible
from dlfs.pack.options import ORDERS, PackOptions, PackSummary, fail_or_skip
from dlfs.pack.placement import placement_order
from dlfs.pack.spill import Spill, remove_stale
from dlfs.pack.walk import Tree, walk
from dlfs.pack.writers import InOrderShards, InPlaceShards, ShardSet

log = logging.getLogger(__name__)

#: Files between refreshes of the files/s figure on the progress bar.
PROGRESS_EVERY = 256
#: The index file's write buffer.
INDEX_BUFFER = 1 << 20


def pack(src: str | os.PathLike[str], dst: str | os.PathLike[str], options: PackOptions) -> PackSummary:
    """Pack ``src`` into the dataset directory or ``s3://`` prefix ``dst``; see the module docstring
    for guarantees."""
    if options.order not in ORDERS:
        raise PackError(f"unknown order {options.order!r}; choose one of {', '.join(ORDERS)}")
    if not 4096 <= options.shard_size <= fmt.SHARD_MAX:
        raise PackError("shard size must be at least 4 KiB and at most 4 GiB")
    src_path = Path(src)
    if not src_path.exists():
        raise PackError(f"source {src} does not exist")
    if not src_path.is_dir():
        raise PackError(f"source {src} is not a directory")
    started = time.monotonic()
    with interruptible():
        if is_s3(dst):
            summary = _pack_to_bucket(src_path, str(dst), options)
        else:
            summary = _pack_to_directory(src_path, Path(dst), options)
    summary.seconds = time.monotonic() - started
    return summary


def _pack_to_directory(src: Path, dst: Path, options: PackOptions) -> PackSummary:
    store = LocalStore(dst, durable=options.sync)
    old_id = check_destination(src, dst, store, options)
    try:
        with locked(dst):
            return _replace(src, store, old_id, dst, options)
    finally:
        store.close()


def _pack_to_bucket(src: Path, dst: str, options: PackOptions) -> PackSummary:
    """Shards stream up as multipart uploads and the index goes up last, so the prefix never
    holds a mountable half. Unlike a directory, a prefix has no lock: two packs into one prefix at
    once are not detected. The column files go in the temporary folder (``TMPDIR``)."""
    store = open_store(dst, options=options.store)
    try:
        return _replace(
            src, store, replaced_dataset(store, options, "prefix"), Path(tempfile.gettempdir()), options
        )
    finally:
        store.close()


def _replace(
    src: Path, store: Store, old_id: str | None, spill_in: Path, options: PackOptions
) -> PackSummary:
    """Pack into ``store`` in place of dataset ``old_id``, removing what earlier runs left, with
    its column files in a ``Spill`` under ``spill_in``."""
    remove_leftovers(store, old_id)
    remove_stale(spill_in)
    spill = _spill(spill_in)
    try:
        summary = _pack_locked(os.fsencode(src), store, spill, options)
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
    files = (tree.entries(rows) for rows in placement_order(tree, options.order, options.seed))
    reads = shards.reads(pool, files, options)
    with tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        disable=not options.progress,
        desc="pack",
        dynamic_ncols=True,
    ) as bar:
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
                rate = len(placed) / max(time.monotonic() - started, 1e-9)
                bar.set_postfix_str(f"{len(placed):,} files, {rate:,.0f} files/s", refresh=False)
            bar.update(size)


def _count_transformed(summary: PackSummary, kept: images.Kept | None) -> None:
    if kept is None:
        summary.transformed_files += 1
    else:
        summary.kept_files[kept.value] = summary.kept_files.get(kept.value, 0) + 1


@contextmanager
def _transform_pool(options: PackOptions, summary: PackSummary) -> Iterator[Executor | None]:
    """Worker processes for ``--transform``, one per core (at most ``--jobs``), started fresh
    (spawn) so each can load the fastest codec before anything imports ``PIL``; None without one."""
    if options.transform is None:
        yield None
        return
    workers = max(1, min(options.jobs, len(os.sched_getaffinity(0))))
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=images.use_fastest_codec) as pool:
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
                "a --transform worker process died (killed, or out of memory?); see the log, lower --jobs "
                "and pack again"
            ) from None


def _pack_locked(src: bytes, store: Store, spill: Spill, options: PackOptions) -> PackSummary:
    summary = PackSummary(dataset_id=fmt.new_dataset_id())
    # In place where the store takes writes at any offset and stored sizes are known from the walk
    # (no lz4, no transform).
    shards: ShardSet[Any]
    if isinstance(store, WritesInPlace) and not options.compress and options.transform is None:
        shards = InPlaceShards(store, summary.dataset_id, options.shard_size)
    else:
        shards = InOrderShards(store, summary.dataset_id, options.shard_size)
    with (
        ThreadPoolExecutor(options.jobs, thread_name_prefix="dlfs-pack", initializer=block_in_thread) as pool,
        _transform_pool(options, summary) as transforms,
    ):
        try:
            tree = walk(src, spill, options, summary, pool)
            placed = Placed(tree, spill)
            _write_payloads(transforms or pool, tree, placed, shards, options, summary)
            shard_list = shards.finish()
            rows = IndexRows(tree, placed)
            meta = {
                "dataset_id": summary.dataset_id,
                "created_ns": time.time_ns(),
                "dlfs_version": __version__,
                "build": {
                    "source": os.fsdecode(src),
                    "shard_size": options.shard_size,
                    "compress": "lz4" if options.compress else "none",
                    "order": options.order,
                    "seed": options.seed,
                    "transform": summary.transform or "none",
                },
                "shards": shard_list,
            }
            if options.transform is not None:
                meta["transform"] = options.transform.describe(summary.codec)
            index_path = spill.path(fmt.INDEX_NAME)
            with open(index_path, "wb", buffering=INDEX_BUFFER) as out:
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
    totals = rows.totals()
    summary.files = totals["files"]
    summary.directories = totals["directories"]
    summary.symlinks = totals["symlinks"]
    summary.bytes = totals["bytes"]
    summary.stored_bytes = sum(size for _, size in shard_list)
    summary.shards = len(shard_list)
    return summary
