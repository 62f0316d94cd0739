"""The mount daemon: assemble index, store, cache and reader behind the FUSE adapter and serve.

Run in the foreground by ``dlfs mount``'s child process or directly under systemd.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pyfuse3
import trio

from dlfs.core import memory
from dlfs.core.errors import MountError
from dlfs.core.index import Index
from dlfs.core.order import OrderSpec
from dlfs.core.protocol import CONTROL_NAME
from dlfs.core.ram_cache import RamCache
from dlfs.core.shard_store import shard_store
from dlfs.core.store import Store, index_copies, is_s3, open_store
from dlfs.fuse import server as native_server
from dlfs.fuse.control import ControlTree
from dlfs.fuse.features import log_pyfuse3_features, readahead_loop_missing, unavailable
from dlfs.fuse.fuse_kernel import FuseKernel, MountListing
from dlfs.fuse.known import KernelKnowledge
from dlfs.fuse.lister import FolderLister
from dlfs.fuse.mount import MountOptions, check_allow_other, check_mountpoint, mount_id, still_mounted
from dlfs.fuse.mount_stats import MountStats, Snapshot, from_thread
from dlfs.fuse.operations import CACHE_TIMEOUT, LISTING_BLOCK, STATFS_BLOCK, DlfsOperations
from dlfs.fuse.pagecache import MountPageCache
from dlfs.fuse.trio_file_bytes import TrioFileBytes
from dlfs.readahead.buffers import REUSED_BUFFER
from dlfs.readahead.engine import ReadAhead

if TYPE_CHECKING:  # imported when --metrics-port asks for it
    from dlfs.metrics import MetricsEndpoint

log = logging.getLogger(__name__)

#: Scheduling priority of the daemon (nice value); see _serve_first.
DAEMON_NICE = -10


#: Longest wait between two looks at the mount table, for the unmount of this mount (a change wakes
#: the look at once; one just before it is opened is seen at the next).
MOUNT_TABLE_WAIT = 1.0

#: How often the folders the C threads listed are passed to the lister (background work: a scan of
#: the whole tree is relisted with attributes for the read-ahead).
SCANS_EVERY = 0.05


async def _serve(
    readahead: ReadAhead | None,
    native: native_server.NativeServer | None,
    lister: FolderLister,
    pages: MountPageCache,
    mount: int | None,
    metrics: MetricsEndpoint | None,
    stats: Callable[[], Snapshot],
) -> None:
    if metrics is not None:
        metrics.start(from_thread(stats, trio.lowlevel.current_trio_token()))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_terminate_on_signal)
        if mount is not None:
            nursery.start_soon(_let_go_when_unmounted, pages, mount)
        if readahead is not None:
            nursery.start_soon(readahead.run)
        if native is not None and native.threads:
            nursery.start_soon(_relay_scans, native, lister)
        await pyfuse3.main()
        nursery.cancel_scope.cancel()


async def _let_go_when_unmounted(pages: MountPageCache, mount: int) -> None:
    """Close the daemon's own view of the mount (``pagecache``) once its mountpoint is unmounted:
    the view would keep the filesystem, and so this daemon, alive."""
    while await trio.to_thread.run_sync(still_mounted, mount, MOUNT_TABLE_WAIT, abandon_on_cancel=True):
        pass
    log.debug("the mountpoint was unmounted; closing the daemon's view of the mount")
    pages.close()


async def _relay_scans(native: native_server.NativeServer, lister: FolderLister) -> None:
    """Listings the C threads answered without attributes reach the lister as the Python ones do."""
    while True:
        for folder in native.take_scanned():
            lister.scanned(folder)
        await trio.sleep(SCANS_EVERY)


async def _terminate_on_signal() -> None:
    """SIGTERM/SIGINT end the main loop; pyfuse3.close then unmounts cleanly."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signum in signals:
            log.info("received %s, unmounting", signal.Signals(signum).name)
            pyfuse3.terminate()
            return


