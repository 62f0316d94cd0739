#!/usr/bin/env python3
"""Generate an ImageNet-shaped tree: class folders ``nXXXXXXXX/nXXXXXXXX_K.JPEG``, seeded.

Sizes follow ImageNet-train's distribution (lognormal, median ~95 KB, mean ~110 KB, a tail to
several MB). Payloads are random bytes (which compress like JPEGs do: not at all), real decodable
JPEGs of about that size (``--payload jpeg``, for loaders that decode), or a few bytes
(``--payload tiny``) for metadata-scale runs (1.28 M files in a few minutes).
"""

from __future__ import annotations

import argparse
import io
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

MEDIAN = 95_000
MEAN = 110_000
MAX_SIZE = 8 << 20
#: JPEG bytes per pixel of RGB noise at quality 90 (measured), to size real JPEGs.
BYTES_PER_PIXEL = 0.92
PAYLOADS = ("random", "jpeg", "tiny")


def class_names(count: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    ids = rng.choice(10**8, size=count, replace=False)
    return [f"n{int(i):08d}" for i in sorted(ids)]


def file_sizes(rng: np.random.Generator, count: int, tiny: bool) -> np.ndarray:
    if tiny:
        return rng.integers(1, 64, size=count)
    sigma = math.sqrt(2 * math.log(MEAN / MEDIAN))
    return np.clip(rng.lognormal(math.log(MEDIAN), sigma, size=count), 512, MAX_SIZE).astype(np.int64)


def jpeg_of_about(rng: np.random.Generator, size: int) -> bytes:
    """A real, decodable JPEG of roughly ``size`` bytes: noise at quality 90 costs ~BYTES_PER_PIXEL."""
    from PIL import Image

    side = max(8, int(math.sqrt(size / BYTES_PER_PIXEL)))
    pixels = rng.integers(0, 256, size=(side, side, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def _write_class(job: tuple[str, str, int, int, str, int]) -> int:
    root, name, first, count, payload, seed = job
    rng = np.random.default_rng([seed, first])
    folder = Path(root) / name
    folder.mkdir(parents=True, exist_ok=True)
    sizes = file_sizes(rng, count, payload == "tiny")
    blob = rng.bytes(int(sizes.max()) + 4096)
    written = 0
    for k, size in enumerate(sizes.tolist()):
        if payload == "jpeg":
            data = jpeg_of_about(rng, size)
        else:
            start = int(rng.integers(0, 4096))
            data = blob[start : start + size]
        with open(folder / f"{name}_{first + k}.JPEG", "wb") as f:
            f.write(data)
        written += len(data)
    return written


def generate(root: Path, classes: int, files: int, payload: str, seed: int, jobs: int) -> int:
    """Write ``files`` files spread evenly over ``classes`` folders; return the bytes written."""
    names = class_names(classes, seed)
    per_class = [files // classes + (1 if k < files % classes else 0) for k in range(classes)]
    jobs_list = []
    for k, (name, count) in enumerate(zip(names, per_class, strict=True)):
        jobs_list.append((str(root), name, k * 10_000_000, count, payload, seed))
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return sum(pool.map(_write_class, jobs_list, chunksize=4))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("root", type=Path)
    parser.add_argument("--files", type=int, default=2000, help="total files (default 2000)")
    parser.add_argument("--classes", type=int, default=20, help="class folders (default 20)")
    parser.add_argument(
        "--payload",
        choices=PAYLOADS,
        default="random",
        help="random bytes (fast), real JPEGs (decodable, slower to make), or tiny "
        "payloads of a few bytes for metadata-scale runs (default random)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args()
    started = time.monotonic()
    total = generate(args.root, args.classes, args.files, args.payload, args.seed, args.jobs)
    print(
        f"wrote {args.files} files in {args.classes} classes, {total / 1e6:.1f} MB, "
        f"to {args.root} in {time.monotonic() - started:.1f} s"
    )


if __name__ == "__main__":
    main()
