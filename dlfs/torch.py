"""``ShuffleSampler``: make an unmodified ``ImageFolder`` + ``DataLoader`` read in the mount's order.

The one-line change in a training script::

    loader = DataLoader(dataset, batch_size=256, sampler=dlfs.torch.ShuffleSampler(dataset), ...)
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)

The sampler finds the dlfs mount above ``dataset.root`` and tells it which of its files the dataset
holds (``dlfs.core.fileset``: a dataset rooted at ``train/`` leaves ``val/`` out, its extension
filter skips stray files). The mount then publishes the order over exactly those files in
``.dlfs/order/epoch-E.rank-R-of-W.seed-S.set-DIGEST``; reading it tells the daemon's read-ahead to
follow this epoch and rank, and each published path maps to a dataset index through
``dataset.samples``, so any ImageFolder-like dataset works without changes.

Distributed training follows ``DistributedSampler``: ``num_replicas``/``rank`` default from
``torch.distributed``, every rank gets ``ceil(N / W)`` samples (padded by wrapping) or, with
``drop_last``, ``floor(N / W)``, and ``seed`` defaults to the mount's ``--seed``. When
``torch.distributed`` is initialised, the ranks compare what defines their order (dataset, file set,
seed, mode, world size) when the sampler is made, which every rank must do: one node mounted with
another seed would otherwise read half the samples twice and never the rest.

Only this module imports torch (the ``torch`` extra); the rest of dlfs never needs it.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch.distributed as dist
from torch.utils.data import Sampler

from dlfs.core.errors import DlfsError
from dlfs.core.fileset import FileSet
from dlfs.core.protocol import (
    CONFIG_NAME,
    FILES_NAME,
    MAX_SEED,
    SET_NAME,
    OrderKey,
    control_path,
    is_dlfs_mount,
    order_path,
    parse_order,
)


class NotOnDlfsError(DlfsError):
    """The dataset's files are not served by a dlfs mount."""


class OrderMismatchError(DlfsError):
    """The ranks of one job would build different orders, so their shares would overlap."""


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


def _mount_positions(mount: Path, index_of: dict[str, int], samples: int) -> np.ndarray:
    """The sorted positions in the mount's ``.dlfs/files`` (the list the order indexes) of the
    dataset's samples (``index_of``: relative path -> index; ``samples``: how many it holds).

    One pass over the listing with the dataset's own dict: at 1.28 M files a second dict of the
    listing and a sort of its positions cost several times as much."""
    if len(index_of) != samples:
        raise ValueError("the dataset lists a file twice; ShuffleSampler needs each sample once")
    listed = parse_order(control_path(mount, FILES_NAME).read_bytes())
    held = np.fromiter(map(index_of.get, listed, itertools.repeat(-1)), np.int64, len(listed)) >= 0
    positions = np.flatnonzero(held)
    if positions.size != samples:
        missing = sorted(set(index_of).difference(listed))
        raise NotOnDlfsError(
            f"{missing[0]} (and {len(missing) - 1} other samples) is not a file of the dlfs mount at "
            f"{mount}; point the dataset at files of the mount, not links out of it"
        )
    return positions


