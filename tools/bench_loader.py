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
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import dlfs_mount, ensure_packed, warm_storage

from dlfs import bench
from dlfs.bench import peers

JOBS = ("shuffleload", "orderload", "orderread")


def fresh(dst: Path, mnt: Path, log: Path, *flags: str) -> Callable[[], AbstractContextManager[object]]:
    return lambda: dlfs_mount(dst, mnt, "--log-file", str(log), *flags)


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

    src, dst, work = args.work / "src", args.work / "dataset", args.work / "loader"
    ensure_packed(args.work, args.files, args.classes, "jpeg", dst)
    squash = peers.PEERS[1]
    image, _ = peers.build(squash, src, work)
    mnt, log = work / "mnt", work / "mount.log"
    with dlfs_mount(dst, mnt, "--log-file", str(log)):
        order = bench.published_order([bench.Root("dlfs", str(mnt))], epoch=0)
    tree = bench.Tree.walk(str(src))

    @contextmanager
    def squashfuse() -> Iterator[object]:
        with peers.mounted(squash, image, mnt):
            yield None

    cases: dict[str, tuple[Callable[[], AbstractContextManager[object]] | None, Path]] = {
        "native": (None, src),
        "squashfuse_ll": (squashfuse, image),
        "dlfs": (fresh(dst, mnt, log), dst),
        "dlfs, Python only": (fresh(dst, mnt, log, "--native-threads", "0"), dst),
    }
    results: dict[str, dict[str, object]] = {}
    for job in args.job.split(","):
        items = bench.job_items(job, tree, order, 0)
        for temperature in args.temperatures.split(","):
            for readers in args.readers:
                for case, (mount, storage) in cases.items():
                    runs, per_request = [], []
                    for _ in range(args.repeat):
                        run, native = one_run(
                            job, items, readers, args.batch, temperature, mount, storage, mnt
                        )
                        runs.append(run)
                        per_request.append(native)
                    row = bench.median_runs(runs)
                    key = f"{job} {temperature} {readers}"
                    results.setdefault(key, {})[case] = row | {"native": per_request}
                    print(
                        f"{key:24} {case:18} {row['items_per_s']:9,.0f} files/s", file=sys.stderr, flush=True
                    )
    if args.json:
        print(json.dumps({"options": vars(args) | {"work": str(args.work)}, "results": results}, indent=2))
        return
    for key, by_case in results.items():
        print(key, "  ".join(f"{case}: {row['items_per_s']:,.0f}" for case, row in by_case.items()))


def one_run(
    job: str,
    items: list[str],
    readers: int,
    batch: int,
    temperature: str,
    mount: Callable[[], AbstractContextManager[object]] | None,
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


if __name__ == "__main__":
    main()
