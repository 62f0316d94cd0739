"""The jobs: what each one walks or reads, item by item, the way a training job does.

- ``scan``: what torchvision's ``ImageFolder`` does at construction (class folders, then a sorted
  walk of each); latency is per class folder.
- ``readdir``: list every directory with ``os.scandir`` (names only, like ``find``); per directory.
- ``stat``: ``os.stat`` every file.
- ``seqread`` / ``randread`` / ``orderread``: read every file whole, in tree order / a seeded random
  order / the published order of a dlfs root among the roots (which also arms its read-ahead). The
  same relative sequence is used on every root, so each reads the same files in the same order.
  These open files unbuffered, as ``dlfs.torch.pil_loader`` does.
- ``shuffleload`` / ``orderload``: what an unmodified training job does, ``DataLoader(shuffle=True)``
  / ``dlfs.torch.ShuffleSampler`` with torchvision's default loader: the seeded random order of
  ``randread`` / the published order, each file read by a buffered ``open(path, 'rb')`` and
  ``read()``. On Python < 3.14 that open asks ``isatty()``, an ioctl every FUSE filesystem
  receives, once per file.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

JOBS = ("scan", "readdir", "stat", "seqread", "randread", "orderread", "shuffleload", "orderload")
READ_JOBS = ("seqread", "randread", "orderread", "shuffleload", "orderload")
#: The jobs that read a dlfs root's published order (and arm its read-ahead).
ORDER_JOBS = ("orderread", "orderload")
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def imagefolder_scan(root: str) -> int:
    """What torchvision's ImageFolder does at construction: find_classes, then make_dataset."""
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    return sum(scan_class(os.path.join(root, name)) for name in classes)


def scan_class(folder: str) -> int:
    """make_dataset for one class: a sorted ``os.walk`` and an extension check, no stat of the files."""
    count = 0
    for parent, _, files in sorted(os.walk(folder, followlinks=True)):
        for name in sorted(files):
            if os.path.join(parent, name).lower().endswith(IMAGE_EXTENSIONS):
                count += 1
    return count


@dataclass(frozen=True)
class Tree:
    """What one root holds, relative to it: class folders, every directory, regular files sorted."""

    classes: list[str]
    directories: list[str]
    files: list[str]

    @classmethod
    def walk(cls, root: str) -> Tree:
        """One untimed walk; a dlfs root's hidden control tree is never part of the dataset."""
        directories, files = [""], []
        stack = [""]
        while stack:
            rel = stack.pop()
            with os.scandir(os.path.join(root, rel)) as entries:
                for entry in entries:
                    path = rel + entry.name
                    if entry.is_dir(follow_symlinks=False):
                        if path != ".dlfs":
                            directories.append(path)
                            stack.append(path + "/")
                    elif entry.is_file():
                        files.append(path)
        classes = sorted(d for d in directories if d and "/" not in d)
        return cls(classes, sorted(directories), sorted(files))


def job_items(job: str, tree: Tree, order: list[str] | None, seed: int) -> list[str]:
    """The sequence a job works through: class folders, directories, or files in the job's order."""
    if job == "scan":
        return tree.classes
    if job == "readdir":
        return tree.directories
    if job in ("stat", "seqread"):
        return tree.files
    if job in ("randread", "shuffleload"):
        rng = np.random.default_rng(seed)
        return [tree.files[i] for i in rng.permutation(len(tree.files))]
    assert order is not None
    return order


def _do_scan(root: str, item: str) -> int:
    scan_class(os.path.join(root, item))
    return 0


def _do_readdir(root: str, item: str) -> int:
    with os.scandir(os.path.join(root, item)) as entries:
        for _ in entries:
            pass
    return 0


def _do_stat(root: str, item: str) -> int:
    os.stat(os.path.join(root, item))
    return 0


def _do_read(root: str, item: str) -> int:
    # Unbuffered, as dlfs.torch.pil_loader reads: Python's buffered open() adds an isatty() ioctl,
    # which costs every FUSE filesystem a round trip per file and says nothing about its storage.
    with open(os.path.join(root, item), "rb", buffering=0) as f:
        return len(f.readall())


def _do_load(root: str, item: str) -> int:
    # torchvision's default loader: a buffered open (which asks isatty() before Python 3.14).
    with open(os.path.join(root, item), "rb") as f:
        return len(f.read())


#: Per job, the work on one item; returns the bytes read.
WORK: dict[str, Callable[[str, str], int]] = {
    "scan": _do_scan,
    "readdir": _do_readdir,
    "stat": _do_stat,
    **dict.fromkeys(("seqread", "randread", "orderread"), _do_read),
    **dict.fromkeys(("shuffleload", "orderload"), _do_load),
}