class ShuffleSampler(Sampler[int]):
    """Yields dataset indices in the order the mount published for this epoch and rank, over
    exactly the dataset's samples.

    ``seed``: the order's seed, the mount's ``--seed`` when None. ``drop_last``: like
    ``DistributedSampler``'s, ``floor(N / W)`` samples per rank instead of padding to ``ceil``.
    """

    def __init__(
        self,
        dataset: Any,
        num_replicas: int | None = None,
        rank: int | None = None,
        seed: int | None = None,
        drop_last: bool = False,
    ) -> None:
        if not hasattr(dataset, "root") or not hasattr(dataset, "samples"):
            raise TypeError("ShuffleSampler needs an ImageFolder-like dataset with .root and .samples")
        distributed = dist.is_available() and dist.is_initialized()
        if num_replicas is None:
            num_replicas = dist.get_world_size() if distributed else 1
        if rank is None:
            rank = dist.get_rank() if distributed else 0
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in a world of {num_replicas}")
        self.mount = find_mount(dataset.root)
        self.config = json.loads(control_path(self.mount, CONFIG_NAME).read_bytes())
        self.seed = int(self.config["seed"]) if seed is None else seed
        if not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"seed {self.seed} is not in 0..{MAX_SEED}")
        self.num_replicas = num_replicas
        self.rank = rank
        self.drop_last = drop_last
        self.epoch = 0
        self._index_of = _relative_sample_paths(dataset, self.mount)
        self.fileset = FileSet(_mount_positions(self.mount, self._index_of, len(dataset.samples)))
        self.digest = self.fileset.digest
        self._announce()
        if distributed and num_replicas == dist.get_world_size():
            _agree(self._terms(), rank, self.mount)
        self._cached: tuple[int, list[int]] | None = None

    def _terms(self) -> dict[str, object]:
        """What defines the order: every rank of a job must hold the same."""
        mode = self.config["mode"]
        if mode == "block":
            mode = f"block (block {self.config['block']}, window {self.config['window']})"
        return {
            "dataset id": self.config["dataset_id"],
            "file set": f"{self.fileset.positions.size} files, digest {self.digest}",
            "seed": self.seed,
            "order mode": mode,
            "world size": self.num_replicas,
            "drop_last": self.drop_last,
        }

    def _announce(self) -> None:
        """Hand the dataset's file set to the mount (``dlfs.core.fileset``): one lookup per chunk
        of its description, then check that the set resolves."""
        for name in self.fileset.announcements():
            control_path(self.mount, SET_NAME, name).exists()
        if not control_path(self.mount, SET_NAME, self.digest).exists():
            raise DlfsError(
                f"the dlfs mount at {self.mount} did not take the dataset's file list; "
                "is it an older dlfs? Mount the dataset with this version of dlfs"
            )

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def order_path(self) -> Path:
        key = OrderKey(self.epoch, self.num_replicas, self.rank, self.seed, self.drop_last, self.digest)
        return order_path(self.mount, key)

    def _published(self) -> list[str]:
        """This epoch's published paths. A mount that no longer knows the set (it keeps a few, and
        may have been mounted again) is told it again."""
        try:
            text = self.order_path().read_bytes()
        except FileNotFoundError:
            self._announce()
            text = self.order_path().read_bytes()
        return parse_order(text)

    def indices(self) -> list[int]:
        """This epoch's dataset indices, in order."""
        if self._cached is None or self._cached[0] != self.epoch:
            index_of = self._index_of
            try:
                self._cached = (self.epoch, [index_of[path] for path in self._published()])
            except KeyError as exc:
                raise DlfsError(
                    f"the mount at {self.mount} published {exc}, which the dataset does not hold"
                ) from exc
        return self._cached[1]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices())

    def __len__(self) -> int:
        count = int(self.fileset.positions.size)
        return count // self.num_replicas if self.drop_last else -(-count // self.num_replicas)


def _agree(terms: dict[str, object], share: int, mount: Path) -> None:
    """Compare ``terms`` across the processes of ``torch.distributed``'s default group, and check
    that each reads its own share; every process raises the same ``OrderMismatchError`` when any
    of them differs, naming it and the ranks.

    Only samplers that span the whole group compare (``num_replicas`` is its size): one made for a
    single process (a validation pass on rank 0) would wait for the others forever."""
    mine = {"terms": terms, "share": share, "where": f"{socket.gethostname()}:{mount}"}
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    first = everyone[0]
    problems = []
    shares = [got["share"] for got in everyone]
    for repeated in sorted({k for k in shares if shares.count(k) > 1}):
        ranks = [str(rank) for rank, k in enumerate(shares) if k == repeated]
        problems.append(f"ranks {', '.join(ranks)} all read share {repeated} (rank= given twice)")
    for name, value in first["terms"].items():
        others = [(rank, got["terms"][name], got["where"]) for rank, got in enumerate(everyone)]
        differing = [f"{other!r} on rank {rank} ({where})" for rank, other, where in others if other != value]
        if differing:
            problems.append(f"{name} is {value!r} on rank 0 ({first['where']}) but {', '.join(differing)}")
    if problems:
        raise OrderMismatchError(
            "ShuffleSampler: the ranks would read overlapping shares: "
            + "; ".join(problems)
            + ". Give every rank the same dataset and seed= (or mount every node with the same --seed"
            " and --order)"
        )
