"""``dlfs pack``: re-lay a source (``source``: a tree, an archive, tars in place, objects) into
shards plus one index.

The source lays its members into the shards it asks for; the packer gives it the workers (a
thread pool, and for a ``--transform`` a pool of processes, one per core, since the transform is
CPU work that holds the GIL), then writes the index (``columns``) and publishes it last with an
atomic rename. Shard names carry the new dataset id, so an interrupted or failed pack never
disturbs a dataset that already mounts and never leaves one that does (``destination``).
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

from dlfs import __version__
from dlfs.core import format as fmt
from dlfs.core.choices import PLACEMENTS
from dlfs.core.errors import PackError, writing
from dlfs.core.interpreter import safe_path_children
from dlfs.core.store import Store, is_s3, open_store
from dlfs.core.store.local import LocalStore
from dlfs.pack import images
from dlfs.pack.columns import IndexRows
from dlfs.pack.destination import check_destination, created, locked, remove_leftovers, replaced_dataset
from dlfs.pack.interruption import block_in_thread, hold, interruptible
from dlfs.pack.options import (
    PackOptions,
    PackSummary,
)
from dlfs.pack.source import Pools, Source, open_source
from dlfs.pack.spill import Spill, remove_stale

log = logging.getLogger(__name__)

#: The index file's write buffer.
INDEX_BUFFER = 1 << 20


def pack(src: str | os.PathLike[str], dst: str | os.PathLike[str], options: PackOptions) -> PackSummary:
    """Pack ``src`` into the dataset directory or ``s3://`` prefix ``dst``; see the module docstring
    for guarantees."""
    if options.placement not in PLACEMENTS:
        raise PackError(f"unknown placement {options.placement!r}; choose one of {', '.join(PLACEMENTS)}")
    if not 4096 <= options.shard_size <= fmt.SHARD_MAX:
        raise PackError("shard size must be at least 4 KiB and at most 4 GiB")
    started = time.monotonic()
    source = open_source(os.fspath(src), os.fspath(dst), options)
    try:
        with interruptible():
            if is_s3(dst):
                summary = _pack_to_bucket(source, str(dst), options)
            else:
                summary = _pack_to_directory(source, Path(dst), options)
    finally:
        source.close()
    summary.seconds = time.monotonic() - started
    return summary


def _pack_to_directory(source: Source, dst: Path, options: PackOptions) -> PackSummary:
    store = LocalStore(dst, durable=options.sync)
    try:
        with created(dst):
            old_id = check_destination(source.local_folder, dst, store, options)
            with locked(dst):
                return _replace(source, store, old_id, dst, options)
    finally:
        store.close()


def _pack_to_bucket(source: Source, dst: str, options: PackOptions) -> PackSummary:
    """Shards stream up as multipart uploads and the index goes up last, so the prefix never
    holds a mountable half. Unlike a directory, a prefix has no lock: two packs into one prefix at
    once are not detected. The column files go in the temporary folder (``TMPDIR``)."""
    store = open_store(dst, options=options.store)
    try:
        old_id = replaced_dataset(store, options, "prefix")
        return _replace(source, store, old_id, Path(tempfile.gettempdir()), options)
    finally:
        store.close()


def _replace(
    source: Source, store: Store, old_id: str | None, spill_in: Path, options: PackOptions
) -> PackSummary:
    """Pack ``source`` into ``store`` in place of dataset ``old_id``, removing what earlier runs
    left, with its column files in a ``Spill`` under ``spill_in``."""
    remove_leftovers(store, old_id)
    remove_stale(spill_in)
    spill = _spill(spill_in)
    try:
        summary = _pack_locked(source, store, spill, options)
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


@contextmanager
def _transform_pool(options: PackOptions, summary: PackSummary) -> Iterator[Executor | None]:
    """Worker processes for ``--transform``, one per core (at most ``--threads``), started fresh
    (spawn) so each can load the fastest codec before anything imports ``PIL``; None without one."""
    if options.transform is None:
        yield None
        return
    workers = max(1, min(options.threads, len(os.sched_getaffinity(0))))
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
                "a --transform worker process died (killed, or out of memory?); see the log, lower --threads "
                "and pack again"
            ) from None


def _pack_locked(source: Source, store: Store, spill: Spill, options: PackOptions) -> PackSummary:
    summary = PackSummary(dataset_id=fmt.new_dataset_id())
    shards = source.shards(store, summary.dataset_id, options)
    with (
        ThreadPoolExecutor(
            options.threads, thread_name_prefix="dlfs-pack", initializer=block_in_thread
        ) as pool,
        _transform_pool(options, summary) as transforms,
    ):
        try:
            tree, placed = source.pack(shards, spill, options, summary, Pools(pool, transforms or pool))
            shard_list = shards.finish()
            rows = IndexRows(tree, placed)
            meta = {
                "dataset_id": summary.dataset_id,
                "created_ns": time.time_ns(),
                "dlfs_version": __version__,
                "build": {
                    "source": source.name,
                    "source_kind": source.kind,
                    "shard_size": options.shard_size,
                    "compress": "lz4" if options.compress else "none",
                    "placement": options.placement,
                    "seed": options.seed,
                    "transform": summary.transform or "none",
                },
                "shards": shard_list,
                **shards.meta(),
            }
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
