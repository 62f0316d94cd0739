"""The hand-off between READs and batches in flight: a READ of a file a batch is loading waits for
the batch and takes the file from it.

Readers that catch up with the read-ahead ask for files it is fetching at that moment, and loading
them again for the READ doubles the work of a daemon short of CPU exactly then (with 8 readers on
warm storage, a good share of the files was loaded twice). The READ must not wait for the push,
though: the kernel keeps the file's pages locked until the READ is answered, so a push of them
would wait for the READ that waits for it. So a batch hands a waited-for file over as soon as its
storage read is verified, and does not push it.

Shared by the event loop (``arrival``, ``expect``, ``finish``) and the fetching threads
(``hand_over``, ``release``), under one lock.
"""

from __future__ import annotations

import threading

import numpy as np
import trio

#: (index into the batch's rows, row, payload) of a file a storage read loaded.
Loaded = tuple[int, int, bytes | memoryview]


class Handoff:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: set[int] = set()  # rows a batch in flight has not loaded yet
        self._waiting: dict[int, trio.Event] = {}  # READs waiting for one of them
        self._handed: dict[int, bytes] = {}  # files handed to those READs

    def expect(self, rows: list[int]) -> None:
        """A batch of these rows starts (event loop)."""
        with self._lock:
            self._pending.update(rows)

    async def arrival(self, row: int) -> bytes | None:
        """Before a READ of ``row`` is served: if a batch in flight is loading it, wait for it.
        Returns the file the batch handed over, or None (none was loading it, or the batch did not
        load it: the READ reads it itself)."""
        with self._lock:
            if row not in self._pending:
                return None
            arrived = self._waiting.setdefault(row, trio.Event())
        try:
            await arrived.wait()
        finally:
            with self._lock:
                data = self._handed.pop(row, None)
                if self._waiting.get(row) is arrived:
                    del self._waiting[row]
        return data

    def hand_over(self, rows: list[int], loaded: list[Loaded]) -> set[int]:
        """In a fetching thread, once a storage read is loaded: the READs waiting for its ``rows``
        get their file (or, for a file that did not load, go and read it themselves); returns the
        rows handed over, which are not pushed."""
        with self._lock:
            self._pending.difference_update(rows)
            if not self._waiting:
                return set()
            handed = {row: bytes(data) for _, row, data in loaded if row in self._waiting}
            self._handed.update(handed)
            woken = [self._waiting[row] for row in rows if row in self._waiting]
        if woken:
            trio.from_thread.run_sync(_set_all, woken)
        return set(handed)

    def release(self, rows: np.ndarray) -> np.ndarray:
        """In a fetching thread, before the C loop pushes ``rows``: which of them a READ waits for
        already (those keep their place, and go through ``hand_over``); the others leave the
        pending set, so that a READ of one from now on reads the file itself instead of waiting
        for a push that would wait for it."""
        with self._lock:
            waited = np.array([row in self._waiting for row in rows.tolist()], dtype=bool)
            self._pending.difference_update(rows[~waited].tolist())
        return waited

    def finish(self, rows: list[int]) -> None:
        """A batch is done (event loop): files it skipped or failed to load, their READs go on."""
        with self._lock:
            self._pending.difference_update(rows)
            woken = [self._waiting[row] for row in rows if row in self._waiting]
        _set_all(woken)


def _set_all(events: list[trio.Event]) -> None:
    for event in events:
        event.set()
