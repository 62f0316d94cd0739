#!/usr/bin/env python3
"""An unmodified training job's reads: native tree, squashfuse_ll, dlfs (C request threads), dlfs (Python).

What a new user runs: DataLoader worker processes (8), batches (64), torchvision's default loader
(a buffered ``open(path, 'rb')``, which asks ``isatty()`` on Python < 3.14, then ``read()``), either
with ``shuffle=True`` (``shuffleload``: no published order, so no read-ahead) or with
``dlfs.torch.ShuffleSampler`` (``orderload``: the published order); ``orderread`` is the published
order read unbuffered, as ``dlfs.torch.pil_loader`` does, the figure ``orderload`` should reach once
the ioctl costs nothing. Each is ``dlfs bench``'s job of that name.

Every FUSE run starts from a fresh mount followed by ImageFolder's scan (untimed), the way a job
starts: "warm" has the image or shards in the page cache and the mount's own pages empty; "cold"
drops every cache before mounting. The native tree is read once untimed before a warm run. For the
dlfs mount served by the C threads, the run's requests and the daemon's CPU per request of each
kind come from ``.dlfs/stats``. Medians of --repeat runs; one JSON document with --json.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchdoc import DASH, Json, number, print_document, ratio, table
from benchlib import dlfs_mount, ensure_packed, warm_storage

from dlfs import bench
from dlfs.bench import peers

JOBS = ("shuffleload", "orderload", "orderread")
#: Every case, in the order of the table.
CASES = ("native", "squashfuse_ll", "dlfs", "dlfs, Python only")
Mount = Callable[[], AbstractContextManager[object]]


def fresh(dst: Path, mnt: Path, log: Path, *flags: str) -> Mount:
    return lambda: dlfs_mount(dst, mnt, "--log-file", str(log), *flags)


def matrix(
    src: Path,
    dst: Path,
    work: Path,
    cases: Sequence[str],
    jobs: Sequence[str],
    temperatures: Sequence[str],
    readers: Sequence[int],
    batch: int,
    repeat: int,
) -> dict[str, dict[str, object]]:
    """Every job, temperature and reader count on each of ``cases`` (of ``CASES``): the tree
    ``src``, its squashfs image (built under ``work``) and the dataset ``dst`` packed from it.
    Results by ``"JOB TEMPERATURE READERS"``, then by case: the median run, and per run what the C
    request threads answered (``native``, from ``.dlfs/stats``; None off dlfs)."""
    squash = peers.PEERS[1]
    mnt, log = work / "mnt", work / "mount.log"
    tree = bench.Tree.walk(str(src))
    order = None
    if "orderload" in jobs or "orderread" in jobs:
        with dlfs_mount(dst, mnt, "--log-file", str(log)):
            order = bench.published_order([bench.Root("dlfs", str(mnt))], epoch=0)
    image = peers.build(squash, src, work)[0] if "squashfuse_ll" in cases else src

    @contextmanager
    def squashfuse() -> Iterator[object]:
        with peers.mounted(squash, image, mnt):
            yield None

    every: dict[str, tuple[Mount | None, Path]] = {
        "native": (None, src),
        "squashfuse_ll": (squashfuse, image),
        "dlfs": (fresh(dst, mnt, log), dst),
        "dlfs, Python only": (fresh(dst, mnt, log, "--native-threads", "0"), dst),
    }
    results: dict[str, dict[str, object]] = {}
    for job in jobs:
        items = bench.job_items(job, tree, order, 0)
        for temperature in temperatures:
            for n in readers:
                for case in cases:
                    mount, storage = every[case]
                    runs, per_request = [], []
                    for _ in range(repeat):
                        run, native = one_run(job, items, n, batch, temperature, mount, storage, mnt)
                        runs.append(run)
                        per_request.append(native)
                    row = bench.median_runs(runs)
                    key = f"{job} {temperature} {n}"
                    results.setdefault(key, {})[case] = row | {"native": per_request}
                    print(
                        f"{key:24} {case:18} {row['items_per_s']:9,.0f} files/s", file=sys.stderr, flush=True
                    )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--work", type=Path, default=Path("bench-data/read"))
    parser.add_argument("--readers", type=int, nargs="+", default=[8])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--job", default=",".join(JOBS), help="comma-separated jobs, as dlfs bench --job")
    parser.add_argument("--temperatures", default="warm,cold")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    src, dst = args.work / "src", args.work / "dataset"
    ensure_packed(args.work, args.files, args.classes, "jpeg", dst)
    results = matrix(
        src,
        dst,
        args.work / "loader",
        CASES,
        args.job.split(","),
        args.temperatures.split(","),
        args.readers,
        args.batch,
        args.repeat,
    )
    if args.json:
        print_document({"options": vars(args) | {"work": str(args.work)}, "results": results})
        return
    for key, by_case in results.items():
        print(key, "  ".join(f"{case}: {row['items_per_s']:,.0f}" for case, row in by_case.items()))


def one_run(
    job: str,
    items: list[str],
    readers: int,
    batch: int,
    temperature: str,
    mount: Mount | None,
    storage: Path,
    mnt: Path,
) -> tuple[dict[str, float], dict[str, object] | None]:
    """One timed pass; for a FUSE case from a fresh mount and ImageFolder's scan."""
    options = bench.Options(readers=readers, batch=batch, epoch=0)
    if temperature == "cold":
        bench.drop_caches()
    else:
        warm_storage(storage)
    if mount is None:
        return bench.run_once(bench.Root("native", str(storage)), job, items, options), None
    with mount():
        bench.imagefolder_scan(str(mnt))
        run = bench.run_once(bench.Root("mnt", str(mnt)), job, items, options)
        stats = mnt / ".dlfs" / "stats"
        native = json.loads(stats.read_bytes()).get("native") if stats.exists() else None
    return run, native


