"""``dlfs bench ROOT...``: the same fio-style jobs on every root, in one table (``dlfs.bench``)."""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

from dlfs.cli.common import Subparsers, add_command, human

if TYPE_CHECKING:
    from dlfs.bench import Result


def add_parser(sub: Subparsers) -> None:
    p = add_command(
        sub,
        "bench",
        run,
        help="fio-style jobs (scan, stat, reads) on dataset trees and mounts, side by side",
        description="Run the same jobs on every ROOT (a directory, a dlfs/squashfuse/ratarmount mount) "
        "and print one table. Jobs: scan (ImageFolder-style class scan), readdir, stat, seqread, "
        "randread, orderread (read every file whole in tree / seeded random / published dlfs order, "
        "unbuffered), shuffleload, orderload (seeded random / published order read the way "
        "torchvision's default loader does: buffered open(), which asks isatty() before Python 3.14).",
    )
    p.add_argument(
        "roots", nargs="+", metavar="ROOT", help="PATH or LABEL=PATH; with --peers the first is the source"
    )
    p.add_argument(
        "--job",
        default="scan,stat,seqread,randread",
        help="comma-separated jobs (default scan,stat,seqread,randread)",
    )
    p.add_argument("--readers", type=int, default=1, help="concurrent readers (default 1)")
    p.add_argument(
        "--batch",
        type=int,
        default=1,
        help="items a reader takes at a time, as a DataLoader worker takes a batch (default 1)",
    )
    p.add_argument(
        "--workers",
        choices=("process", "thread"),
        default="process",
        help="readers are processes, like DataLoader workers, or threads (default process)",
    )
    p.add_argument("--cold", action="store_true", help="drop the page cache before each run (root only)")
    p.add_argument(
        "--repeat", type=int, default=3, help="runs per job and root; the median is shown (default 3)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of randread's order (default 0)")
    p.add_argument(
        "--epoch",
        type=int,
        default=0,
        help="epoch whose published order orderread and orderload follow (default 0)",
    )
    p.add_argument(
        "--peers",
        action="store_true",
        help="also pack the first ROOT with dlfs, squashfs (squashfuse_ll) and tar (ratarmount), mount them "
        "and run the same jobs there",
    )
    p.add_argument(
        "--work", default="bench-peers", help="where --peers keeps its images (default ./bench-peers)"
    )
    p.add_argument("--rebuild", action="store_true", help="rebuild the --peers images even if up to date")
    p.add_argument("--plot", help="write bar charts of items/s and latency per root to this PNG")
    p.add_argument("--json", action="store_true", help="print every run as JSON")


def run(args: argparse.Namespace) -> int:
    from dlfs import bench

    options = bench.Options(
        jobs=[job.strip() for job in args.job.split(",") if job.strip()],
        readers=args.readers,
        batch=args.batch,
        processes=args.workers == "process",
        cold=args.cold,
        repeat=args.repeat,
        seed=args.seed,
        epoch=args.epoch,
    )
    roots = [bench.Root.parse(text) for text in args.roots]
    built: dict[str, dict] = {}
    with ExitStack() as stack:
        if args.peers:
            from dlfs.bench.peers import peer_roots

            peers, built = stack.enter_context(peer_roots(Path(roots[0].path), Path(args.work), args.rebuild))
            roots.extend(peers)

        def progress(result: Result) -> None:
            if not args.quiet and not args.json:
                rate = result.median["items_per_s"]
                print(f"{result.job} on {result.root}: {rate:,.0f} items/s", file=sys.stderr, flush=True)

        results = bench.run(roots, options, progress)
    if args.plot:
        bench.plot(results, args.plot)
    if args.json:
        report = {
            "options": vars(options) | {"jobs": list(options.jobs)},
            "peers": built,
            "results": [r.to_dict() for r in results],
        }
        print(json.dumps(report, indent=2))
        return 0
    cold = "cold (page cache dropped before each run)" if args.cold else "warm"
    print(f"{args.readers} {args.workers} reader(s), {cold}, median of {args.repeat}")
    print(bench.table(results))
    for name, facts in built.items():
        print(f"{name} image: {human(facts['image_bytes'])}, built in {facts['build_seconds']:.1f} s")
    return 0
