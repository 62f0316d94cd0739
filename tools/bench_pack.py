#!/usr/bin/env python3
"""Pack speed against ``tar cf`` of the same tree, in one run, warm and cold page cache.

dlfs pack checksums every file and fsyncs shards and index before publishing; tar does neither, so
the table also shows ``tar cf`` followed by ``sync`` (the same durability). Medians of --repeat runs,
run in alternation so drift affects both sides alike.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import DLFS, can_drop_caches, drop_caches, ensure_tree, timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--work", type=Path, default=Path("bench-data/pack"))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=8)
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

    def run_pack() -> None:
        subprocess.run(
            [*DLFS, "-q", "pack", str(src), str(out), "--jobs", str(args.jobs)],
            check=True,
            capture_output=True,
        )

    jobs = {"tar cf": lambda: run_tar(False), "tar cf + sync": lambda: run_tar(True), "dlfs pack": run_pack}
    modes = ["warm", *(["cold"] if can_drop_caches() else [])]
    times: dict[str, dict[str, list[float]]] = {mode: {name: [] for name in jobs} for mode in modes}
    for job in jobs.values():  # one untimed pass each so the warm runs start warm
        clear()
        job()
    for mode in modes:
        for _ in range(args.repeat):
            for name, job in jobs.items():
                clear()
                if mode == "cold":
                    drop_caches()
                times[mode][name].append(timed(job)[0])
    shutil.rmtree(out, ignore_errors=True)

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    results = {
        "files": args.files,
        "bytes": total,
        "repeat": args.repeat,
        "seconds": {mode: {name: median(v) for name, v in by.items()} for mode, by in times.items()},
        "all": times,
    }
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"\n{args.files:,} files, {total / 1e9:.2f} GB, median of {args.repeat}")
    print(f"{'':16}" + "".join(f"{name:>16}" for name in jobs) + f"{'pack / tar':>12}{'pack / tar+sync':>17}")
    for mode in modes:
        row = results["seconds"][mode]  # type: ignore[index]
        cells = "".join(f"{row[name]:15.2f}s" for name in jobs)
        print(
            f"{mode:16}{cells}{row['dlfs pack'] / row['tar cf']:11.2f}x"
            f"{row['dlfs pack'] / row['tar cf + sync']:16.2f}x"
        )
        rates = {name: args.files / row[name] for name in jobs}
        print(f"{'  files/s':16}" + "".join(f"{rates[name]:16,.0f}" for name in jobs))


if __name__ == "__main__":
    main()
