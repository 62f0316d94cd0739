"""``dlfs verify DATASET``: read every file back and check it against its checksum; exit 1 when
one is bad."""

from __future__ import annotations

import argparse
import json

from dlfs.cli.common import Subparsers, add_command, hidden_alias, human, store_flags, store_options


def add_parser(sub: Subparsers) -> None:
    p = add_command(sub, "verify", run, help="check every file of a dataset against its checksum")
    p.add_argument("dataset")
    p.add_argument("--threads", type=int, default=4, metavar="N", help="files read at once (default 4)")
    hidden_alias(p, "--readers", "-j", dest="threads", type=int)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    store_flags(p)


def run(args: argparse.Namespace) -> int:
    from dlfs.core.verify import verify

    report = verify(
        args.dataset,
        threads=args.threads,
        progress=not args.quiet and not args.json,
        options=store_options(args),
    )
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        for bad in report.bad:
            print(f"BAD {bad['path']}: {bad['problem']}")
        verdict = "OK" if report.ok else f"{len(report.bad)} BAD"
        print(f"{verdict}: checked {report.files} files ({human(report.bytes)}) in {report.seconds:.2f} s")
        if report.transform:
            print(f"transform: {report.transform}; checked as stored")
        if report.in_place:
            print(report.in_place)
    return 0 if report.ok else 1
