"""``dlfs pack --transform``: the spec, the resize function, and a transformed dataset end to end
(packed, mounted, read by ImageFolder's loader, verified, described)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from commands import assert_one_line_error, dlfs
from PIL import Image, JpegImagePlugin

from dlfs.core import format as fmt
from dlfs.core.errors import PackError
from dlfs.core.index import Index
from dlfs.core.store.local import LocalStore
from dlfs.pack import images
from dlfs.pack.images import Kept
from dlfs.pack.transform import parse


def jpeg(width: int, height: int, mode: str = "RGB", **save: object) -> bytes:
    """A JPEG with structure (a gradient and a square), so a resize has something to keep."""
    ramp = np.linspace(0, 255, width, dtype=np.float32)[None, :] + np.linspace(0, 64, height)[:, None]
    pixels = np.repeat(ramp[:, :, None], 3, axis=2).astype(np.uint8)
    pixels[height // 4 : height // 2, width // 4 : width // 2] = (200, 30, 60)
    out = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(out, "JPEG", quality=95, **save)
    return out.getvalue()


def opened(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


@pytest.mark.parametrize(
    ("spec", "canonical"),
    [("resize:256", "resize:256,quality=90"), ("resize:300,quality=75", "resize:300,quality=75")],
)
def test_spec_is_parsed_and_spelled_canonically(spec: str, canonical: str) -> None:
    assert parse(spec).spec == canonical
    assert parse(canonical) == parse(spec)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("blur:3", "unknown transform 'blur'"),
        ("resize", "whole number for short"),
        ("resize:big", "whole number for short"),
        ("resize:0", "short must be 1..65536"),
        ("resize:256,quality=0", "quality must be 1..100"),
        ("resize:256,q=80", "bad transform parameter 'q=80'"),
        ("resize:256,quality=80,quality=70", "bad transform parameter"),
    ],
)
def test_bad_specs_are_refused_with_the_usage(spec: str, message: str) -> None:
    with pytest.raises(PackError, match=message):
        parse(spec)


@pytest.mark.parametrize(("width", "height"), [(1200, 800), (600, 900), (257, 1000)])
def test_resize_scales_the_short_side_down_and_keeps_the_aspect(width: int, height: int) -> None:
    out = images.resize(jpeg(width, height), 256, 90)
    assert isinstance(out, bytes)
    image = opened(out)
    assert min(image.size) == 256
    scale = 256 / min(width, height)
    assert image.size == (round(width * scale), round(height * scale))
    assert image.mode == "RGB"
    assert not image.info.get("progressive") and not image.info.get("progression")
    assert JpegImagePlugin.get_sampling(image) == 2, "4:2:0, the layout that decodes fastest"
    # The content survives: the red square is where it was, in proportion.
    x, y = image.size[0] * 3 // 8, image.size[1] * 3 // 8
    red, green, _ = image.getpixel((x, y))
    assert red > 150 and green < 90


def test_resize_keeps_mode_exif_and_icc_profile() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: a loader that honours it must still turn the image
    icc = b"\x00" * 128 + b"fake profile"
    for mode in ("L", "CMYK", "RGB"):
        out = images.resize(jpeg(800, 600, mode, exif=exif.tobytes(), icc_profile=icc), 256, 90)
        assert isinstance(out, bytes)
        image = opened(out)
        assert image.mode == mode and image.size == (341, 256)
        assert image.getexif()[0x0112] == 6
        assert image.info["icc_profile"] == icc


def test_resize_keeps_what_it_should_not_touch() -> None:
    assert images.resize(jpeg(400, 256), 256, 90) is Kept.FITS
    assert images.resize(jpeg(200, 100), 256, 90) is Kept.FITS
    png = io.BytesIO()
    Image.new("RGB", (900, 900)).save(png, "PNG")
    assert images.resize(png.getvalue(), 256, 90) is Kept.NOT_AN_IMAGE
    assert images.resize(b"plain text", 256, 90) is Kept.NOT_AN_IMAGE
    assert images.resize(b"", 256, 90) is Kept.NOT_AN_IMAGE
    assert images.resize(jpeg(900, 900)[:2000], 256, 90) is Kept.NOT_AN_IMAGE, "truncated"


def test_quality_sets_the_encoder() -> None:
    photo = jpeg(1000, 800)
    low, high = images.resize(photo, 256, 40), images.resize(photo, 256, 98)
    assert isinstance(low, bytes) and isinstance(high, bytes)
    assert len(low) < len(high)


@pytest.fixture
def photo_tree(tmp_path: Path) -> dict[str, bytes]:
    files = {
        "cat/big.jpg": jpeg(1200, 900),
        "cat/tall.JPEG": jpeg(500, 1500, "L"),
        "cat/small.jpg": jpeg(300, 200),
        "dog/broken.jpg": jpeg(900, 900)[:3000],
        "dog/drawing.png": b"\x89PNG\r\n\x1a\n" + os.urandom(5000),
        "dog/notes.txt": b"not an image\n",
        "dog/empty.jpg": b"",
    }
    for name, data in files.items():
        path = tmp_path / "src" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def test_transformed_dataset_mounts_verifies_and_says_what_it_holds(
    tmp_path: Path, photo_tree: dict[str, bytes], mount: Callable[..., object]
) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    result = dlfs("pack", src, dst, "--transform", "resize:256,quality=85", "--json")
    summary = json.loads(result.stdout)
    assert summary["transform"] == "resize:256,quality=85"
    assert summary["codec"].startswith(("Pillow ", "Pillow-SIMD "))
    assert summary["transformed_files"] == 2
    assert summary["kept_files"] == {"fits": 1, "not_an_image": 4}
    assert summary["source_bytes"] == sum(map(len, photo_tree.values()))
    assert summary["bytes"] < summary["source_bytes"]

    store = LocalStore(dst)
    index = Index.load(store)
    store.close()
    described = index.meta["transform"]
    assert described["params"] == {"short": 256, "quality": 85} and described["codec"] == summary["codec"]
    assert index.meta["build"]["transform"] == "resize:256,quality=85"
    assert index.transform.startswith("resize:256,quality=85 (") and index.transform.endswith("2 of 7 files")

    with mount(dst) as mnt:
        for name, data in photo_tree.items():
            served = (mnt / name).read_bytes()
            assert (mnt / name).stat().st_size == len(served)
            if name in ("cat/big.jpg", "cat/tall.JPEG"):
                image = opened(served)
                assert min(image.size) == 256 and image.mode == opened(data).mode
                row = index.resolve(name.encode())
                assert row is not None and index.flags[row] & fmt.FLAG_TRANSFORMED
            else:
                assert served == data, f"{name} is stored unchanged"
        config = json.loads((mnt / ".dlfs" / "config").read_text())
        assert config["transform"] == described

    verified = dlfs("verify", dst)
    assert verified.stdout.startswith("OK: checked 7 files") and "resize:256,quality=85" in verified.stdout
    info = json.loads(dlfs("info", dst, "--json").stdout)
    assert info["transform"] == index.transform
    listing = dlfs("ls", "-l", dst, "cat").stdout.splitlines()
    assert listing[0].startswith("transform: resize:256,quality=85") and len(listing) == 4


def test_plain_pack_records_no_transform(tmp_path: Path, photo_tree: dict[str, bytes]) -> None:
    dlfs("pack", tmp_path / "src", tmp_path / "dst")
    info = json.loads(dlfs("info", tmp_path / "dst", "--json").stdout)
    assert info["transform"] == "none" and info["build"]["transform"] == "none"
    assert not dlfs("ls", "-l", tmp_path / "dst").stdout.startswith("transform")


def test_bad_transform_is_one_line_before_anything_is_written(
    tmp_path: Path, photo_tree: dict[str, bytes]
) -> None:
    result = dlfs("pack", tmp_path / "src", tmp_path / "dst", "--transform", "resize:wide", check=False)
    assert_one_line_error(result, "whole number for short")
    assert not (tmp_path / "dst").exists()


def test_a_transformed_pack_goes_into_a_bucket_too(
    tmp_path: Path, photo_tree: dict[str, bytes], s3: str
) -> None:
    """Into ``s3://``, the transformed bytes stream up like any others and say what they are."""
    summary = json.loads(dlfs("pack", tmp_path / "src", s3, "--transform", "resize:256", "--json").stdout)
    assert summary["transformed_files"] == 2
    info = json.loads(dlfs("info", s3, "--json").stdout)
    assert info["transform"].startswith("resize:256,quality=90 (") and info["bytes"] == summary["bytes"]
    assert "resize:256,quality=90" in dlfs("verify", s3).stdout


def test_a_script_that_imports_pil_itself_can_pack_with_a_transform(
    tmp_path: Path, photo_tree: dict[str, bytes]
) -> None:
    """Spawned workers re-import the calling script: with PIL loaded by it they keep its Pillow."""
    script = tmp_path / "train.py"
    script.write_text(
        "from PIL import Image\n"
        "from dlfs.pack import PackOptions, pack\n"
        "from dlfs.pack.transform import parse\n"
        "if __name__ == '__main__':\n"
        f"    s = pack({str(tmp_path / 'src')!r}, {str(tmp_path / 'dst')!r},\n"
        "             PackOptions(transform=parse('resize:256'), progress=False))\n"
        "    print(s.transformed_files, s.codec)\n"
    )
    done = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.startswith("2 Pillow")
