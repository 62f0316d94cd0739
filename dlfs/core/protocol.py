"""The control protocol at ``MNT/.dlfs``: its names, the order files' names and their contents.

Everything a reader of a mount needs to follow its published order, and nothing else, so that a
training script's ``import dlfs.torch`` loads no store, no FUSE binding and no ctypes:

- ``.dlfs/order/epoch-E[.rank-R-of-W][.seed-S][.drop-last][.set-DIGEST]``: the files rank R of W
  reads in epoch E, one path relative to the mount root per line, in order. A backslash or newline
  inside a name is written as ``\\\\`` or ``\\n``. The seed defaults to the mount's; ``drop-last``
  cuts the epoch to a multiple of W (DistributedSampler's ``drop_last``) instead of padding it; the
  set makes the order over one dataset's files instead of all the mount's. Resolving one tells the
  daemon that this sequence is being read on this node, so the read-ahead starts following it.
  Epochs and seeds run to 2^63 - 1 and worlds to ``MAX_WORLD`` ranks; any other name is not found.
- ``.dlfs/files``: every file the order's positions index, one path per line, in that order.
- ``.dlfs/set/``: where a sampler announces its dataset's files (``dlfs.core.fileset``).
- ``.dlfs/stats``: JSON counters, fresh on every read.
- ``.dlfs/config``: JSON: seed, order mode, dataset id, format version.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

CONTROL_NAME = b".dlfs"
ORDER_NAME = b"order"
STATS_NAME = b"stats"
CONFIG_NAME = b"config"
FILES_NAME = b"files"
SET_NAME = b"set"
#: READ latencies in ``.dlfs/stats``: counts per bucket, bucket k holding [2^k, 2^(k+1)) µs (bucket 0
#: also what is faster). Buckets, not samples: a mount serves millions of reads, and the counts of
#: two snapshots subtract into the latencies between them (``dlfs stats --watch``).
LATENCY_BUCKETS = 32


def latency_bucket(seconds: float) -> int:
    return min(max(int(seconds * 1e6).bit_length() - 1, 0), LATENCY_BUCKETS - 1)


def latency_percentile(counts: list[int], q: float) -> float | None:
    """The latency (µs, its bucket's upper bound) below which a share ``q`` of ``counts`` falls."""
    total = sum(counts)
    if not total:
        return None
    seen = 0
    for bucket, count in enumerate(counts):
        seen += count
        if seen >= q * total:
            return float(2 ** (bucket + 1))
    return float(2**LATENCY_BUCKETS)


#: The largest world an order file is published for: beyond any cluster (2^24 ranks), and each
#: rank's share is then still computed without a sequence padded to the world's size.
MAX_WORLD = 1 << 24
MAX_EPOCH = (1 << 63) - 1
MAX_SEED = (1 << 63) - 1
_ORDER_FILE = re.compile(
    rb"epoch-(\d+)(?:\.rank-(\d+)-of-(\d+))?(?:\.seed-(\d+))?(\.drop-last)?(?:\.set-([0-9a-f]{32}))?"
)


@dataclass(frozen=True)
class OrderKey:
    """What names one published sequence: an order file's name, parsed.

    ``seed``: None for the mount's own; ``fileset``: the digest of the dataset's announced file set
    (``dlfs.core.fileset``), None for all the mount's files.
    """

    epoch: int
    world_size: int = 1
    rank: int = 0
    seed: int | None = None
    drop_last: bool = False
    fileset: str | None = None

    @property
    def name(self) -> str:
        """The order file's name; a world of one has the short form."""
        return self._spelled(short=True)

    @property
    def label(self) -> str:
        """The name with the rank always spelled out: how ``.dlfs/stats`` names a reading."""
        return self._spelled(short=False)

    def _spelled(self, short: bool) -> str:
        parts = [f"epoch-{self.epoch}"]
        if self.world_size != 1 or not short:
            parts.append(f"rank-{self.rank}-of-{self.world_size}")
        if self.seed is not None:
            parts.append(f"seed-{self.seed}")
        if self.drop_last:
            parts.append("drop-last")
        if self.fileset is not None:
            parts.append(f"set-{self.fileset}")
        return ".".join(parts)


@dataclass(frozen=True)
class Reading:
    """One published sequence being read on this node: (epoch, world size, rank) and its rows.

    ``window``: files this many positions apart may be storage neighbours that the read-ahead
    should fetch together (``--order block`` shuffles whole runs within such a window); 0 when the
    order makes no such promise. ``label``: its key's (``OrderKey.label``), which tells apart the
    sequences of one epoch and rank read at once (two datasets, two seeds).
    """

    epoch: int
    world_size: int
    rank: int
    rows: np.ndarray
    window: int = 0
    label: str = ""

    def __post_init__(self) -> None:
        if not self.label:
            object.__setattr__(self, "label", OrderKey(self.epoch, self.world_size, self.rank).label)


def order_name(epoch: int, world_size: int = 1, rank: int = 0) -> str:
    """The order file's name for one epoch and rank over all the mount's files, in its seed."""
    return OrderKey(epoch, world_size, rank).name


def order_path(
    mount: str | os.PathLike[str], epoch: int | OrderKey, world_size: int = 1, rank: int = 0
) -> Path:
    """Where a mount publishes that order file (``epoch``: an epoch number or a whole key)."""
    key = epoch if isinstance(epoch, OrderKey) else OrderKey(epoch, world_size, rank)
    return control_path(mount, ORDER_NAME, key.name)


def control_path(mount: str | os.PathLike[str], *names: bytes | str) -> Path:
    """A path under the mount's control tree."""
    return Path(mount, os.fsdecode(CONTROL_NAME), *map(os.fsdecode, names))


def is_dlfs_mount(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is the root of a dlfs mount, told by its config file (which a lookup of an
    order file, unlike this, would not leave alone: it arms the read-ahead)."""
    return control_path(path, CONFIG_NAME).is_file()


def parse_order_name(name: bytes) -> OrderKey | None:
    """The key an order file's name spells; None for any other name, and for an epoch, a seed or a
    world too large to be one (every value then fits the int64 the order computes in)."""
    match = _ORDER_FILE.fullmatch(name)
    if not match:
        return None
    epoch = int(match.group(1))
    rank, world = (int(match.group(2)), int(match.group(3))) if match.group(2) else (0, 1)
    seed = int(match.group(4)) if match.group(4) else None
    if not (0 <= rank < world <= MAX_WORLD and epoch <= MAX_EPOCH and (seed or 0) <= MAX_SEED):
        return None
    fileset = match.group(6).decode() if match.group(6) else None
    return OrderKey(epoch, world, rank, seed, bool(match.group(5)), fileset)


def escape(path: bytes) -> bytes:
    """One path as an order file writes it: backslash and newline escaped, so a line is a path."""
    if b"\\" in path or b"\n" in path:
        return path.replace(b"\\", b"\\\\").replace(b"\n", b"\\n")
    return path


def unescape(line: str) -> str:
    """Inverse of ``escape`` on one decoded line."""
    if "\\" not in line:
        return line
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), line)


def parse_order(text: bytes) -> list[str]:
    """An order file's paths, relative to the mount root; non-UTF-8 bytes come back as
    ``os.fsdecode`` gives them, so the paths compare equal to what ``os.walk`` yields.

    Decoded in one piece (a newline byte is never part of a multi-byte character) and unescaped
    only when some path was escaped: for 1.28 M paths that takes 0.2 s, line by line 0.8 s.
    """
    lines = os.fsdecode(text).split("\n")[:-1]
    return [unescape(line) for line in lines] if b"\\" in text else lines