TITLE = "What an unmodified training job reads"


#: The request kinds whose daemon CPU the C threads report.
LOADER_REQUESTS = ("lookup", "getattr", "read", "ioctl")


#: A run's figure for a kind counts only when the run answered at least this many of that kind.
LOADER_MIN_REQUESTS = 1000


def render(data: Json, scaling: Json | None) -> list[str]:
    """This benchmark's section of docs/benchmarks.md: the main run, and the one-run rows of more
    reader counts where those were run too."""
    options = data["options"]
    results = data["results"] | (scaling["results"] if scaling else {})
    out = [
        f"20,000 JPEGs read by {'/'.join(map(str, options['readers']))} loader processes in batches of "
        f"{options['batch']}, through torchvision's default loader (buffered `open`, so an `isatty()` "
        "ioctl per file): `shuffleload` is `shuffle=True` (no published order), `orderload` the "
        "published order (`ShuffleSampler`), `orderread` the published order read unbuffered "
        "(`dlfs.torch.pil_loader`). A fresh mount and an ImageFolder scan before every FUSE run; "
        "*warm*: the image or shards in the page cache, *cold*: every cache dropped first. "
        f"Files/s, medians of {options['repeat']}. *dlfs*: hot requests answered by the C threads "
        "(the default); *dlfs, Python only*: `--native-threads 0`.",
        "",
    ]
    if scaling:
        out += [
            f"Rows with {'/'.join(map(str, scaling['options']['readers']))} readers: one run each "
            "(`bench-loader-scaling.json`), to show how far 2 cores carry each.",
            "",
        ]
    rows = []
    for key, by_case in results.items():
        fps = {case: by_case[case]["items_per_s"] for case in CASES if case in by_case}
        rows.append(
            [
                key,
                *[number(fps[c]) if c in fps else DASH for c in CASES],
                f"**{ratio(fps.get('dlfs', 0), fps.get('squashfuse_ll', 0))}**",
                ratio(fps.get("dlfs", 0), fps.get("native", 0)),
                ratio(fps.get("dlfs", 0), fps.get("dlfs, Python only", 0)),
            ]
        )
    out += table(
        ["job, temperature, readers", *CASES, "dlfs / squashfuse_ll", "dlfs / native", "C / Python"],
        rows,
    )
    cpu: dict[str, list[float]] = {}
    for by_case in results.values():
        for native in by_case.get("dlfs", {}).get("native") or []:
            for kind, us in (native or {}).get("cpu_us_per_request", {}).items():
                if native["answered"].get(kind, 0) >= LOADER_MIN_REQUESTS:
                    cpu.setdefault(kind, []).append(us)
    if cpu:
        figures = [
            f"{kind} {min(cpu[kind]):.1f}{DASH}{max(cpu[kind]):.1f} µs"
            for kind in LOADER_REQUESTS
            if kind in cpu
        ]
        out += [
            "",
            "CPU per request of the C threads, over the dlfs runs above that answered at least "
            f"{LOADER_MIN_REQUESTS:,} of a kind (from reading the request to the reply written, "
            "`.dlfs/stats` `native.cpu_us_per_request`; READ includes reading and checking the file, "
            "warm or cold): " + ", ".join(figures) + ".",
        ]
    return [*out, ""]


if __name__ == "__main__":
    main()
