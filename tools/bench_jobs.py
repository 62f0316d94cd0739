"""The table of ``make bench-jobs`` in docs/benchmarks.md, from the JSON ``dlfs bench --peers --json``
writes: that benchmark's tool is the command itself, so its table lives here, beside the others'."""

from __future__ import annotations

from benchdoc import DASH, Json, missing, number, ratio, table

TITLE = "Side by side with the peers"


JOB_ROOTS = ("native", "dlfs", "squashfuse_ll", "ratarmount")


def render(warm: Json, cold: Json | None) -> list[str]:
    """The section of docs/benchmarks.md: warm runs, and cold ones where those were run too."""
    opts = warm["options"]
    peers = ", ".join(
        f"{name} {p['build_seconds']:.1f} s ({p['image_bytes'] / 1e9:.2f} GB)"
        for name, p in warm["peers"].items()
    )
    out = [
        f"`dlfs bench --peers` on the 20k-JPEG tree of `make bench-read`, {opts['readers']} "
        f"{'processes' if opts['processes'] else 'threads'}, median of {opts['repeat']} runs (min{DASH}max). "
        f"Images built by `--peers`: {peers}. Items are class folders for `scan`, directories for "
        "`readdir`, files otherwise. `orderread` reads the published order of the dlfs root on every "
        "root (reading it arms dlfs's read-ahead, inside the clock). `disk %` is the busiest device's "
        "busy share of the run (fio's `util`): a cold job near 90 % waited on the disk, one near 50 % on "
        "a CPU.",
        "",
    ]
    for label, data, plot in (
        ("Warm (nothing dropped between runs)", warm, "bench-jobs-warm.png"),
        ("Cold (page cache dropped before every run)", cold, "bench-jobs-cold.png"),
    ):
        out += [f"### {label}", ""]
        if not data:
            out += missing("bench-jobs", plot.replace(".png", ".json"))
            continue
        by = {(r["root"], r["job"]): r for r in data["results"]}
        roots = [r for r in JOB_ROOTS if any(k[0] == r for k in by)]
        rows = []
        for job in data["options"]["jobs"]:
            cells = []
            for root in roots:
                r = by.get((root, job))
                if not r:
                    cells.append(DASH)
                    continue
                cell = (
                    f"{number(r['median']['items_per_s'])} "
                    f"({number(r['min']['items_per_s'])}{DASH}{number(r['max']['items_per_s'])})"
                )
                if data["options"]["cold"]:
                    cell += f", disk {r['median']['disk_busy']:.0%}"
                cells.append(cell)
            dlfs, nat, sq = by.get(("dlfs", job)), by.get(("native", job)), by.get(("squashfuse_ll", job))
            vs = [
                ratio(dlfs["median"]["items_per_s"], other["median"]["items_per_s"])
                if dlfs and other
                else DASH
                for other in (nat, sq)
            ]
            rows.append([f"`{job}`", *cells, *vs])
        out += table(["items/s", *roots, "dlfs / native", "dlfs / squashfuse_ll"], rows)
        out += ["", f"Plot (items/s and p50/p99 latency per root): [{plot}]({plot})", ""]
    return out
