"""Storage reads of a batch: files of one shard close together share one read.

Both loaders (``python_loader``, ``native_loader``) read a batch this way. Nothing here does I/O.
"""

from __future__ import annotations

import numpy as np

from dlfs.core.index import Index
from dlfs.readahead.batch import BATCH_BYTES

#: Storage reads of one shard are merged when the gap between two files is at most this.
COALESCE_GAP = 256 << 10

#: A storage read: (first row, shard offset, length).
Span = tuple[int, int, int]


def groups(
    by_place: list[int], offsets: list[int], ends: list[int], shards: list[int], need: list[int]
) -> list[list[int]]:
    """Files by storage read: neighbours in one shard share one, and the read holding the
    earliest-needed file comes first. ``by_place`` lists the files in (shard, offset) order.

    Plain lists: a batch is a few hundred files, and per-file numpy calls cost more than the
    arithmetic they would vectorise."""
    out: list[list[int]] = []
    for i in by_place:
        group = out[-1] if out else None
        if (
            group is not None
            and shards[i] == shards[group[0]]
            and offsets[i] - ends[group[-1]] <= COALESCE_GAP
            and ends[i] - offsets[group[0]] <= 2 * BATCH_BYTES
        ):
            group.append(i)
        else:
            out.append([i])
    out.sort(key=lambda group: min(need[i] for i in group))
    return out


def storage_reads(
    index: Index, rows: np.ndarray, need: np.ndarray
) -> tuple[list[list[int]], list[Span], list[int], list[int]]:
    """How to read these files from storage: groups of indices into ``rows`` (see ``groups``),
    each group's read as (first row, shard offset, length), and each file's stored bytes as shard
    offsets (start, end)."""
    shard_column = index.shard[rows]
    offset_column = index.offset[rows].astype(np.int64)
    end_column = offset_column + index.stored[rows].astype(np.int64)
    by_place = np.lexsort((offset_column, shard_column)).tolist()
    row_list, offsets, ends = rows.tolist(), offset_column.tolist(), end_column.tolist()
    grouped = groups(by_place, offsets, ends, shard_column.tolist(), need.tolist())
    spans = [(row_list[g[0]], offsets[g[0]], max(ends[i] for i in g) - offsets[g[0]]) for g in grouped]
    return grouped, spans, offsets, ends
