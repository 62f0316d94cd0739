#!/usr/bin/env python3
"""Pack speed against ``tar cf`` of the same tree, in one run, warm and cold page cache.

dlfs pack checksums every file and, by default, fsyncs shards and index before publishing; tar
does not wait for the disk. So each side runs both ways, and like is compared with like:
``dlfs pack --no-sync`` against ``tar cf``, ``dlfs pack`` against ``tar cf`` followed by ``sync``.
Medians of --repeat runs, run in alternation so drift affects both sides alike, the order rotating
each round: a job runs faster or slower depending on what the one before it left behind (here, a job
run right after ``tar cf`` deleted tar's 2.2 GB of unwritten output was ~0.6 s slower).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchdoc import TIMES, Json, print_document, table
from benchlib import DLFS, can_drop_caches, drop_caches, ensure_tree, timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--work", type=Path, default=Path("bench-data/pack"))
    parser.add_argument("--repeat", type=int, default=4, help="rounds; 4 puts every job once in each place")
    parser.add_argument("--threads", type=int, help="dlfs pack --threads (default: its own)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    src, out = args.work / "src", args.work / "out"
    ensure_tree(args.work, args.files, args.classes, "random")
    total = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())

    def clear() -> None:
        """An empty destination, the deletion settled (untimed): with ext4's ``discard`` the next
        journal commit issues the freed blocks' discards, and only jobs that sync would pay them."""
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        subprocess.run(["sync", "-f", str(out)], check=True)

    def run_tar(sync: bool) -> None:
        subprocess.run(["tar", "cf", str(out / "data.tar"), "-C", str(src), "."], check=True)
        if sync:
            subprocess.run(["sync", "-f", str(out / "data.tar")], check=True)

    def run_pack(sync: bool) -> None:
        subprocess.run(
            [
                *DLFS,
                "-q",
                "pack",
                str(src),
                str(out),
                *(["--threads", str(args.threads)] if args.threads else []),
                *([] if sync else ["--no-sync"]),
            ],
            check=True,
            capture_output=True,
        )

    jobs = {
        "tar cf": lambda: run_tar(False),
        "dlfs pack --no-sync": lambda: run_pack(False),
        "tar cf + sync": lambda: run_tar(True),
        "dlfs pack": lambda: run_pack(True),
    }
    #: (dlfs, tar) pairs that promise the same durability.
    pairs = {"no sync": ("dlfs pack --no-sync", "tar cf"), "sync": ("dlfs pack", "tar cf + sync")}
    modes = ["warm", *(["cold"] if can_drop_caches() else [])]
    times: dict[str, dict[str, list[float]]] = {mode: {name: [] for name in jobs} for mode in modes}
    for job in jobs.values():  # one untimed pass each so the warm runs start warm
        clear()
        job()
    for mode in modes:
        for round_no in range(args.repeat):
            first = round_no % len(jobs)
            names = list(jobs)
            for name in names[first:] + names[:first]:
                clear()
                if mode == "cold":
                    drop_caches()
                times[mode][name].append(timed(jobs[name])[0])
    shutil.rmtree(out, ignore_errors=True)

    seconds = {mode: {name: statistics.median(v) for name, v in by.items()} for mode, by in times.items()}
    results = {
        "files": args.files,
        "bytes": total,
        "repeat": args.repeat,
        "seconds": seconds,
        "ratios": {
            mode: {pair: seconds[mode][ours] / seconds[mode][tar] for pair, (ours, tar) in pairs.items()}
            for mode in modes
        },
        "all": times,
    }
    if args.json:
        print_document(results)
        return
    print(f"\n{args.files:,} files, {total / 1e9:.2f} GB, median of {args.repeat}")
    print(
        f"{'':10}"
        + "".join(f"{name:>21}" for name in jobs)
        + "".join(f"{f'dlfs/tar {p}':>18}" for p in pairs)
    )
    for mode in modes:
        row = results["seconds"][mode]  # type: ignore[index]
        ratios = results["ratios"][mode]  # type: ignore[index]
        cells = "".join(f"{row[name]:20.2f}s" for name in jobs)
        print(f"{mode:10}{cells}" + "".join(f"{ratios[p]:17.2f}x" for p in pairs))
        rates = {name: args.files / row[name] for name in jobs}
        print(f"{'  files/s':10}" + "".join(f"{rates[name]:21,.0f}" for name in jobs))


TITLE = "Pack against `tar cf`"


def render(data: Json) -> list[str]:
    """This benchmark's section of docs/benchmarks.md, from its JSON results."""
    out = [
        f"{data['files']:,} files, {data['bytes'] / 1e9:.2f} GB, medians of {data['repeat']} runs in "
        "rotating order. Like is compared with like: `dlfs pack --no-sync` with plain `tar cf` (neither "
        "waits for the disk), `dlfs pack` (fsyncs before publishing) with `tar cf` + `sync`. Ratio: "
        "dlfs time / tar time.",
        "",
    ]
    rows = []
    for mode in ("warm", "cold"):
        s, r = data["seconds"][mode], data["ratios"][mode]
        rows.append(
            [
                mode,
                f"{s['tar cf']:.2f}",
                f"{s['dlfs pack --no-sync']:.2f}",
                f"**{r['no sync']:.2f}{TIMES}**",
                f"{s['tar cf + sync']:.2f}",
                f"{s['dlfs pack']:.2f}",
                f"**{r['sync']:.2f}{TIMES}**",
            ]
        )
    out += table(
        [
            "page cache",
            "tar cf s",
            "dlfs pack --no-sync s",
            "ratio",
            "tar cf + sync s",
            "dlfs pack s",
            "ratio",
        ],
        rows,
    )
    return [*out, ""]


if __name__ == "__main__":
    main()
