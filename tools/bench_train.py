#!/usr/bin/env python3
"""End to end on a slow disk: one ImageFolder training epoch from the native tree vs through dlfs.

Puts the native tree and the dlfs dataset (packed in random placement) on one throttled disk
(``tools/slowdisk.py``: a loop-mounted ext4 image behind a cgroup v1 blkio read limit), then, with the
page cache dropped before each run, times ``tools/train_imagefolder.py`` on:

- native: the tree on the slow disk, ``shuffle=True`` (what a training script does today);
- dlfs block: a dlfs mount of the dataset on the same disk, ``--order block``, the dlfs sampler;
- dlfs full: the same mount with the uniform shuffle, for comparison;
- dlfs shuffle=True: the same mount read as the native tree is, with no published order, with the
  region fetch of the C request threads (``--region-ahead``, on by default here) and without.

The dlfs daemon runs inside the throttled cgroup too, so every byte it reads pays the same limit.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import slowdisk
from benchdoc import DASH, Json, print_document, ratio, table
from benchlib import dlfs_mount, drop_caches, ensure_packed

from dlfs import bench

HERE = Path(__file__).resolve().parent


def train(root: Path, sampler: str, args: argparse.Namespace) -> dict[str, float]:
    command = [sys.executable, str(HERE / "train_imagefolder.py"), str(root), "--sampler", sampler, "--json"]
    command += ["--workers", str(args.workers), *(["--model"] if args.model else [])]
    done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=3600)
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=8000)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--work", type=Path, default=Path("bench-data/train"))
    parser.add_argument("--iops", type=int, default=200, help="read IOPS of the slow disk (default 200)")
    parser.add_argument("--bps", default="100M", help="read bytes/s of the slow disk (default 100M)")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers (default 2)")
    parser.add_argument("--model", action="store_true", help="add a small CNN's training step per batch")
    parser.add_argument("--repeat", type=int, default=1, help="epochs per case; the median is shown")
    parser.add_argument(
        "--window",
        type=int,
        nargs="+",
        default=[4096],
        help="block-order shuffle windows to run, in files (default 4096, the mount's default; the "
        "window equal to --block 64 keeps every read-ahead batch inside one or two runs)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    src, dataset, slow = args.work / "src", args.work / "dataset", args.work / "slow"
    ensure_packed(args.work, args.files, args.classes, "jpeg", dataset, "--placement", "random")
    size = 2 * sum(p.stat().st_size for p in args.work.rglob("*") if p.is_file()) + (256 << 20)
    slowdisk.down(slow)
    slowdisk.up(slow, size, args.iops, slowdisk.parse_size(args.bps))
    results: dict[str, list[dict[str, float]]] = {}
    try:
        shutil.copytree(src, slow / "src")
        shutil.copytree(dataset, slow / "dataset")
        slowdisk.enter()
        cases = {
            "native, shuffle=True": (None, "shuffle"),
            **{
                f"dlfs --order block --window {w}, ShuffleSampler": (
                    ["--order", "block", "--window", str(w)],
                    "dlfs",
                )
                for w in args.window
            },
            "dlfs --order full, ShuffleSampler": (["--order", "full"], "dlfs"),
            "dlfs, shuffle=True": ([], "shuffle"),
            "dlfs --region-ahead 0, shuffle=True": (["--region-ahead", "0"], "shuffle"),
        }
        for _ in range(args.repeat):
            for case, (flags, sampler) in cases.items():
                drop_caches()
                if flags is None:
                    run = train(slow / "src", sampler, args)
                else:
                    mnt = args.work / "mnt"
                    with dlfs_mount(
                        slow / "dataset", mnt, "--log-file", str(args.work / "mount.log"), *flags
                    ):
                        run = train(mnt, sampler, args)
                results.setdefault(case, []).append(run)
                print(f"{case}: {run['epoch_s']:.1f} s", file=sys.stderr, flush=True)
    finally:
        slowdisk.leave()
        slowdisk.down(slow)
    summary = {case: bench.median_runs(runs) for case, runs in results.items()}
    if args.json:
        print_document({"iops": args.iops, "bps": args.bps, "workers": args.workers, "results": summary})
        return
    native = summary["native, shuffle=True"]["epoch_s"]  # the first case
    print(f"\n{args.files:,} JPEGs on a {args.iops} IOPS / {args.bps}/s disk, {args.workers} workers, cold")
    print(f"{'case':38}{'epoch s':>9}{'images/s':>10}{'waited s':>10}{'vs native':>11}")
    for case, row in summary.items():
        print(
            f"{case:38}{row['epoch_s']:9.1f}{row['images_per_s']:10.0f}{row['data_wait_s']:10.1f}"
            f"{row['epoch_s'] / native:11.2f}"
        )


TITLE = "One ImageFolder epoch from a slow disk"


def render(data: Json) -> list[str]:
    """This benchmark's section of docs/benchmarks.md, from its JSON results."""
    out = [
        f"An unmodified ImageFolder + DataLoader epoch ({data['workers']} workers, decoding and "
        f"transforming every image) with the native tree and the dataset on one disk throttled to "
        f"{data['iops']} IOPS / {data['bps']}B/s (`tools/slowdisk.py`), page cache dropped before each "
        "run. Ratio: epoch time / native epoch time (below 1: faster). `data wait` is the share of the "
        "epoch the training loop waited for its next batch.",
        "",
    ]
    results = data["results"]
    native = next((v for k, v in results.items() if k.startswith("native")), None)
    rows = []
    for name, r in results.items():
        rows.append(
            [
                name,
                f"{r['images']:,}",
                f"{r['epoch_s']:.1f}",
                f"{r['images_per_s']:.0f}",
                f"**{ratio(r['epoch_s'], native['epoch_s'])}**" if native else DASH,
                f"{r['data_wait_share']:.0%}",
            ]
        )
    out += table(["run", "images", "epoch s", "images/s", "vs native", "data wait"], rows)
    return [*out, ""]


if __name__ == "__main__":
    main()
