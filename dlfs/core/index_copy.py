"""An index's identity read from its header alone, and local copies of the indexes of remote
datasets: a remount reads a few hundred bytes of the store, not the whole index (90 MiB for
ImageNet)."""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

from dlfs.core import format as fmt
from dlfs.core.errors import DatasetError
from dlfs.core.sealed import sealed_copy
from dlfs.core.store import Store

log = logging.getLogger(__name__)

COPY_SUFFIX = ".index.dlfs"


def stored_dataset_id(store: Store, any_version: bool = False) -> tuple[str, int]:
    """The id of the dataset whose index ``store`` holds, and the index's length, from the index's
    header and metadata alone: two small ranged reads, no checksum or row checks. ``any_version``:
    of an index of another format version too (see ``format.index_header``)."""
    source = f"{store.url}/{fmt.INDEX_NAME}"
    size = store.size(fmt.INDEX_NAME)
    if size is None:
        raise DatasetError(f"{store.url} is not a dlfs dataset (no {fmt.INDEX_NAME}); run dlfs pack first")
    _, meta_offset, meta_length, file_length = fmt.index_header(
        store.read(fmt.INDEX_NAME, 0, fmt.HEADER_SIZE), source, any_version
    )
    if file_length != size:  # nothing below asks the store for more than it holds
        raise DatasetError(
            f"{source} is truncated or padded ({size} bytes, header says {file_length}); re-run dlfs pack"
        )
    try:
        dataset_id = str(json.loads(store.read(fmt.INDEX_NAME, meta_offset, meta_length))["dataset_id"])
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise DatasetError(f"{source} is corrupt (unreadable meta); re-run dlfs pack") from exc
    if not re.fullmatch(r"[0-9a-f]{1,64}", dataset_id):
        raise DatasetError(f"{source} has a malformed dataset id; re-run dlfs pack")
    return dataset_id, file_length


def local_copy(store: Store, copies: Path, source: str, refresh: bool = False) -> memoryview:
    """The store's index from ``copies/<dataset id>.dlfs``, fetched first when missing, of another
    length or (``refresh``) damaged. The dataset id comes from the index itself
    (``stored_dataset_id``): a dataset packed again under the same name has a new id, so a stale
    copy is never used."""
    dataset_id, file_length = stored_dataset_id(store)
    path = copies / f"{dataset_id}{COPY_SUFFIX}"
    if refresh or not path.exists() or path.stat().st_size != file_length:
        data = store.read(fmt.INDEX_NAME, 0, file_length)
        copies.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        temporary.write_bytes(data)
        os.replace(temporary, path)
        log.info("copied %s (%d bytes) to %s", source, len(data), path)
    with open(path, "rb") as f:
        return sealed_copy(f.fileno(), path.name)
