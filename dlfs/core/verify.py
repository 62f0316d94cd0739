"""``dlfs verify``: read every file back from the shards and check it against its checksum."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import numpy as np
from tqdm import tqdm

from dlfs.core import format as fmt
from dlfs.core.errors import DlfsError
from dlfs.core.file_bytes import FileBytes
from dlfs.core.index import Index
from dlfs.core.ram_cache import RamCache
from dlfs.core.shard_store import shard_store
from dlfs.core.store import StoreOptions, index_copies, open_store

#: Runs handed to the pool at a time, so a million-file dataset does not queue a million futures.
BATCH = 1024
#: Neighbouring files are read together, up to this many bytes: one request per file cost an object
#: store a round trip each.
RUN_BYTES = 8 << 20


def _runs(index: Index, rows: np.ndarray) -> list[list[int]]:
    """Rows (in storage order) cut into runs read with one request each: files of one shard, back
    to back, read whole, at most ``RUN_BYTES`` together; a file too big to hold whole runs alone."""
    shard, offset, stored = (
        index.shard[rows].tolist(),
        index.offset[rows].tolist(),
        index.stored[rows].tolist(),
    )
    whole = (index.size[rows] <= fmt.WHOLE_PAYLOAD_LIMIT).tolist()
    runs: list[list[int]] = []
    start = end = -1
    for k, row in enumerate(rows.tolist()):
        joins = runs and whole[k] and shard[k] == shard[k - 1] and offset[k] == end
        if joins and offset[k] + stored[k] - start <= RUN_BYTES:
            runs[-1].append(row)
        else:
            runs.append([row])
            start = offset[k]
        end = offset[k] + stored[k] if whole[k] else -1
    return runs


def _check_run(file_bytes: FileBytes, run: list[int]) -> list[tuple[int, str | None]]:
    """Each file of a run and its problem (None when it is sound)."""
    index = file_bytes.index
    if len(run) == 1 and not file_bytes.is_whole(run[0]):
        try:
            file_bytes.check(run[0])
        except DlfsError as exc:
            return [(run[0], str(exc))]
        return [(run[0], None)]
    first = int(index.offset[run[0]])
    try:
        blob = memoryview(
            file_bytes.read_range(run[0], 0, int(index.offset[run[-1]] + index.stored[run[-1]]) - first)
        )
    except DlfsError as exc:
        return [(row, str(exc)) for row in run]
    outcomes: list[tuple[int, str | None]] = []
    for row in run:
        begin = int(index.offset[row]) - first
        try:
            file_bytes.decode(row, blob[begin : begin + int(index.stored[row])])
            outcomes.append((row, None))
        except DlfsError as exc:
            outcomes.append((row, str(exc)))
    return outcomes


@dataclass
class VerifyReport:
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    bad: list[dict[str, str]] = field(default_factory=list)
    #: ``Index.transform``: checked are the bytes a pack-time transform stored, not the source's.
    transform: str = ""
    #: ``Index.in_place``: the tars an in-place dataset's bytes were checked in.
    in_place: str = ""

    @property
    def ok(self) -> bool:
        return not self.bad

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "ok": self.ok}


def verify(
    location: str, threads: int = 4, progress: bool = True, options: StoreOptions | None = None
) -> VerifyReport:
    """Check every file in storage order; a bad file is reported, never fatal to the rest."""
    started = time.monotonic()
    options = options or StoreOptions()
    store = open_store(location, options=options)
    try:
        index = Index.load(store, index_copies(options))
        shards = shard_store(index, store, options=options)
        if shards is not store:  # an in-place dataset's tars
            store.close()
            store = shards
        file_bytes = FileBytes(index, store, RamCache(0))
        rows = index.file_rows()
        report = VerifyReport(
            files=int(rows.size),
            bytes=int(index.size[rows].sum()),
            transform=index.transform,
            in_place=index.in_place,
        )

        def check(run: list[int]) -> list[tuple[int, str | None]]:
            return _check_run(file_bytes, run)

        with (
            tqdm(
                total=report.bytes,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc="verify",
                disable=not progress,
            ) as bar,
            ThreadPoolExecutor(max_workers=threads) as pool,
        ):
            runs = _runs(index, rows)
            for start in range(0, len(runs), BATCH):
                for outcomes in pool.map(check, runs[start : start + BATCH]):
                    for row, problem in outcomes:
                        bar.update(int(index.size[row]))
                        if problem is not None:
                            report.bad.append({"path": index.location(row), "problem": problem})
    finally:
        store.close()
    report.seconds = time.monotonic() - started
    return report
