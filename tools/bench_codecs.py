#!/usr/bin/env python3
"""Which JPEG codec ``--transform resize`` should use: each candidate resizes the same JPEGs to a
short side of SHORT on one core, the way ``dlfs.pack.images.resize`` does (DCT-scaled decode,
bicubic resize, quality-90 baseline 4:2:0 encode), and the images/s and output bytes are printed
side by side.

Each candidate runs in a fresh process. ``Pillow`` and ``Pillow-SIMD`` run ``images.resize``
itself, the latter from ``make install``'s codec folder (``images.use_fastest_codec``).
simplejpeg and PyTurboJPEG, when installed, decode and encode with their own libjpeg-turbo and
resize with Pillow-SIMD where it exists (neither resizes).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from dlfs.pack import images

QUALITY = 90
CODECS = ("Pillow", "Pillow-SIMD", "simplejpeg", "PyTurboJPEG")


def _resize(pixels: np.ndarray, short: int) -> np.ndarray:
    from PIL import Image

    image = Image.fromarray(pixels)
    size = images.target_size(*image.size, short)
    return np.asarray(image.resize(size, Image.Resampling.BICUBIC, reducing_gap=images.REDUCING_GAP))


def _gap(width: int, height: int, short: int) -> tuple[int, int]:
    target = images.target_size(width, height, short)
    return int(target[0] * images.REDUCING_GAP), int(target[1] * images.REDUCING_GAP)


def _simplejpeg() -> Callable[[bytes, int], bytes]:
    import simplejpeg

    def run(data: bytes, short: int) -> bytes:
        width, height, _, _ = simplejpeg.decode_jpeg_header(data)
        low_width, low_height = _gap(width, height, short)
        pixels = simplejpeg.decode_jpeg(data, "RGB", min_width=low_width, min_height=low_height)
        return simplejpeg.encode_jpeg(_resize(pixels, short), QUALITY, "RGB", "420")

    return run


def _turbojpeg() -> Callable[[bytes, int], bytes]:
    from turbojpeg import TJPF_RGB, TJSAMP_420, TurboJPEG

    jpeg = TurboJPEG()
    factors = sorted(jpeg.scaling_factors, key=lambda f: f[0] / f[1])

    def run(data: bytes, short: int) -> bytes:
        width, height, _, _ = jpeg.decode_header(data)
        low_width, low_height = _gap(width, height, short)
        fits = (
            f for f in factors if width * f[0] // f[1] >= low_width and height * f[0] // f[1] >= low_height
        )
        factor = next(fits, (1, 1))
        pixels = jpeg.decode(data, pixel_format=TJPF_RGB, scaling_factor=factor)
        resized = np.ascontiguousarray(_resize(pixels, short))
        return jpeg.encode(resized, quality=QUALITY, pixel_format=TJPF_RGB, jpeg_subsample=TJSAMP_420)

    return run


def _pillow(data: bytes, short: int) -> bytes:
    out = images.resize(data, short, QUALITY)
    return out if isinstance(out, bytes) else data


def _measure(codec: str, files: list[bytes], short: int, repeat: int) -> dict[str, object] | None:
    """One candidate, in its own process (so Pillow-SIMD can be the ``PIL`` it loads)."""
    if codec != "Pillow":
        images.use_fastest_codec()
    if codec == "Pillow-SIMD" and "SIMD" not in images.codec_version():
        return None
    try:
        run = {"simplejpeg": _simplejpeg, "PyTurboJPEG": _turbojpeg}.get(codec, lambda: _pillow)()
    except (ImportError, OSError, RuntimeError):  # not installed, or no usable libturbojpeg
        return None
    for data in files[:5]:
        run(data, short)  # warm up: libraries load, caches fill
    times, out_bytes = [], 0
    for _ in range(repeat):
        started = time.perf_counter()
        out_bytes = sum(len(run(data, short)) for data in files)
        times.append(time.perf_counter() - started)
    return {
        "codec": codec,
        "version": images.codec_version(),
        "images_per_s": len(files) / float(np.median(times)),
        "bytes_out": out_bytes,
    }


def measure(files: list[bytes], short: int, repeat: int) -> list[dict[str, object]]:
    results = []
    spawn = multiprocessing.get_context("spawn")
    for codec in CODECS:
        with spawn.Pool(1) as pool:
            found = pool.apply(_measure, (codec, files, short, repeat))
        if found is not None:
            results.append(found)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "tree", type=Path, help="a folder of JPEGs (e.g. make_imagenet_like.py --payload photo)"
    )
    parser.add_argument("--short", type=int, default=256)
    parser.add_argument("--files", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=3, help="runs per codec; the median is kept")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    paths = sorted(p for p in args.tree.rglob("*") if p.is_file())[: args.files]
    files = [p.read_bytes() for p in paths]
    results = measure(files, args.short, args.repeat)
    if args.json:
        print(
            json.dumps({"files": len(files), "bytes_in": sum(map(len, files)), "results": results}, indent=2)
        )
        return
    print(f"{len(files)} JPEGs, {sum(map(len, files)) / 1e6:.1f} MB, resized to short side {args.short}:")
    for row in results:
        print(
            f"  {row['codec']:<12} {row['images_per_s']:6.0f} images/s  {row['bytes_out'] / 1e6:6.1f} MB out"
            f"  ({row['version']})"
        )


if __name__ == "__main__":
    main()
