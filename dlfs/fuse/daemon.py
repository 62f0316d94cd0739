"""The mount daemon: assemble index, store, cache and reader behind the FUSE adapter and serve.

The only module besides ``dlfs.fs`` that imports pyfuse3; run in the foreground by ``dlfs mount``'s
child process or directly under systemd.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pyfuse3
import trio

from dlfs.cache import PayloadCache
from dlfs.control import ControlTree
from dlfs.errors import MountError
from dlfs.fs import DlfsOperations
from dlfs.index import Index
from dlfs.lister import FolderLister
from dlfs.mount import MountOptions, check_mountpoint
from dlfs.order import OrderSpec
from dlfs.pagecache import MountPageCache
from dlfs.prefetch import Prefetcher
from dlfs.push import NativePusher
from dlfs.reader import Reader
from dlfs.store import open_store

log = logging.getLogger(__name__)

#: Scheduling priority of the daemon (nice value); see _serve_first.
DAEMON_NICE = -10
#: Listings of a folder before the read-ahead gives up teaching the kernel its files (see _reveal).
REVEAL_TRIES = 3


async def _serve(prefetcher: Prefetcher | None) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_terminate_on_signal)
        if prefetcher is not None:
            nursery.start_soon(prefetcher.run)
        await pyfuse3.main()
        nursery.cancel_scope.cancel()


def _reveal(operations: DlfsOperations, pages: MountPageCache, row: int) -> None:
    """List a folder through the mount so that the kernel learns every file in it (a push needs the
    inode). With ``--readdirplus auto`` the kernel may hold the folder's listing from a scan that
    gave files no attributes, and would answer from it: that listing is dropped first. A scan's
    listing still on its way back can fill the kernel's cache again after the drop (the background
    listing after a scan starts as the scan's last listing begins), so the listing is repeated until
    one with attributes reached the daemon. Each try marks the folder again: a FORGET for its
    entries (``drop_caches`` sends them in batches) returns it to plain listings."""
    for _ in range(REVEAL_TRIES):
        operations.want_attributes(row)
        attribute_listings = operations.attribute_listings[row]
        with contextlib.suppress(OSError):  # ENOENT: the kernel holds nothing of the folder
            pyfuse3.invalidate_inode(pyfuse3.InodeT(row + pyfuse3.ROOT_INODE))
        pages.reveal(operations.index.path(row))
        if operations.attribute_listings[row] > attribute_listings:
            return
    log.warning("the kernel kept answering listings of %s from its cache", operations.index.path(row))


def _push(row: int, data: bytes | memoryview) -> None:
    """Store a whole file in the kernel page cache (inode = row + 1)."""
    if data:
        pyfuse3.notify_store(pyfuse3.InodeT(row + pyfuse3.ROOT_INODE), 0, data)


async def _terminate_on_signal() -> None:
    """SIGTERM/SIGINT end the main loop; pyfuse3.close then unmounts cleanly."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            log.info("received %s, unmounting", signal.Signals(signum).name)
            pyfuse3.terminate()
            return


def serve(dataset: str, mnt: str, options: MountOptions, ready: Callable[[], None]) -> None:
    """Mount in this process and serve until unmounted; ``ready`` is called once the mount is live."""
    started = time.monotonic()
    store = open_store(dataset, random_access=True)
    log.info("loading the index of %s", dataset)  # it is read whole: the wait a slow disk shows
    index = Index.load(store)
    log.info("index loaded in %.3f s: %d entries", time.monotonic() - started, index.count)
    index.check_shards(store)
    mountpoint = Path(mnt)
    check_mountpoint(mountpoint)
    # Read-ahead parks files the kernel refuses (unknown inodes) and its sentinels in the payload
    # cache, so the cache holds its budget on top of what demand reads get.
    cache = PayloadCache(options.cache_size + options.prefetch_budget)
    reader = Reader(index, store, cache, max_threads=options.threads)
    pages = MountPageCache(str(mountpoint.resolve()))

    def reveal(row: int) -> None:
        """For the lister and the read-ahead; called only once the mount serves, so ``operations``
        (bound below) exists by then."""
        _reveal(operations, pages, row)

    lister = FolderLister(index, reveal, after_scans=options.prefetch_budget > 0)
    prefetcher = None
    if options.prefetch_budget > 0:
        prefetcher = Prefetcher(
            index,
            reader,
            _push,
            budget=options.prefetch_budget,
            max_inflight=options.prefetch_inflight,
            in_kernel=lambda row: pages.holds(index.path(row), int(index.size[row])),
            reveal=lister.reveal_once,
        )
    spec = OrderSpec(seed=options.seed, mode=options.order, block=options.block, window=options.window)

    def stats() -> dict[str, object]:
        return {
            "requests": dict(operations.requests),
            "cache": reader.cache.stats(),
            "storage": {"reads": reader.storage_reads, "bytes": reader.storage_bytes},
            "prefetch": prefetcher.snapshot() if prefetcher is not None else None,
            "listed_folders": lister.listed,
            "listing_folders": lister.pending,
            "uptime_seconds": round(time.monotonic() - started, 3),
        }

    operations = DlfsOperations(index, reader, ControlTree(index, spec, stats), prefetcher, lister)
    operations.readdirplus_auto = options.readdirplus == "auto"
    fuse_options = {"ro", "default_permissions", "subtype=dlfs", "fsname=dlfs:" + _option_safe(dataset)}
    if options.allow_other:
        fuse_options.add("allow_other")
    if options.debug:
        fuse_options.add("debug")
    try:
        pyfuse3.init(operations, str(mountpoint), fuse_options)
    except RuntimeError as exc:
        raise MountError(f"cannot mount on {mnt}: {exc}; check the mountpoint and /dev/fuse") from exc
    if prefetcher is not None and "dev_fuse_fd" in getattr(pyfuse3, "dlfs_features", ()):
        prefetcher.native = NativePusher.load(pyfuse3.dev_fuse_fd(), pyfuse3.ROOT_INODE)
    log.info("mounted %s (%d entries) on %s in %.3f s", dataset, index.count, mnt, time.monotonic() - started)
    _serve_first()
    clean = False
    try:
        try:
            ready()
        except BrokenPipeError:  # dlfs mount stopped waiting (killed): nobody was told of this mount
            log.warning("dlfs mount stopped waiting for the mount; unmounting %s", mnt)
        else:
            trio.run(_serve, prefetcher)
        clean = True
    finally:
        pyfuse3.close(unmount=clean)
        store.close()
    log.info("unmounted %s", mnt)


def _serve_first() -> None:
    """Let the daemon run ahead of its readers: every reader waits on it, never the other way.

    With 8 loader processes on a few cores, a FUSE server at normal priority gets a 1/9 share and
    each reply waits behind readers' time slices. Raising its priority needs root; without, the
    daemon runs as before.
    """
    try:
        os.setpriority(os.PRIO_PROCESS, 0, DAEMON_NICE)
    except PermissionError:
        log.debug("cannot raise the daemon's priority (not root)")


def _option_safe(text: str) -> str:
    """Mount options are comma-separated; keep the dataset path from splitting them."""
    return os.path.abspath(text).replace(",", "_").replace(" ", "_")
