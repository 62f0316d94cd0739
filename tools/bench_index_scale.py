#!/usr/bin/env python3
"""ImageNet's train tar at its own member count, indexed in place, against ratarmount indexing it.

``make bench-archive``'s train tar holds 20,000 JPEGs; ImageNet's holds 1,281,167 in 1,000 class
tars, and what an index costs a member shows only at that count. This tar has ImageNet's shape (a
tar of --classes class tars of --per-class flat ``nXXXXXXXX_K.JPEG`` members) with small members
(--size bytes on average), so that it fits a development disk: 6.7 GB at the defaults. Each command
runs from a cold page cache, its output removed first (untimed), the commands taking turns each
round: ``cat`` (the disk's bound for reading every byte), ``dlfs pack --in-place --expand-tars``
(which reads every byte, for its checksums), and ``ratarmount --recursive`` (``--no-mount``, which
reads the headers). Medians of --repeat; the table, or one JSON document with --json. The tar is
made under --work on first use (about a minute).
"""

from __future__ import annotations

import argparse
import io
import random
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_archive
from benchdoc import Json, number, print_document, ratio, table
from benchlib import DLFS, Step, cold_rounds, remove

TITLE = "Indexing in place at ImageNet's member count"
CAT, IN_PLACE, RATARMOUNT = (
    "cat train.tar",
    "dlfs pack --in-place --expand-tars",
    "ratarmount --recursive (index only)",
)
#: The target: dlfs indexes in at most this share of ratarmount's time.
TARGET = 1 / 3


def make_train_tar(out: Path, classes: int, per_class: int, size: int) -> None:
    """A tar of ``classes`` class tars of ``per_class`` members of ``size`` bytes on average (each
    member's bytes a slice of one random block: the tar is read, not compressed)."""
    block = random.Random(0).randbytes(size * 4)
    partial = out.with_name(f".{out.name}.partial")
    with open(partial, "wb") as raw, tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as outer:
        for label in range(classes):
            wnid = f"n{1_440_764 + label * 97:08d}"
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as inner:
                for k in range(per_class):
                    length = size // 2 + (k * 37) % size
                    info = tarfile.TarInfo(f"{wnid}_{k}.JPEG")
                    info.size, info.mtime, info.mode = length, 1_300_000_000, 0o644
                    start = (k * 131) % (len(block) - length)
                    inner.addfile(info, io.BytesIO(block[start : start + length]))
            info = tarfile.TarInfo(f"{wnid}.tar")
            info.size, info.mtime, info.mode = buffer.tell(), 1_300_000_000, 0o644
            buffer.seek(0)
            outer.addfile(info, buffer)
    partial.rename(out)


def steps(work: Path) -> dict[str, Step]:
    """Each timed command, with what it writes."""
    tar, dataset = work / "train.tar", work / "in-place"
    # make bench-archive's ratarmount index command, told to write its index however few members.
    *build, image = bench_archive.RATARMOUNT.build
    ratarmount = bench_archive.RATARMOUNT.command(
        (*build, "--index-minimum-file-count", "0", image), work, tar, work / "mnt"
    )
    return {
        CAT: (lambda: bench_archive.run("cat", tar), None),
        IN_PLACE: (
            lambda: bench_archive.run(*DLFS, "-q", "pack", "--in-place", "--expand-tars", tar, dataset),
            dataset,
        ),
        RATARMOUNT: (lambda: bench_archive.run(*ratarmount), Path(f"{tar}.index.sqlite")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument(
        "--per-class", type=int, default=1281, help="members of each class tar (default 1,281)"
    )
    parser.add_argument("--size", type=int, default=3000, help="bytes a member holds on average")
    parser.add_argument("--work", type=Path, default=Path("bench-data/index-scale"))
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs of each command (ratarmount takes minutes)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    tar = args.work / "train.tar"
    shape = args.work / f"shape-{args.classes}-{args.per_class}-{args.size}"
    if not shape.exists():
        for stale in (tar, *args.work.glob("shape-*")):
            remove(stale)
        print(f"making {tar} ...", file=sys.stderr, flush=True)
        make_train_tar(tar, args.classes, args.per_class, args.size)
        shape.touch()
    todo = steps(args.work)
    seconds = cold_rounds(
        todo,
        args.repeat,
        lambda round_no, name, took: print(
            f"round {round_no + 1}: {name:44} {took:8.2f} s", file=sys.stderr, flush=True
        ),
    )
    index = args.work / "in-place" / "index.dlfs"
    results = {
        "options": vars(args) | {"work": str(args.work)},
        "members": args.classes * args.per_class,
        "tar_bytes": tar.stat().st_size,
        "index_bytes": {
            "in place": index.stat().st_size,
            "ratarmount": Path(f"{tar}.index.sqlite").stat().st_size,
        },
        "seconds": seconds,
    }
    for _, output in todo.values():
        remove(output)
    if args.json:
        print_document(results)
    else:
        print("\n".join(render(results)))


def render(data: Json) -> list[str]:
    """The section of docs/benchmarks.md: the three commands' times, dlfs's against each."""
    seconds = {name: times["median"] for name, times in data["seconds"].items()}
    members, size = data["members"], data["tar_bytes"]
    per_member = {name: value / members for name, value in data["index_bytes"].items()}
    rows = [
        [f"`{name}`", number(value, 2), ratio(seconds[IN_PLACE], value) if name != IN_PLACE else ""]
        for name, value in seconds.items()
    ]
    met = seconds[IN_PLACE] <= TARGET * seconds[RATARMOUNT]
    return [
        f"{members:,} members in {data['options']['classes']:,} class tars ({size / 1e9:.2f} GB), cold, "
        f"medians of {data['options']['repeat']}; index bytes per member: dlfs {per_member['in place']:.0f}, "
        f"ratarmount {per_member['ratarmount']:.0f}.",
        "",
        *table(["command", "seconds", "dlfs in place / this"], rows),
        "",
        f"Target: dlfs in place at most {TARGET:.2f} of ratarmount's time: {'met' if met else 'not met'}.",
        "",
    ]


if __name__ == "__main__":
    main()
