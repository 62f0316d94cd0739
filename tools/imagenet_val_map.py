#!/usr/bin/env python3
"""The ``dlfs pack --map`` of ImageNet's validation tar: each flat image into its class folder.

ILSVRC2012's devkit gives the class of validation image k (``ILSVRC2012_val_0000000k.JPEG``) on line k
of ``data/ILSVRC2012_validation_ground_truth.txt`` as an ``ILSVRC2012_ID`` (1 to 1000), and
``data/meta.mat`` the WordNet id of each. The ids are not in the sorted order of the wnids, so the
map needs that table: ``--wnids`` takes it as text, one wnid a line, line i holding id i (from
``meta.mat``: the ``WNID`` of the synsets with ``num_children`` 0, in ``ILSVRC2012_ID`` order, which
``scipy.io.loadmat`` reads). Prints the map (CSV) on standard output:

    python tools/imagenet_val_map.py GROUND_TRUTH --wnids wnids.txt > val.csv
    dlfs pack ILSVRC2012_img_val.tar val --map val.csv
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

#: Classes of ILSVRC2012.
CLASSES = 1000
WNID = re.compile(r"n\d{8}")


def val_map(labels: list[str], wnids: list[str], prefix: str) -> list[str]:
    """One map line per validation image: its name in the tar, then its class folder's path."""
    lines = []
    for number, label in enumerate(labels, start=1):
        name = f"ILSVRC2012_val_{number:08d}.JPEG"
        lines.append(f"{name},{prefix}{wnids[int(label) - 1]}/{name}\n")
    return lines


def _read_wnids(path: Path) -> list[str]:
    wnids = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    bad = [wnid for wnid in wnids if not WNID.fullmatch(wnid)]
    if len(wnids) != CLASSES or bad:
        sys.exit(
            f"{path}: want {CLASSES} wnids (n + 8 digits), one a line; got {len(wnids)}, {bad[:3]} malformed"
        )
    return wnids


def _read_labels(path: Path) -> list[str]:
    labels = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    bad = [label for label in labels if not (label.isdigit() and 1 <= int(label) <= CLASSES)]
    if bad:
        sys.exit(f"{path}: each line must be a class id from 1 to {CLASSES}; got {bad[0]!r}")
    return labels


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("ground_truth", type=Path, help="ILSVRC2012_validation_ground_truth.txt")
    parser.add_argument(
        "--wnids", type=Path, required=True, help="the wnid of each ILSVRC2012_ID, one a line"
    )
    parser.add_argument("--prefix", default="", help="folder the class folders go in (e.g. val/)")
    args = parser.parse_args()
    sys.stdout.writelines(val_map(_read_labels(args.ground_truth), _read_wnids(args.wnids), args.prefix))


if __name__ == "__main__":
    main()
