#!/usr/bin/env python3
"""Archives as dlfs sources: ImageNet's train tar (a tar of class tars of real JPEGs) packed,
indexed in place and read, and a ``.tar.gz`` and a ``.zip`` packed, each beside the tools people use
for the same step, in one run.

- Packing ``train.tar`` with ``--expand-tars``, against ``cat train.tar`` (the disk's bound) and the
  two-step path: ``tar x`` of the outer tar and of every class tar into its folder, then ``dlfs
  pack`` of that tree.
- Indexing it in place (``--in-place --expand-tars``), against ``cat`` and ratarmount indexing the
  same tar ``--recursive`` (``--no-mount``).
- The same files as a flat tree of class folders in a ``.tar.gz`` and a ``.zip``, packed, against
  ``tar xzf`` and ``unzip`` alone.

Every one of these runs from a cold page cache, its output removed first (untimed); the commands
take turns, the order rotating each round, so that drift and what one leaves behind fall on all
alike. Then reads: 8 DataLoader reader processes (``bench_loader.one_run``: a fresh mount and
ImageFolder's scan before each timed pass) with ``shuffle=True`` (``shuffleload``) and in the
published order (``orderload``), warm and cold, on the in-place mount, the packed mount of the same
files, and ratarmount mounted ``--recursive`` on the same tar; with each one's index bytes per file
and its daemon's RSS after the pass. Medians of --repeat runs; the tables with their targets, or one
JSON document with --json. Data and scratch space live under --work, made on first use.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_loader import Mount, fresh, one_run
from benchdoc import DASH, TIMES, Json, number, print_document, table
from benchlib import DLFS, cold_rounds, dlfs_mount, ensure_tree, remove
from make_imagenet_like import train_tar

from dlfs import bench
from dlfs.bench import peers
from dlfs.core import format as fmt

TRAIN, TAR_GZ, ZIP = "train.tar", "tree.tar.gz", "tree.zip"

#: ratarmount as ImageNet's users run it on the train tar: every class tar a folder named after it.
#: Its index is built by the timed indexing step and loaded by every mount after it.
RATARMOUNT_FLAGS = ("--recursive", "--strip-recursive-tar-extension", "--index-file", "{image}.index.sqlite")
RATARMOUNT = peers.Peer(
    "ratarmount",
    ("ratarmount",),
    ("ratarmount", *RATARMOUNT_FLAGS, "--no-mount", "--recreate-index", "{image}"),
    ("ratarmount", *RATARMOUNT_FLAGS, "{image}", "{mnt}"),
    TRAIN,
)

CAT = f"cat {TRAIN}"
PACK = f"dlfs pack --expand-tars {TRAIN}"
TWO_STEP = f"tar x {TRAIN} and each class tar, then dlfs pack"
IN_PLACE = f"dlfs pack --in-place --expand-tars {TRAIN}"
RATARMOUNT_INDEX = f"ratarmount --recursive {TRAIN} (index only)"
#: Each archive of the flat tree: (the extractor alone, dlfs pack of it).
SOURCES = {TAR_GZ: f"tar xzf {TAR_GZ}", ZIP: f"unzip {ZIP}"}

#: Time targets: (command, against, the most its time may be in times the other's); None: quoted only.
TIME_TARGETS: tuple[tuple[str, str, float | None], ...] = (
    (PACK, CAT, 1.3),
    (PACK, TWO_STEP, 0.5),
    (IN_PLACE, CAT, 1.2),
    (IN_PLACE, RATARMOUNT_INDEX, 1 / 3),
    *((f"dlfs pack {name}", extractor, None) for name, extractor in SOURCES.items()),
)
#: The mounts read, in the order of the table; the first is the one held to the targets.
CASES = ("in place", "packed", "ratarmount")
#: Read targets: (against, the least the in-place mount's files/s may be in times the other's).
READ_TARGETS = (("packed", 0.9), ("ratarmount", 3.0))


@dataclass(frozen=True)
class Work:
    """Where everything lives under --work: the tree, its archives, and what the steps write."""

    root: Path
    src: Path
    train: Path
    tar_gz: Path
    zip: Path
    packed: Path
    in_place: Path
    scratch: Path
    mnt: Path
    log: Path
    sqlite: Path

    @classmethod
    def under(cls, root: Path) -> Work:
        names = ("src", TRAIN, TAR_GZ, ZIP, "packed", "in-place", "scratch", "mnt", "mount.log")
        return cls(root, *(root / name for name in names), root / f"{TRAIN}.index.sqlite")


def progress(started: float, message: str) -> None:
    minutes, seconds = divmod(int(time.monotonic() - started), 60)
    print(f"[{minutes:2d}:{seconds:02d}] {message}", file=sys.stderr, flush=True)


def run(*command: str | Path, cwd: Path | None = None) -> None:
    subprocess.run([str(part) for part in command], check=True, stdout=subprocess.DEVNULL, cwd=cwd)


def prepare(work: Work, files: int, classes: int, started: float) -> None:
    """The tree of real JPEGs (``benchlib.ensure_tree``, which empties --work when it makes a new
    one) and its three archives, each written once: beside it until whole, so that an interrupted
    run never leaves a partial archive for the next to trust."""
    ensure_tree(work.root, files, classes, "jpeg")
    makers: dict[Path, Callable[[Path], object]] = {
        work.train: lambda out: train_tar(work.src, out),
        work.tar_gz: lambda out: run("tar", "-czf", out, "-C", work.src, "."),
        work.zip: lambda out: run("zip", "-q", "-r", out.resolve(), ".", cwd=work.src),
    }
    for path, make in makers.items():
        if not path.exists():
            progress(started, f"writing {path} ...")
            partial = path.with_name(f".partial.{path.name}")
            remove(partial)
            make(partial)
            partial.rename(path)


def extract_and_pack(train: Path, scratch: Path) -> None:
    """The two-step path: the outer tar extracted, every class tar in it into a folder of its name
    (the class tar deleted, as a user would), then that tree packed."""
    tree = scratch / "tree"
    tree.mkdir(parents=True)
    run("tar", "-xf", train, "-C", tree)
    for inner in sorted(tree.glob("*.tar")):
        folder = inner.with_suffix("")
        folder.mkdir()
        run("tar", "-xf", inner, "-C", folder)
        inner.unlink()
    run(*DLFS, "-q", "pack", tree, scratch / "dataset")


def extract(scratch: Path, *command: str | Path) -> None:
    """An archive extracted alone, into ``scratch``."""
    scratch.mkdir()
    run(*command, scratch)


def steps(work: Work) -> dict[str, tuple[Callable[[], None], Path | None]]:
    """Every timed command, by name, with what it writes (removed before each run)."""
    pack = (*DLFS, "-q", "pack")
    index = RATARMOUNT.command(RATARMOUNT.build, work.root, work.train, work.mnt)
    out: dict[str, tuple[Callable[[], None], Path | None]] = {
        CAT: (lambda: run("cat", work.train), None),
        PACK: (lambda: run(*pack, "--expand-tars", work.train, work.packed), work.packed),
        TWO_STEP: (lambda: extract_and_pack(work.train, work.scratch), work.scratch),
        IN_PLACE: (
            lambda: run(*pack, "--in-place", "--expand-tars", work.train, work.in_place),
            work.in_place,
        ),
        RATARMOUNT_INDEX: (lambda: run(*index), work.sqlite),
    }
    extractors = {TAR_GZ: ("tar", "-xzf", work.tar_gz, "-C"), ZIP: ("unzip", "-q", work.zip, "-d")}
    for name, extractor in extractors.items():
        archive = work.root / name
        out[SOURCES[name]] = (lambda e=extractor: extract(work.scratch, *e), work.scratch)
        out[f"dlfs pack {name}"] = (lambda a=archive: run(*pack, a, work.scratch), work.scratch)
    return out


def timings(work: Work, repeat: int, started: float) -> dict[str, dict[str, float]]:
    """Median, min and max seconds of every step over ``repeat`` rounds, cold, in rotating order."""
    seconds = cold_rounds(
        steps(work),
        repeat,
        lambda round_no, name, took: progress(
            started, f"round {round_no + 1}/{repeat}  {name:52} {took:7.2f} s"
        ),
    )
    remove(work.scratch)
    return seconds


def reads(work: Work, args: argparse.Namespace, started: float) -> dict[str, dict[str, dict[str, float]]]:
    """Every job and temperature of ``args`` on each of ``CASES``: the median run, by ``"JOB TEMPERATURE"``
    then case. Each dlfs mount reads its own published order; ratarmount, which has none, the in-place
    one's (the same tar read in the same sequence)."""
    tree = bench.Tree.walk(str(work.src))

    def published(dataset: Path) -> list[str]:
        with dlfs_mount(dataset, work.mnt, "--log-file", str(work.log)):
            return bench.published_order([bench.Root("dlfs", str(work.mnt))], epoch=0)

    @contextmanager
    def ratarmount() -> Iterator[None]:
        with peers.mounted(RATARMOUNT, work.train, work.mnt):
            yield

    orders = {"in place": published(work.in_place), "packed": published(work.packed)}
    orders["ratarmount"] = orders["in place"]
    cases: dict[str, tuple[Mount, Path]] = {
        "in place": (fresh(work.in_place, work.mnt, work.log), work.train),
        "packed": (fresh(work.packed, work.mnt, work.log), work.packed),
        "ratarmount": (ratarmount, work.train),
    }
    results: dict[str, dict[str, dict[str, float]]] = {}
    for job in args.jobs.split(","):
        for temperature in args.temperatures.split(","):
            for case, (mount, storage) in cases.items():
                items = bench.job_items(job, tree, orders[case], 0)
                runs = [
                    one_run(job, items, args.readers, args.batch, temperature, mount, storage, work.mnt)[0]
                    for _ in range(args.repeat)
                ]
                row = bench.median_runs(runs)
                results.setdefault(f"{job} {temperature}", {})[case] = row
                progress(started, f"{job} {temperature}, {case}: {row['items_per_s']:,.0f} files/s")
    return results