def serve(dataset: str, mnt: str, options: MountOptions, ready: Callable[[list[str]], None]) -> None:
    """Mount in this process and serve until unmounted; ``ready`` is called once the mount is live,
    with the warnings the user should see (budgets clamped to the memory available).

    Every resource the mount opens is closed by one exit stack, in the reverse order: the metrics
    endpoint, the daemon's view of the mount, the FUSE session (unmounting), the native threads,
    the store."""
    started = time.monotonic()
    with contextlib.ExitStack() as resources:
        store = open_store(dataset, random_access=True, options=options.store)
        resources.callback(store.close)
        log.info("loading the index of %s", dataset)  # it is read whole: the wait a slow disk shows
        index = Index.load(store, index_copies(options.store))
        log.info("index loaded in %.3f s: %d entries", time.monotonic() - started, index.count)
        if index.transform:
            log.info("transform %s: the mount serves the transformed bytes", index.transform)
        shards = shard_store(index, store, random_access=True, options=options.store)
        if shards is not store:  # an in-place dataset's tars
            resources.callback(shards.close)
            store = shards
        mountpoint = Path(mnt)
        check_mountpoint(mountpoint)
        check_allow_other(options.allow_other)
        options, notes = _fit_memory(options, store)
        # Read-ahead parks files the kernel refuses (unknown inodes) and its sentinels in the RAM
        # cache, so the cache holds its budget on top of what demand reads get.
        cache = RamCache(options.ram_cache_size + options.readahead_budget)
        file_bytes = TrioFileBytes(index, store, cache, max_threads=options.threads)
        # What the kernel knows: fed by the FUSE adapter's requests, read by the listings that teach
        # the kernel files and by the read-ahead's kernel, which steers those listings.
        known = KernelKnowledge(index)
        resolved = mountpoint.resolve()  # before mounting: resolving it after would ask this daemon
        pages = MountPageCache(str(resolved))
        listing = MountListing(index, known, pages)
        lister = FolderLister(index, listing.list_folder, after_scans=options.readahead_budget > 0)
        readahead = None
        if options.readahead_budget > 0:
            kernel = FuseKernel(index, known, pages, lister)
            readahead = ReadAhead(
                index,
                file_bytes,
                kernel,
                budget=options.readahead_budget,
                max_inflight=options.readahead_inflight,
                pause_after=options.readahead_pause,
            )
        spec = OrderSpec(seed=options.seed, mode=options.order, block=options.block, window=options.window)
        native, missing = _native_server(index, file_bytes, known, options)
        if readahead is not None and (reason := readahead_loop_missing()) is not None:
            missing.append(unavailable("read-ahead loop", reason))
        if native is not None:
            resources.callback(native.close)  # after the unmount: its threads stop with the session
        stats = MountStats(store, cache, file_bytes, lister, readahead, native, started)
        control = ControlTree(index, spec, stats.snapshot)
        operations = DlfsOperations(
            index, file_bytes, control, readahead, lister, known, stats.answered, native
        )
        operations.readdirplus_auto = options.readdirplus == "auto"
        metrics = _metrics_endpoint(options)
        if metrics is not None:
            resources.callback(metrics.close)
        fuse_options = {"ro", "default_permissions", "subtype=dlfs", "fsname=dlfs:" + _option_safe(dataset)}
        if options.allow_other:
            fuse_options.add("allow_other")
        if options.fuse_debug:
            fuse_options.add("debug")
        try:
            pyfuse3.init(operations, str(mountpoint), fuse_options)
        except RuntimeError as exc:
            raise MountError(f"cannot mount on {mnt}: {exc}; check the mountpoint and /dev/fuse") from exc
        clean = False

        def end_session() -> None:
            pyfuse3.close(unmount=clean and not (native is not None and native.session_ended()))

        resources.callback(end_session)
        resources.callback(pages.close)  # its copy of the mount must not outlive the session
        log.info(
            "mounted %s (%d entries) on %s in %.3f s", dataset, index.count, mnt, time.monotonic() - started
        )
        log_pyfuse3_features(log)
        _serve_first()  # before the native threads start: they inherit the priority
        if native is not None:
            try:
                native.start(options.native_threads)
            except OSError as exc:
                missing.append(unavailable("request server", str(exc)))
        for line in missing:
            log.warning("%s", line)
        try:
            ready(notes + missing)
        except BrokenPipeError:  # dlfs mount stopped waiting (killed): nobody was told of this mount
            log.warning("dlfs mount stopped waiting for the mount; unmounting %s", mnt)
        else:
            trio.run(_serve, readahead, native, lister, pages, mount_id(resolved), metrics, stats.snapshot)
        clean = True
    log.info("unmounted %s", mnt)


