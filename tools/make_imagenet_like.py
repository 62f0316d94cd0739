#!/usr/bin/env python3
"""Generate an ImageNet-shaped tree: class folders ``nXXXXXXXX/nXXXXXXXX_K.JPEG``, seeded.

Payloads are random bytes with ImageNet-train's size distribution (lognormal, median ~95 KB, mean
~110 KB, a tail to several MB), which compress like JPEGs do: not at all. ``--tiny`` writes payloads
of a few bytes for metadata-scale runs (1.28 M files in a few minutes).
"""

from __future__ import annotations

import argparse
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

MEDIAN = 95_000
MEAN = 110_000
MAX_SIZE = 8 << 20


def class_names(count: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    ids = rng.choice(10**8, size=count, replace=False)
    return [f"n{int(i):08d}" for i in sorted(ids)]


def file_sizes(rng: np.random.Generator, count: int, tiny: bool) -> np.ndarray:
    if tiny:
        return rng.integers(1, 64, size=count)
    sigma = math.sqrt(2 * math.log(MEAN / MEDIAN))
    return np.clip(rng.lognormal(math.log(MEDIAN), sigma, size=count), 512, MAX_SIZE).astype(np.int64)


def _write_class(job: tuple[str, str, int, int, bool, int]) -> int:
    root, name, first, count, tiny, seed = job
    rng = np.random.default_rng([seed, first])
    folder = Path(root) / name
    folder.mkdir(parents=True, exist_ok=True)
    sizes = file_sizes(rng, count, tiny)
    blob = rng.bytes(int(sizes.max()) + 4096)
    written = 0
    for k, size in enumerate(sizes.tolist()):
        start = int(rng.integers(0, 4096))
        with open(folder / f"{name}_{first + k}.JPEG", "wb") as f:
            f.write(blob[start : start + size])
        written += size
    return written


def generate(root: Path, classes: int, files: int, tiny: bool, seed: int, jobs: int) -> int:
    """Write ``files`` files spread evenly over ``classes`` folders; return the bytes written."""
    names = class_names(classes, seed)
    per_class = [files // classes + (1 if k < files % classes else 0) for k in range(classes)]
    jobs_list = []
    for k, (name, count) in enumerate(zip(names, per_class, strict=True)):
        jobs_list.append((str(root), name, k * 10_000_000, count, tiny, seed))
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return sum(pool.map(_write_class, jobs_list, chunksize=4))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("root", type=Path)
    parser.add_argument("--files", type=int, default=2000, help="total files (default 2000)")
    parser.add_argument("--classes", type=int, default=20, help="class folders (default 20)")
    parser.add_argument("--tiny", action="store_true", help="payloads of a few bytes (metadata-scale runs)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    started = time.monotonic()
    total = generate(args.root, args.classes, args.files, args.tiny, args.seed, args.jobs)
    print(
        f"wrote {args.files} files in {args.classes} classes, {total / 1e6:.1f} MB, "
        f"to {args.root} in {time.monotonic() - started:.1f} s"
    )


if __name__ == "__main__":
    main()
