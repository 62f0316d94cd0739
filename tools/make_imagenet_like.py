#!/usr/bin/env python3
"""Generate an ImageNet-shaped tree: class folders ``nXXXXXXXX/nXXXXXXXX_K.JPEG``, seeded.

Sizes follow ImageNet-train's distribution (lognormal, median ~95 KB, mean ~110 KB, a tail to
several MB). Payloads are random bytes (which compress like JPEGs do: not at all), real decodable
JPEGs of about that size (``--payload jpeg``, for loaders that decode), a few bytes
(``--payload tiny``) for metadata-scale runs (1.28 M files in a few minutes), or photo-like JPEGs
of ImageNet's dimensions (``--payload photo``, for decode and resize costs; see ``photo_size``).
"""

from __future__ import annotations

import argparse
import io
import math
import os
import shutil
import subprocess
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

MEDIAN = 95_000
MEAN = 110_000
MAX_SIZE = 8 << 20
#: JPEG bytes per pixel of RGB noise at quality 90 (measured), to size real JPEGs.
BYTES_PER_PIXEL = 0.92
PAYLOADS = ("random", "jpeg", "tiny", "photo")
#: Photo-like images: the share with a short side past 500 px (ImageNet-train's tail of large
#: photos), and the range of that tail.
LARGE_SHARE = 0.06
LARGE_SHORT = (500, 1600)
ASPECTS = (1.0, 4 / 3, 4 / 3, 4 / 3, 3 / 2, 16 / 9)


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


def photo_size(rng: np.random.Generator) -> tuple[int, int]:
    """(width, height) shaped like ImageNet-train's photos: short side 300-500 px for most, a
    log-uniform tail to 1600 px, aspect 1:1 to 16:9, landscape three times in four."""
    if rng.random() < LARGE_SHARE:
        low, high = LARGE_SHORT
        short = int(np.exp(rng.uniform(np.log(low), np.log(high))))
    else:
        short = int(rng.integers(300, 501))
    long = int(short * ASPECTS[int(rng.integers(len(ASPECTS)))])
    return (long, short) if rng.random() < 0.75 else (short, long)


def photo(rng: np.random.Generator) -> bytes:
    """A JPEG (quality 90) that costs what a photo costs to decode: smooth colour fields, shapes
    with edges, and grain, at ~0.5 bytes per pixel (ImageNet: ~110 KB for ~400x500); a 500x375
    one decodes in ~1.2 ms here, as ImageNet's do (700-800 images/s per core)."""
    from PIL import Image, ImageDraw, ImageFilter

    width, height = photo_size(rng)
    fields = rng.integers(0, 256, size=(int(rng.integers(3, 9)), int(rng.integers(3, 9)), 3), dtype=np.uint8)
    image = Image.fromarray(fields).resize((width, height), Image.Resampling.BICUBIC)
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(5, 25))):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        box = (
            x0,
            y0,
            x0 + int(rng.integers(10, width // 2 + 11)),
            y0 + int(rng.integers(10, height // 2 + 11)),
        )
        fill = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=fill)
    image = image.filter(ImageFilter.GaussianBlur(1.2))
    grain = rng.standard_normal((height, width, 1), dtype=np.float32) * 16
    grain = grain + rng.standard_normal((height, width, 3), dtype=np.float32) * 6
    pixels = np.clip(np.asarray(image, dtype=np.float32) + grain, 0, 255).astype(np.uint8)
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
        if payload == "photo":
            data = photo(rng)
        elif payload == "jpeg":
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


def train_tar(root: Path, out: Path) -> Path:
    """ImageNet's train tar of the tree at ``root``: a tar of one tar per class folder
    (``nXXXXXXXX.tar`` of flat JPEGs), as ``ILSVRC2012_img_train.tar`` is laid out."""
    classes = out.with_name(f".{out.name}.classes")
    shutil.rmtree(classes, ignore_errors=True)
    classes.mkdir()
    try:
        for folder in sorted(root.iterdir()):
            subprocess.run(["tar", "-cf", classes / f"{folder.name}.tar", "-C", folder, "."], check=True)
        subprocess.run(["tar", "-cf", out, "-C", classes, "."], check=True)
    finally:
        shutil.rmtree(classes)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("root", type=Path)
    parser.add_argument("--files", type=int, default=2000, help="total files (default 2000)")
    parser.add_argument("--classes", type=int, default=20, help="class folders (default 20)")
    parser.add_argument(
        "--payload",
        choices=PAYLOADS,
        default="random",
        help="random bytes (fast), real JPEGs (decodable, slower to make), tiny "
        "payloads of a few bytes for metadata-scale runs, or photo-like JPEGs of ImageNet's "
        "dimensions (default random)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument(
        "--train-tar",
        type=Path,
        metavar="OUT",
        help="also write ImageNet's train tar of the tree: a tar of class tars",
    )
    args = parser.parse_args()
    started = time.monotonic()
    total = generate(args.root, args.classes, args.files, args.payload, args.seed, args.jobs)
    if args.train_tar:
        train_tar(args.root, args.train_tar)
    print(
        f"wrote {args.files} files in {args.classes} classes, {total / 1e6:.1f} MB, "
        f"to {args.root} in {time.monotonic() - started:.1f} s"
    )


if __name__ == "__main__":
    main()
