"""Image transforms for ``dlfs pack --transform``, and the JPEG codec they run on.

The codec is Pillow-SIMD where ``make install`` built it into ``CODEC_DIR``, else Pillow. Resizing
photo-like JPEGs of ImageNet's dimensions to a short side of 256 on one core
(``tools/bench_codecs.py``, 300 photos, two runs): Pillow-SIMD 515-528 images/s, Pillow 262-268,
simplejpeg (decode and encode) around Pillow-SIMD's resize 446-518, PyTurboJPEG the same way
265-302. The resize is the difference: 2.2 ms per photo in Pillow, 0.5-0.6 ms in Pillow-SIMD, whose
AVX2 convolutions Pillow does not have. Pillow-SIMD installs as ``PIL`` and torchvision needs
Pillow itself, so it lives in a folder of its own that only the pack's worker processes put first
on their path (``use_fastest_codec``), before anything imports ``PIL``.
"""

from __future__ import annotations

import enum
import io
import sys
from pathlib import Path

#: Where ``make install`` puts Pillow-SIMD (``pip install --target``), away from torchvision's Pillow.
CODEC_DIR = Path(sys.prefix) / "dlfs-codecs"
JPEG_MAGIC = b"\xff\xd8\xff"
#: Decode at the smallest DCT scale, and box-reduce, no further than this many times the target
#: before the final resampling: Pillow's documented point where the result cannot be told from a
#: full-resolution resample in most cases.
REDUCING_GAP = 3.0


class Kept(enum.Enum):
    """Why a transform stored a file's bytes unchanged."""

    #: Already within the transform's bounds.
    FITS = "fits"
    #: Not an image the transform takes, or one that does not decode.
    NOT_AN_IMAGE = "not_an_image"
    #: Past the size the pack reads whole (``format.WHOLE_PAYLOAD_LIMIT``): streamed as it is.
    TOO_LARGE = "too_large"


def use_fastest_codec() -> None:
    """Put Pillow-SIMD first on this process's path, if it was built and nothing has loaded
    ``PIL`` yet. A spawned worker re-imports the calling script first, so a script that imports
    PIL itself (a notebook using torchvision) keeps the Pillow it loaded: slower, not wrong."""
    if "PIL" in sys.modules:
        return
    if (CODEC_DIR / "PIL").is_dir():
        sys.path.insert(0, str(CODEC_DIR))


def codec_version() -> str:
    """The codec this process runs: ``Pillow-SIMD 12.1.1.post0, libjpeg-turbo 2.1.5``."""
    from PIL import Image, features

    name = "Pillow-SIMD" if ".post" in Image.__version__ else "Pillow"
    turbo = features.version("libjpeg_turbo")
    return f"{name} {Image.__version__}" + (f", libjpeg-turbo {turbo}" if turbo else "")


def target_size(width: int, height: int, short: int) -> tuple[int, int]:
    """The size with a short side of ``short`` and the aspect of ``width`` x ``height``."""
    scale = short / min(width, height)
    return max(1, round(width * scale)), max(1, round(height * scale))


def resize(data: bytes, short: int, quality: int) -> bytes | Kept:
    """A JPEG whose short side exceeds ``short``, scaled down to it (aspect kept, bicubic after a
    DCT-domain reduction) and encoded as a baseline JPEG of ``quality``, 4:2:0: the layout that
    decodes fastest. The image mode, EXIF (orientation included) and ICC profile are kept, so a
    loader sees what it saw before, smaller."""
    if not data.startswith(JPEG_MAGIC):
        return Kept.NOT_AN_IMAGE
    from PIL import Image

    try:
        image = Image.open(io.BytesIO(data))
        width, height = image.size
        if min(width, height) <= short:
            return Kept.FITS
        size = target_size(width, height, short)
        info = dict(image.info)
        image.draft(None, (int(size[0] * REDUCING_GAP), int(size[1] * REDUCING_GAP)))
        resized = image.resize(size, Image.Resampling.BICUBIC, reducing_gap=REDUCING_GAP)
        options: dict[str, object] = {"quality": quality, "progressive": False}
        if resized.mode in ("RGB", "YCbCr"):
            options["subsampling"] = "4:2:0"
        for key in ("exif", "icc_profile"):
            if info.get(key):
                options[key] = info[key]
        out = io.BytesIO()
        resized.save(out, "JPEG", **options)
        return out.getvalue()
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        # Truncated, corrupt, or past Pillow's decompression-bomb limit: stored as it is.
        return Kept.NOT_AN_IMAGE
