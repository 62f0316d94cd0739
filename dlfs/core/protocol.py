"""The control protocol at ``MNT/.dlfs``: its names, the order files' names and their contents.

Everything a reader of a mount needs to follow its published order, and nothing else, so that a
training script's ``import dlfs.torch`` loads no store, no FUSE binding and no ctypes:

- ``.dlfs/order/epoch-E`` and ``.dlfs/order/epoch-E.rank-R-of-W``: the files rank R of W reads in
  epoch E, one path relative to the mount root per line, in order. A backslash or newline inside a
  name is written as ``\\\\`` or ``\\n``. Resolving one tells the daemon that this epoch and rank are
  being read on this node, so the read-ahead starts following it. Epochs run to 2^63 - 1 and
  worlds to ``MAX_WORLD`` ranks; any other name is not found.
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
_ORDER_FILE = re.compile(rb"epoch-(\d+)(?:\.rank-(\d+)-of-(\d+))?")


@dataclass(frozen=True)
class Reading:
    """One published sequence being read on this node: (epoch, world size, rank) and its rows.

    ``window``: files this many positions apart may be storage neighbours that the read-ahead
    should fetch together (``--order block`` shuffles whole runs within such a window); 0 when the
    order makes no such promise.
    """

    epoch: int
    world_size: int
    rank: int
    rows: np.ndarray
    window: int = 0


def order_name(epoch: int, world_size: int = 1, rank: int = 0) -> str:
    """The order file's name for one epoch and rank; a world of one has the short form."""
    return f"epoch-{epoch}" if world_size == 1 else f"epoch-{epoch}.rank-{rank}-of-{world_size}"


def order_path(mount: str | os.PathLike[str], epoch: int, world_size: int = 1, rank: int = 0) -> Path:
    """Where a mount publishes that order file."""
    control, orders = os.fsdecode(CONTROL_NAME), os.fsdecode(ORDER_NAME)
    return Path(mount, control, orders, order_name(epoch, world_size, rank))


def is_dlfs_mount(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is the root of a dlfs mount, told by its config file (which a lookup of an
    order file, unlike this, would not leave alone: it arms the read-ahead)."""
    return Path(path, os.fsdecode(CONTROL_NAME), os.fsdecode(CONFIG_NAME)).is_file()


def parse_order_name(name: bytes) -> tuple[int, int, int] | None:
    """(epoch, world size, rank) of an order file's name; None for any other name, and for an
    epoch or a world too large to be one (every value then fits the int64 the order computes in)."""
    match = _ORDER_FILE.fullmatch(name)
    if not match:
        return None
    epoch = int(match.group(1))
    rank, world = (int(match.group(2)), int(match.group(3))) if match.group(2) else (0, 1)
    return (epoch, world, rank) if 0 <= rank < world <= MAX_WORLD and epoch <= MAX_EPOCH else None


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
