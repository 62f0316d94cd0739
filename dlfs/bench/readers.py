"""The readers: N threads, or processes like DataLoader workers, each timing every item of its share.

With N readers and batches of B items, reader k takes batches k, k+N, ... of the sequence (items
k, k+N, ... for B = 1), so together they advance through it the way DataLoader workers do. Each
reader's work is a pure loop over its share; all of them wait at one start line, so none is timed
while the others are still starting.
"""

from __future__ import annotations

import multiprocessing as mp
import resource
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dlfs.bench.errors import BenchError
from dlfs.bench.jobs import WORK
from dlfs.bench.probes import rusage_cpu

#: How long readers wait at the start line, so none is timed while the others are still starting.
START_TIMEOUT = 60.0


@dataclass
class Share:
    """One reader's result: per-item latencies, bytes read, when it finished, its own CPU time."""

    latencies: list[float]
    nbytes: int
    finished: float
    cpu: float


def _run_share(job: str, root: str, items: Sequence[str], start: Callable[[], object], who: int) -> Share:
    work = WORK[job]
    start()
    cpu = rusage_cpu(who)
    latencies = []
    nbytes = 0
    clock = time.perf_counter
    for item in items:
        began = clock()
        nbytes += work(root, item)
        latencies.append(clock() - began)
    return Share(latencies, nbytes, clock(), rusage_cpu(who) - cpu)


def _process_reader(job: str, root: str, items: Sequence[str], barrier: Any, conn: Any) -> None:
    try:
        share = _run_share(job, root, items, lambda: _meet(barrier), resource.RUSAGE_SELF)
        conn.send(share)
    except BaseException as exc:
        conn.send(exc)
        raise


def _meet(barrier: Any) -> None:
    """A reader's side of the start: ready (spawned, waiting), then released together."""
    barrier.wait(START_TIMEOUT)
    barrier.wait(START_TIMEOUT)


def reader_items(items: Sequence[str], reader: int, readers: int, batch: int = 1) -> list[str]:
    """Reader ``reader``'s items: batches ``reader``, ``reader + readers``, ... of ``batch`` items."""
    stride = readers * batch
    return [
        item for first in range(reader * batch, len(items), stride) for item in items[first : first + batch]
    ]


def run_readers(
    job: str,
    root: str,
    items: Sequence[str],
    readers: int,
    processes: bool,
    arm: Callable[[], object],
    batch: int = 1,
) -> tuple[float, list[Share]]:
    """Run ``readers`` readers over ``items`` from one start line; (seconds, each reader's share).

    The clock starts once every reader is spawned and waiting, and before ``arm`` (reading a dlfs
    root's published order, which starts its read-ahead): a read-ahead armed before the clock would
    get a head start no other root gets (0.4-2 s of fetching, 20 % of a cold epoch).
    """
    shares: list[Share | BaseException] = []
    if processes:
        ctx = mp.get_context("fork")
        barrier: Any = ctx.Barrier(readers + 1)
        pipes = [ctx.Pipe(duplex=False) for _ in range(readers)]
        workers: list[Any] = [
            ctx.Process(
                target=_process_reader,
                args=(job, root, reader_items(items, k, readers, batch), barrier, pipes[k][1]),
            )
            for k in range(readers)
        ]
    else:
        barrier = threading.Barrier(readers + 1)

        def thread_reader(k: int) -> None:
            try:
                shares.append(
                    _run_share(
                        job,
                        root,
                        reader_items(items, k, readers, batch),
                        lambda: _meet(barrier),
                        resource.RUSAGE_THREAD,
                    )
                )
            except BaseException as exc:
                shares.append(exc)

        workers = [threading.Thread(target=thread_reader, args=(k,)) for k in range(readers)]
    for worker in workers:
        worker.start()
    barrier.wait(START_TIMEOUT)
    started = time.perf_counter()
    try:
        arm()
    except BaseException:
        barrier.abort()  # the readers give up at once instead of waiting out START_TIMEOUT
        for worker in workers:
            worker.join()
        raise
    barrier.wait(START_TIMEOUT)
    if processes:
        shares = [recv.recv() for recv, _ in pipes]
    for worker in workers:
        worker.join()
    for share in shares:
        if isinstance(share, BaseException):
            raise BenchError(f"{job} on {root} failed: {share}") from share
    done = [s for s in shares if isinstance(s, Share)]
    return max(s.finished for s in done) - started, done
