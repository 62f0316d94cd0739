"""Shards uploaded as they are written: a multipart upload fed through a bounded pipe, so a shard
is never whole in memory. A failed or aborted upload is aborted by obstore (the pipe raises), and
nothing is visible under its name until it completes."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from dlfs.core.errors import StoreError

#: Multipart upload part size: S3 takes 5 MiB to 5 GiB; 16 MiB keeps a 1 GiB shard at 64 parts.
PART_SIZE = 16 << 20
#: Parts of one shard uploading at once; with the pipe, what a shard upload holds in memory.
PART_CONCURRENCY = 4
#: Bytes written to a shard that wait for its upload before ``write`` blocks the packer.
PIPE_BYTES = 2 * PART_SIZE

#: Uploads ``name`` from the parts an iterator yields, aborting the upload when it raises.
Upload = Callable[[str, Iterator[bytes | memoryview]], None]


def file_parts(path: Path) -> Iterator[bytes]:
    """A file's bytes, PART_SIZE at a time."""
    with open(path, "rb") as f:
        while part := f.read(PART_SIZE):
            yield part


class UploadPipe:
    """Bytes handed from the packer's thread to an upload's, at most ``limit`` waiting.

    Iterating yields what was put until ``close``; after ``close(failed=True)`` it raises, which
    makes obstore abort the multipart upload.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._held = 0
        self._items: list[bytes | memoryview] = []
        self._closed = False
        self._failed = False
        self._cond = threading.Condition()

    def put(self, data: bytes | memoryview, reader_done: threading.Event) -> None:
        with self._cond:
            while self._held and self._held + len(data) > self._limit and not reader_done.is_set():
                self._cond.wait(0.5)
            self._items.append(data)
            self._held += len(data)
            self._cond.notify_all()

    def close(self, failed: bool = False) -> None:
        with self._cond:
            self._closed = True
            self._failed = failed
            self._cond.notify_all()

    def __iter__(self) -> Iterator[bytes | memoryview]:
        while True:
            with self._cond:
                while not self._items and not self._closed:
                    self._cond.wait()
                if self._failed:
                    raise StoreError("upload aborted")
                if not self._items:
                    return
                items, self._items = self._items, []
                self._held = 0
                self._cond.notify_all()
            yield from items


class S3ShardWriter:
    """One shard's multipart upload, running in its own thread while the packer appends to it.

    ``ended`` is told once the upload is committed or aborted: the store aborts the writers it was
    not told of when a pack is undone.

    The upload's end is an event of its own, not the thread's: in Python 3.11, a ``join`` or
    ``is_alive`` that a signal interrupts marks the thread as stopped while it still runs
    (CPython gh-90882), and an abort that trusted it would delete the shard before its upload
    completed it."""

    def __init__(self, name: str, upload: Upload, ended: Callable[[S3ShardWriter], None]) -> None:
        self._name = name
        self._upload = upload
        self._ended = ended
        self._pipe = UploadPipe(PIPE_BYTES)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"dlfs-upload-{name}", daemon=True)
        self._started = False
        self._done = threading.Event()

    def start(self) -> None:
        self._started = True
        self._thread.start()

    def _run(self) -> None:
        # SIGINT and SIGTERM are the main thread's: it alone knows what a pack must undo.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            self._upload(self._name, iter(self._pipe))
        except BaseException as exc:
            self._error = exc
        finally:
            self._done.set()

    def _wait(self) -> None:
        """Until the upload has ended (at once if it never started: created, then interrupted)."""
        if self._started:
            self._done.wait()

    def _raise_failure(self) -> None:
        if self._error is not None:
            raise self._error

    def write(self, data: bytes | memoryview) -> None:
        self._raise_failure()
        self._pipe.put(data, self._done)
        self._raise_failure()

    def commit(self) -> None:
        self._pipe.close()
        self._wait()
        self._ended(self)
        self._raise_failure()

    def abort(self) -> None:
        """Abort the upload, or, once committed, nothing: deleting a committed shard is the
        caller's."""
        self._pipe.close(failed=True)
        self._wait()
        self._ended(self)