def index_bytes_per_file(work: Work, files: int) -> dict[str, float]:
    """What each mount keeps beside the data, per file: the whole in-place dataset (it is all
    index), the packed dataset's index, ratarmount's SQLite index."""
    in_place = sum(path.stat().st_size for path in work.in_place.iterdir())
    sizes = {
        "in place": in_place,
        "packed": (work.packed / fmt.INDEX_NAME).stat().st_size,
        "ratarmount": work.sqlite.stat().st_size,
    }
    return {case: size / files for case, size in sizes.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=20_000, help="real JPEGs (default 20,000)")
    parser.add_argument("--classes", type=int, default=100, help="class tars in the train tar (default 100)")
    parser.add_argument("--work", type=Path, default=Path("bench-data/archive"))
    parser.add_argument("--readers", type=int, default=8, help="DataLoader reader processes (default 8)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3, help="runs of every measurement (default 3)")
    parser.add_argument("--jobs", default="shuffleload,orderload")
    parser.add_argument("--temperatures", default="warm,cold")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    started = time.monotonic()
    work = Work.under(args.work)
    prepare(work, args.files, args.classes, started)
    prepared = time.monotonic()
    tree = bench.Tree.walk(str(work.src))
    seconds = timings(work, args.repeat, started)
    read = reads(work, args, started)
    results = {
        "options": vars(args) | {"work": str(args.work)},
        "files": len(tree.files),
        "classes": len(tree.classes),
        "bytes": {
            "files": sum(os.stat(work.src / name).st_size for name in tree.files),
            **{name: (work.root / name).stat().st_size for name in (TRAIN, TAR_GZ, ZIP)},
        },
        "seconds": seconds,
        "index_bytes_per_file": index_bytes_per_file(work, len(tree.files)),
        "reads": read,
        "prepare_seconds": prepared - started,
        "run_seconds": time.monotonic() - prepared,
    }
    progress(started, "done")
    if args.json:
        print_document(results)
    else:
        print("\n".join(render(results)))


TITLE = "Archives: ImageNet's train tar packed, indexed in place and read"


def render(data: Json) -> list[str]:
    """This benchmark's section of docs/benchmarks.md: the timed commands against their baselines,
    the reads of the three mounts, and what each keeps in memory and beside the data."""
    options, size = data["options"], data["bytes"]
    out = [
        f"{data['files']:,} real JPEGs ({size['files'] / 1e9:.2f} GB) in {data['classes']} class tars "
        f"inside `{TRAIN}` ({size[TRAIN] / 1e9:.2f} GB), as ImageNet's train tar is laid out; the same "
        f"files as class folders in `{TAR_GZ}` ({size[TAR_GZ] / 1e9:.2f} GB) and `{ZIP}` "
        f"({size[ZIP] / 1e9:.2f} GB). {runs(options['repeat'])}; the measurements took "
        f"{data['run_seconds'] / 60:.1f} min (making the data, on first use, "
        f"{data['prepare_seconds'] / 60:.1f} min before them).",
        "",
        "Every command from a cold page cache, its output removed first; the commands take turns, "
        "the order rotating each round. Ratio: the command's time over the time of the one it is "
        "compared with, from the same run.",
        "",
    ]
    seconds = data["seconds"]
    rows = []
    for name, times in seconds.items():
        compared = [(against, bound) for step, against, bound in TIME_TARGETS if step == name]
        cells = [f"`{name}`", f"{times['median']:.2f} ({times['min']:.2f}{DASH}{times['max']:.2f})"]
        for against, bound in compared or [(None, None)]:
            if against is None:
                rows.append([*cells, DASH, DASH, DASH])
                continue
            got = times["median"] / seconds[against]["median"]
            target = DASH if bound is None else f"≤ {bound:.2f}{TIMES}, {met(got <= bound)}"
            rows.append([*cells, f"`{against}`", f"{got:.2f}{TIMES}", target])
    out += table(["command", f"seconds (min{DASH}max)", "against", "ratio", "target"], rows)
    return [*out, "", *reads_table(data), "", *memory_table(data), ""]


def runs(repeat: int) -> str:
    return f"Medians of {repeat} runs" if repeat > 1 else "One run each"


def met(ok: bool) -> str:
    return "met" if ok else "**not met**"


def reads_table(data: Json) -> list[str]:
    """Files/s of each mount, and the in-place mount's against the others' beside their targets."""
    options = data["options"]
    out = [
        f"Reads: {options['readers']} DataLoader processes in batches of {options['batch']}, torchvision's "
        "default loader; `shuffleload` is `shuffle=True`, `orderload` the published order (ratarmount, "
        "which has none, reads the in-place mount's). A fresh mount and an ImageFolder scan before "
        "every run; *warm*: the tar or the shards in the page cache, *cold*: every cache dropped. "
        "Files/s; ratio: the in-place mount's files/s over the other's.",
        "",
    ]
    rows = []
    for key, by_case in data["reads"].items():
        fps = {case: by_case[case]["items_per_s"] for case in CASES}
        ratios = []
        for against, bound in READ_TARGETS:
            got = fps[CASES[0]] / fps[against]
            ratios.append(f"{got:.2f}{TIMES} (≥ {bound:.1f}{TIMES}, {met(got >= bound)})")
        rows.append([key, *(number(fps[case]) for case in CASES), *ratios])
    header = [f"{CASES[0]} / {against}" for against, _ in READ_TARGETS]
    return out + table(["job, temperature", *CASES, *header], rows)


def memory_table(data: Json) -> list[str]:
    """Index bytes per file and the daemon's RSS after each job's pass (the most over temperatures)."""
    jobs = data["options"]["jobs"].split(",")
    rows = []
    for case in CASES:
        rss = []
        for job in jobs:
            after = [
                by_case[case].get("daemon_rss_after", 0)
                for key, by_case in data["reads"].items()
                if key.split()[0] == job
            ]
            rss.append(f"{max(after) / 2**20:.0f}" if max(after) else DASH)
        rows.append([case, f"{data['index_bytes_per_file'][case]:.0f}", *rss])
    return table(["mount", "index bytes per file", *(f"daemon RSS after `{job}`, MiB" for job in jobs)], rows)


if __name__ == "__main__":
    main()
