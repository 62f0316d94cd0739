"""``dlfs verify``: read every file back from the shards and check it against its checksum."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from tqdm import tqdm

from dlfs.core.cache import PayloadCache
from dlfs.core.errors import DlfsError
from dlfs.core.index import Index
from dlfs.core.reader import Reader
from dlfs.core.store import StoreOptions, index_copies, open_store

#: Rows handed to the pool at a time, so a million-file dataset does not queue a million futures.
BATCH = 1024


@dataclass
class VerifyReport:
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    bad: list[dict[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.bad

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "ok": self.ok}


def verify(
    location: str, jobs: int = 4, progress: bool = True, options: StoreOptions | None = None
) -> VerifyReport:
    """Check every file in storage order; a bad file is reported, never fatal to the rest."""
    started = time.monotonic()
    options = options or StoreOptions()
    store = open_store(location, options=options)
    try:
        index = Index.load(store, index_copies(options))
        index.check_shards(store)
        reader = Reader(index, store, PayloadCache(0))
        rows = index.file_rows()
        report = VerifyReport(files=int(rows.size), bytes=int(index.size[rows].sum()))

        def check(row: int) -> tuple[int, str | None]:
            try:
                reader.check(row)
            except DlfsError as exc:
                return row, str(exc)
            return row, None

        with (
            tqdm(
                total=report.bytes,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc="verify",
                disable=not progress,
            ) as bar,
            ThreadPoolExecutor(max_workers=jobs) as pool,
        ):
            for start in range(0, rows.size, BATCH):
                for row, problem in pool.map(check, rows[start : start + BATCH].tolist()):
                    bar.update(int(index.size[row]))
                    if problem is not None:
                        report.bad.append({"path": index.location(row), "problem": problem})
    finally:
        store.close()
    report.seconds = time.monotonic() - started
    return report
