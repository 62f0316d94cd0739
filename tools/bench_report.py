#!/usr/bin/env python3
"""Write docs/benchmarks.md from the JSON that ``make bench`` leaves in docs/.

The page is generated, never edited by hand, so that it always shows the last run of every
benchmark and nothing older: a figure that decided a design choice is quoted in docs/design.md
with its reason. Each benchmark tool owns its section (its module's ``TITLE`` and ``render``, fed
the results of its JSON files); this page only gathers them, with the machine and the command
each JSON records. The only fixed text here is what stays true from run to run: the known noise of
the development machine. A benchmark whose JSON is missing gets a line saying so.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchdoc import DASH, Json, describe, missing, table, unwrap

DOCS = Path(__file__).resolve().parent.parent / "docs"

NOISE = """\
The development VM reclaims idle page cache on its own: a DAMON `pageout` scheme pages out unmapped
file pages in regions seen idle for about a minute, and its regions are coarse, so pages just read
into a long-idle region may go too (after reading the 2.2 GB of shards, `cachestat` found 2 pages
missing at once and 91 MB a minute later, with 21 GB free; every deletion came from
`damon_pa_apply_scheme`). "Warm" therefore means *read just before the run*: a few pages may come
from disk anyway. Run to run, the same code varies by about ±15 % in files/s and up to 40 % in the
daemon's CPU per file, so compare figures of one run (each table has its baseline beside it), and
read differences smaller than that as noise. On 2 cores every warm run is CPU-bound: files/s is
about 2 cores divided by the CPU one file costs, which `make bench-read` prints beside it.
"""


@dataclass(frozen=True)
class Section:
    """One ``make`` target's part of the page: the tool module that owns its table, and the JSON
    files it writes, in the order its ``render`` takes their results (the first one required)."""

    target: str
    tool: str
    files: tuple[str, ...]
    #: What else the target writes into docs/, for the table of targets.
    also: str = ""


#: In the order ``make bench`` runs them.
SECTIONS = (
    Section("bench-scale", "bench_scale", ("bench-scale-always.json", "bench-scale-auto.json")),
    Section("bench-pack", "bench_pack", ("bench-pack.json",)),
    Section("bench-read", "bench_read", ("bench-read.json",)),
    Section(
        "bench-jobs", "bench_jobs", ("bench-jobs-warm.json", "bench-jobs-cold.json"), "and their `.png` plots"
    ),
    Section("bench-train", "bench_train", ("bench-train.json",)),
    Section("bench-loader", "bench_loader", ("bench-loader.json", "bench-loader-scaling.json")),
    Section("bench-s3", "bench_s3_table", ("bench-s3.json", "bench-s3-fast.json")),
    Section("bench-transform", "bench_transform", ("bench-transform.json",)),
    Section("bench-bigindex", "bench_bigindex", ("bench-bigindex.json",)),
    Section("bench-packmem", "bench_packmem", ("bench-packmem.json",)),
    Section("bench-archive", "bench_archive", ("bench-archive.json",)),
    Section("bench-archive", "bench_s3_source", ("bench-archive-s3-source.json",)),
    Section("bench-archive", "bench_s3_in_place", ("bench-archive-s3-in-place.json",)),
    Section("bench-archive", "bench_index_scale", ("bench-archive-scale.json",)),
    Section("bench-node", "bench_node", ("bench-node.json",)),
)


@dataclass
class Loaded:
    """A section's documents, read from ``docs``: (machine, command, results) per file, None where
    the file is missing."""

    section: Section
    docs: list[tuple[Json | None, str | None, Any] | None]

    @classmethod
    def read(cls, section: Section, docs: Path) -> Loaded:
        paths = [docs / name for name in section.files]
        return cls(section, [unwrap(json.loads(p.read_text())) if p.exists() else None for p in paths])

    def machines(self) -> list[str]:
        return [describe(doc[0]) for doc in self.docs if doc and doc[0]]


def commands(loaded: list[Loaded]) -> list[str]:
    """The table of targets: what each ran (as its JSON records it) and what it wrote."""
    rows = []
    for entry in loaded:
        ran = [f"`{doc[1]}`" for doc in entry.docs if doc and doc[1]]
        writes = ", ".join(f"`{name}`" for name in entry.section.files)
        rows.append(
            [
                f"`make {entry.section.target}`",
                ", then ".join(ran) or DASH,
                f"{writes} {entry.section.also}".strip(),
            ]
        )
    rows.append(["`make bench-report`", "`tools/bench_report.py`", "`benchmarks.md` (this page)"])
    intro = (
        "Every figure below comes from `make bench` (about an hour and a half; data is generated under "
        "`bench-data/` on first use, ~30 GB), which runs these targets in this order, the last one "
        "writing this page from the JSON the others leave in docs/. Each can be run alone; `make "
        "bench-node` runs on a GPU node, not in `make bench`. A dash: no JSON yet, or one that does not "
        "record its command."
    )
    return [intro, "", *table(["target", "ran", "writes"], rows), ""]


def section(entry: Loaded, usual: str | None) -> list[str]:
    """A section: its title, the machine where it is not the page's, then the tool's own table."""
    tool = importlib.import_module(entry.section.tool)
    out = [f"## {tool.TITLE} (`make {entry.section.target}`)", ""]
    if entry.docs[0] is None:
        return out + missing(entry.section.target, entry.section.files[0])
    others = sorted({m for m in entry.machines() if m != usual})
    if others:
        out += [f"Machine: {'; '.join(others)}.", ""]
    return out + tool.render(*[doc[2] if doc else None for doc in entry.docs])


def render(docs: Path = DOCS) -> str:
    loaded = [Loaded.read(s, docs) for s in SECTIONS]
    machines = Counter(m for entry in loaded for m in entry.machines())
    usual = machines.most_common(1)[0][0] if machines else None
    lines = [
        "# Benchmarks",
        "",
        "Generated by `tools/bench_report.py` from the JSON in this folder; do not edit by hand. Why "
        "each design choice was made, with the measurements that decided it, is in "
        "[design.md](design.md).",
        "",
    ]
    if usual:
        lines += [f"Machine, unless a section names another: {usual}.", ""]
    lines += [*commands(loaded), "## Noise on this machine", "", NOISE]
    for entry in loaded:
        lines += section(entry, usual)
    return "\n".join(lines).rstrip() + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=Path, default=DOCS, help="where the JSON is (default docs/)")
    parser.add_argument("--output", type=Path, default=DOCS / "benchmarks.md")
    args = parser.parse_args()
    args.output.write_text(render(args.docs))


if __name__ == "__main__":
    main()
