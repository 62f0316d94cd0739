#!/usr/bin/env python3
"""Pack-time preprocessing, end to end: what ``dlfs pack --transform resize:256`` saves a training
loop that decodes on the CPU.

On a generated tree of photo-like JPEGs of ImageNet's dimensions (``make_imagenet_like.py
--payload photo``), packs the tree plain and with each ``--spec`` (bytes and seconds), then times
an unmodified ``torchvision.datasets.ImageFolder`` + ``DataLoader`` epoch (``train_imagefolder.py``:
2 workers, ``shuffle=True``, the standard RandomResizedCrop(224) training transform) over the
native tree, the plain mount and each transformed mount. Everything is read once before timing:
the figures are of decoding, not of the disk. Each case runs ``--repeat`` epochs; the median is
kept.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchdoc import DASH, TIMES, Json, print_document, table
from benchlib import DLFS, dlfs_mount, ensure_tree, spread, warm_storage

HERE = Path(__file__).resolve().parent
#: What the JSON keeps of each pack's summary.
PACK_FIGURES = ("bytes", "source_bytes", "seconds", "transformed_files", "kept_files", "codec")


def folder(work: Path, name: str) -> Path:
    """Where the dataset packed as ``name`` (plain, or a transform spec) lives."""
    return work / name.replace(":", "-").replace(",", "-")


def pack(src: Path, dst: Path, *flags: str) -> dict[str, object]:
    done = subprocess.run(
        [*DLFS, "-q", "pack", str(src), str(dst), "--force", "--json", *flags],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)


def epochs(root: Path, args: argparse.Namespace) -> dict[str, object]:
    """``--repeat`` epochs of the training loader over ``root``; images/s of each and their median."""
    command = [sys.executable, str(HERE / "train_imagefolder.py"), str(root), "--json"]
    command += ["--workers", str(args.workers)]
    runs = []
    for epoch in range(args.repeat):
        done = subprocess.run([*command, "--epoch", str(epoch)], capture_output=True, text=True, check=True)
        runs.append(json.loads(done.stdout)["images_per_s"])
        print(f"  {root}: {runs[-1]:.0f} images/s", file=sys.stderr, flush=True)
    return {"images_per_s": spread(runs), "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=6000)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--work", type=Path, default=Path("bench-data/transform"))
    parser.add_argument(
        "--spec", nargs="+", default=["resize:256"], help="transforms to pack and read (default resize:256)"
    )
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers (default 2)")
    parser.add_argument("--repeat", type=int, default=3, help="epochs per case; the median is kept")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    src = args.work / "src"
    ensure_tree(args.work, args.files, args.classes, "photo")
    packs = {"plain": pack(src, folder(args.work, "plain"))}
    for spec in args.spec:
        packs[spec] = pack(src, folder(args.work, spec), "--transform", spec)
    for name, summary in packs.items():
        print(
            f"pack {name}: {summary['bytes'] / 1e6:.0f} MB in {summary['seconds']:.1f} s",
            file=sys.stderr,
            flush=True,
        )

    loaders: dict[str, object] = {}
    warm_storage(src)
    loaders["native"] = epochs(src, args)
    for name in packs:
        dataset = folder(args.work, name)
        warm_storage(dataset)
        with dlfs_mount(dataset, args.work / "mnt"):
            loaders[f"dlfs {name}"] = epochs(args.work / "mnt", args)
    native = loaders["native"]["images_per_s"]["median"]  # type: ignore[index]
    result = {
        "files": args.files,
        "workers": args.workers,
        "packs": {name: {key: summary[key] for key in PACK_FIGURES} for name, summary in packs.items()},
        "loaders": loaders,
        "vs_native": {
            name: loader["images_per_s"]["median"] / native  # type: ignore[index]
            for name, loader in loaders.items()
        },
    }
    if args.json:
        print_document(result)
        return
    for name, ratio in result["vs_native"].items():  # type: ignore[union-attr]
        rate = loaders[name]["images_per_s"]["median"]  # type: ignore[index]
        print(f"{name:<24} {rate:6.0f} images/s  {ratio:.2f}x native")


TITLE = "Preprocessing at pack time"


def render(data: Json) -> list[str]:
    """This benchmark's section of docs/benchmarks.md, from its JSON results."""
    packs = data["packs"]
    out = [
        f"{data['files']:,} photo-like JPEGs of ImageNet's dimensions (`make_imagenet_like.py --payload "
        "photo`), packed plain and through each transform; then an unmodified ImageFolder + DataLoader "
        f"epoch ({data['workers']} workers, `shuffle=True`, RandomResizedCrop(224), flip, ToTensor, "
        "Normalize) over the native tree and each mount, everything in the page cache (the figures are of "
        "decoding, not of the disk). Images/s: median of the runs shown. A mount's first epoch is read "
        "through the daemon; later ones come from the kernel's page cache of the mount's files.",
        "",
    ]
    rows = []
    for name, p in packs.items():
        rows.append(
            [
                name,
                f"{p['source_bytes'] / 1e6:,.0f}",
                f"{p['bytes'] / 1e6:,.0f}",
                f"{1 - p['bytes'] / p['source_bytes']:.0%}",
                f"{p['seconds']:.1f}",
                p["codec"] or DASH,
            ]
        )
    out += table(["pack", "source MB", "stored MB", "saved", "pack s", "codec"], rows)
    out.append("")
    rows = []
    for name, loader in data["loaders"].items():
        rate = loader["images_per_s"]
        runs = ", ".join(f"{r:.0f}" for r in loader["runs"])
        rows.append([name, f"{rate['median']:.0f}", runs, f"**{data['vs_native'][name]:.2f}{TIMES}**"])
    out += table(["loader over", "images/s", "runs", "vs native"], rows)
    return [*out, ""]


if __name__ == "__main__":
    main()
