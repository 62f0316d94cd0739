"""``ShuffleSampler``: make an unmodified ``ImageFolder`` + ``DataLoader`` read in the mount's order.

The one-line change in a training script::

    loader = DataLoader(dataset, batch_size=256, sampler=dlfs.torch.ShuffleSampler(dataset), ...)
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)

The sampler finds the dlfs mount above ``dataset.root``, reads ``.dlfs/order/epoch-E[.rank-R-of-W]``
(resolving it tells the daemon's read-ahead to follow this epoch and rank), and maps each published
path to a dataset index through ``dataset.samples``, so any ImageFolder-like dataset works without
changes. Distributed training: ``num_replicas``/``rank`` default from ``torch.distributed`` when it is
initialised, with DistributedSampler's semantics (equal counts per rank, padded by wrapping).

Only this module imports torch (the ``torch`` extra); the rest of dlfs never needs it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.utils.data import Sampler

from dlfs.core.errors import DlfsError
from dlfs.core.protocol import is_dlfs_mount, order_path, parse_order


class NotOnDlfsError(DlfsError):
    """The dataset's files are not served by a dlfs mount."""


def find_mount(path: str | os.PathLike[str]) -> Path:
    """The dlfs mount that serves ``path``: the nearest ancestor whose ``.dlfs/config`` resolves."""
    start = Path(path).resolve()
    for candidate in (start, *start.parents):
        if is_dlfs_mount(candidate):
            return candidate
    raise NotOnDlfsError(
        f"{path} is not on a dlfs mount; mount the dataset with 'dlfs mount' and point the dataset there"
    )


def _relative_sample_paths(dataset: Any, mount: Path) -> dict[str, int]:
    """Sample path relative to the mount root -> dataset index.

    ImageFolder's sample paths all start with ``dataset.root``; resolving the root once (not each of
    1.28 M paths) keeps this to a string operation per sample.
    """
    root = os.path.join(os.fspath(dataset.root), "")
    inside = os.path.relpath(os.path.realpath(root), mount)
    inside = "" if inside == "." else inside + os.sep
    out = {}
    for k, (path, _) in enumerate(dataset.samples):
        relative = inside + path[len(root) :] if path.startswith(root) else os.path.relpath(path, mount)
        out[relative] = k
    return out


def pil_loader(path: str) -> Any:
    """torchvision's default ``pil_loader``, minus one FUSE round trip per image.

    Python < 3.14's ``open(path, 'rb')`` calls ``isatty()`` to choose line buffering; on a FUSE file
    that ioctl always travels to the daemon and back (the kernel never caches the answer). Opening
    unbuffered skips it; PIL buffers its own reads, so the decoded image is the same. Optional:
    ``ImageFolder(root, loader=dlfs.torch.pil_loader)``.
    """
    from PIL import Image

    with open(path, "rb", buffering=0) as f:
        image = Image.open(f)
        return image.convert("RGB")


class ShuffleSampler(Sampler[int]):
    """Yields dataset indices in the order the mount published for this epoch and rank."""

    def __init__(self, dataset: Any, num_replicas: int | None = None, rank: int | None = None) -> None:
        if not hasattr(dataset, "root") or not hasattr(dataset, "samples"):
            raise TypeError("ShuffleSampler needs an ImageFolder-like dataset with .root and .samples")
        if num_replicas is None:
            num_replicas = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if rank is None:
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in a world of {num_replicas}")
        self.mount = find_mount(dataset.root)
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self._index_of = _relative_sample_paths(dataset, self.mount)
        self._cached: tuple[int, list[int]] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def order_path(self) -> Path:
        return order_path(self.mount, self.epoch, self.num_replicas, self.rank)

    def indices(self) -> list[int]:
        """This epoch's dataset indices, in order; paths the dataset does not hold are skipped."""
        if self._cached is None or self._cached[0] != self.epoch:
            with open(self.order_path(), "rb") as f:
                paths = parse_order(f.read())
            index_of = self._index_of
            self._cached = (self.epoch, [k for k in map(index_of.get, paths) if k is not None])
        return self._cached[1]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices())

    def __len__(self) -> int:
        return len(self.indices())
