"""Roots: the trees a benchmark runs on, and what a dlfs root among them offers.

A root is any directory that presents a dataset tree: the native source, a dlfs mount, a squashfuse
or ratarmount mount. A dlfs root also publishes each epoch's order (reading it arms its read-ahead)
and may still be listing folders in the background after a scan.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dlfs.bench.errors import BenchError
from dlfs.core.protocol import is_dlfs_mount, order_path, parse_order

#: How long a run waits for a dlfs root to finish listing in the background (1.28 M files: ~6 s).
IDLE_TIMEOUT = 600.0


@dataclass(frozen=True)
class Root:
    label: str
    path: str

    @classmethod
    def parse(cls, text: str) -> Root:
        """``PATH`` or ``LABEL=PATH``; an unlabelled root is named after its filesystem type."""
        label, sep, path = text.partition("=")
        if not sep:
            label, path = "", text
        if not os.path.isdir(path):
            raise BenchError(f"{path}: not a directory; give a dataset tree or a mounted dataset")
        return cls(label or _fstype_label(path), path)


def _fstype_label(path: str) -> str:
    from dlfs.fuse.mount import mounted_fstype

    fstype = mounted_fstype(path)
    if fstype is None:
        return "native"
    return fstype.removeprefix("fuse.").removeprefix("fuseblk.")


def order_file(root: Root, epoch: int) -> Path:
    """Where a dlfs root publishes epoch ``epoch``'s order; reading it arms the read-ahead."""
    return order_path(root.path, epoch)


def first_dlfs(roots: Sequence[Root]) -> Root:
    for root in roots:
        if is_dlfs_mount(root.path):
            return root
    raise BenchError(
        "orderread and orderload need a dlfs mount among the roots: its published order is what is read"
    )


def published_order(roots: Sequence[Root], epoch: int) -> list[str]:
    """Epoch ``epoch``'s order from the first dlfs root; reading it arms that mount's read-ahead."""
    return parse_order(order_file(first_dlfs(roots), epoch).read_bytes())


def wait_idle(root: str, timeout: float = IDLE_TIMEOUT) -> float:
    """Wait until a dlfs mount has no folder left to list in the background; returns the seconds
    waited (0 for any other root).

    After a scan of the whole tree under ``--readdirplus auto`` the daemon lists every folder again
    with attributes, for the read-ahead: work a training job overlaps with its setup, and that the
    next run of a benchmark must not pay for.
    """
    stats = Path(root, ".dlfs", "stats")
    started = time.monotonic()
    if not stats.is_file():
        return 0.0
    while json.loads(stats.read_bytes()).get("listing_folders", 0):
        if time.monotonic() - started > timeout:
            raise BenchError(f"the mount on {root} was still listing folders after {timeout:g} s")
        time.sleep(0.02)
    return time.monotonic() - started