def _fit_memory(options: MountOptions, store: Store) -> tuple[MountOptions, list[str]]:
    """The budgets and batches in flight fitted to the memory the daemon may take now
    (``dlfs.core.memory``): clamped with a warning, or the mount refused. Asked once the index is
    loaded, so that it is counted among what is used."""
    buffer = REUSED_BUFFER
    if store.hints_in_memory:
        buffer *= 2  # a batch's hinted GETs land beside its buffer
    fitted = memory.fit(
        options.ram_cache_size,
        options.readahead_budget,
        options.readahead_inflight,
        buffer,
        memory.available(options.memory_limit),
    )
    if fitted.note is None:
        return options, []
    log.warning("%s", fitted.note)
    options = dataclasses.replace(
        options,
        ram_cache_size=fitted.ram_cache_size,
        readahead_budget=fitted.readahead_budget,
        readahead_inflight=fitted.readahead_inflight,
    )
    return options, [fitted.note]


def _metrics_endpoint(options: MountOptions) -> MetricsEndpoint | None:
    """The Prometheus endpoint if asked for, bound before the mount: a taken port fails the mount."""
    if options.metrics_port is None:
        return None
    from dlfs.metrics import MetricsEndpoint

    return MetricsEndpoint(options.metrics_addr, options.metrics_port)


def _native_server(
    index: Index, file_bytes: TrioFileBytes, known: KernelKnowledge, options: MountOptions
) -> tuple[native_server.NativeServer | None, list[str]]:
    """The C threads for the hot requests, unless turned off; and the line for the user's terminal
    when they are wanted but cannot run here (a user must not find that in a log file)."""
    if options.native_threads <= 0:
        log.info("native request server off (--native-threads 0): Python answers every request")
        return None, []
    missing = native_server.available(index)
    if missing is not None:
        return None, [unavailable("request server", missing)]
    region = native_server.region_for(index, options.region_ahead)
    server = native_server.NativeServer(
        index,
        file_bytes,
        CONTROL_NAME,
        CACHE_TIMEOUT,
        (STATFS_BLOCK, LISTING_BLOCK),
        STATFS_BLOCK,
        region,
        known,
        options.readdirplus == "auto",
    )
    return server, []


def _serve_first() -> None:
    """Let the daemon run ahead of its readers: every reader waits on it, never the other way.

    With 8 loader processes on a few cores, a FUSE server at normal priority gets a 1/9 share and
    each reply waits behind readers' time slices. Raising its priority needs root (or
    CAP_SYS_NICE); without, the daemon runs at normal priority and says so.
    """
    try:
        os.setpriority(os.PRIO_PROCESS, 0, DAEMON_NICE)
    except PermissionError:
        log.info(
            "not root: the daemon runs at normal priority (nice %d needs root or CAP_SYS_NICE), so "
            "with many loader processes on few cores its replies wait behind their time slices",
            DAEMON_NICE,
        )


def _option_safe(text: str) -> str:
    """Mount options are comma-separated; keep the dataset's location from splitting them."""
    location = text if is_s3(text) else os.path.abspath(text)
    return location.replace(",", "_").replace(" ", "_")
