"""What ``dlfs pack`` is asked to do, what it reports, and its rule for a file it cannot read.

Every stage of a pack (the walk, the read pipeline, the write loop) takes these, so they sit below
all of them.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass, field

from tqdm import tqdm

from dlfs.core.errors import PackError
from dlfs.core.store import StoreOptions
from dlfs.pack.path_map import PathMap
from dlfs.pack.transform import Transform

log = logging.getLogger(__name__)


#: Threads reading files: two per core, at most 8. Each writes what it has read at once, so more than
#: that only evict each other's bytes from the caches: 20k JPEGs packed warm in 2.0-2.2 s with 4
#: on 2 cores, 2.9-3.1 s with 8; from a cold disk 2, 4 or 8 made no difference (4.0-4.7 s).
DEFAULT_THREADS = min(8, 2 * (os.cpu_count() or 1))


@dataclass(frozen=True)
class PackOptions:
    shard_size: int = 1 << 30
    #: Files read at once (threads; with a transform, at most this many worker processes).
    threads: int = DEFAULT_THREADS
    compress: bool = False
    placement: str = "tree"
    seed: int = 0
    force: bool = False
    skip_errors: bool = False
    progress: bool = True
    #: Wait for the disk before publishing the index; off, pack is as safe as tar or cp: a power
    #: loss soon after may leave shards shorter than the index says, which the mount refuses.
    sync: bool = True
    #: How to reach an ``s3://`` destination.
    store: StoreOptions = field(default_factory=StoreOptions)
    #: Bytes stored in place of each file's (``dlfs pack --transform``); None stores them as they are.
    transform: Transform | None = None
    #: An archive's members named ``NAME.tar`` become folders ``NAME`` of their own members.
    expand_tars: bool = False
    #: Write only the index; the mount serves members from the tars themselves (``archive.in_place``).
    in_place: bool = False
    #: Where members move to (``dlfs pack --map``); None leaves every one where it is.
    path_map: PathMap | None = None


@dataclass
class PackSummary:
    dataset_id: str = ""
    files: int = 0
    directories: int = 0
    symlinks: int = 0
    bytes: int = 0
    stored_bytes: int = 0
    compressed_files: int = 0
    shards: int = 0
    index_bytes: int = 0
    seconds: float = 0.0
    skipped_special: int = 0
    skipped_errors: int = 0
    skipped_paths: list[str] = field(default_factory=list)
    #: Archive members at a path a later member took (the last is kept, as ``tar x`` keeps it).
    duplicates: int = 0
    #: Tars an in-place pack indexed (``--in-place``; 0: the bytes went into shards).
    archives: int = 0
    #: ``--transform``'s spec and codec ("" without one), the files it changed, and per reason
    #: (``images.Kept``) the files it stored unchanged.
    transform: str = ""
    codec: str = ""
    transformed_files: int = 0
    #: Bytes of the source files read, against ``bytes`` (what the dataset holds for them).
    source_bytes: int = 0
    kept_files: dict[str, int] = field(default_factory=dict)
    #: With ``--map``: files, symlinks and hard links it moved and left where they were, and its
    #: entries that named no member.
    mapped: int = 0
    unmapped: int = 0
    map_unused: int = 0

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


#: Files between refreshes of the files/s figure on the progress bar.
PROGRESS_EVERY = 256


def progress_bar(options: PackOptions, total: int | None = None) -> tqdm:
    """Pack's progress bar over bytes (``total``: None where the bytes to come are not known)."""
    return tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        disable=not options.progress,
        desc="pack",
        dynamic_ncols=True,
    )


def show_files(bar: tqdm, files: int, started: float) -> None:
    """The files placed so far and their rate, drawn with the bar's next refresh."""
    rate = files / max(time.monotonic() - started, 1e-9)
    bar.set_postfix_str(f"{files:,} files, {rate:,.0f} files/s", refresh=False)


def fail_or_skip(message: str, options: PackOptions, summary: PackSummary, path: bytes) -> None:
    """Stop the pack over an unreadable path, or with ``--skip-errors`` leave it out and say so."""
    if not options.skip_errors:
        raise PackError(f"{message}; fix it or pass --skip-errors")
    log.warning("skipping: %s", message)
    summary.skipped_errors += 1
    summary.skipped_paths.append(os.fsdecode(path))
