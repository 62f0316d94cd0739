"""The benchmark document: what every benchmark tool writes, and the Markdown its table is made of.

Every tool's ``--json`` prints one document, ``{"machine": ..., "command": ..., "results": ...}``:
the figures alone say nothing once the page is read on another machine or a month later, so the
machine they came from and the command that made them travel with them. Each tool owns the table
``tools/bench_report.py`` puts into docs/benchmarks.md (its ``render``), written with the helpers
below so that every table reads alike.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Any

Json = dict[str, Any]
TIMES, DASH = "\u00d7", "\u2013"
REPO = Path(__file__).resolve().parent.parent


def machine() -> Json:
    """Cores, memory, kernel, Python and the FUSE binding of the machine running the benchmark."""
    memory = 0
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                memory = int(line.split()[1]) * 1024
    try:
        import pyfuse3

        fuse = pyfuse3.__version__
    except ImportError:
        fuse = None
    return {
        "cores": os.cpu_count(),
        "memory_bytes": memory,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "pyfuse3": fuse,
    }


def command() -> str:
    """The command line that is running, its script named relative to the repository."""
    script = Path(sys.argv[0]).resolve()
    name = str(script.relative_to(REPO)) if script.is_relative_to(REPO) else sys.argv[0]
    return shlex.join([name, *sys.argv[1:]])


def document(results: object, **facts: object) -> Json:
    """The document of a run; ``facts`` about the machine add to what ``machine`` finds (a GPU)."""
    return {"machine": machine() | facts, "command": command(), "results": results}


def print_document(results: object) -> None:
    """The tool's ``--json`` output (numpy scalars written as floats)."""
    print(json.dumps(document(results), indent=2, default=float))


def unwrap(doc: Json) -> tuple[Json | None, str | None, Any]:
    """(machine, command, results) of a document; JSON written before documents recorded the
    machine and the command (``dlfs bench --json`` among them) is all results."""
    if "machine" in doc and "command" in doc and "results" in doc:
        return doc["machine"], doc["command"], doc["results"]
    return None, None, doc


def describe(facts: Json) -> str:
    """One line for a machine: what a reader needs to compare a figure with their own."""
    parts = [
        f"{facts['cores']} cores",
        f"{facts['memory_bytes'] / 2**30:.0f} GiB RAM",
        f"Linux {facts['kernel']}",
        f"Python {facts['python']}",
    ]
    if facts.get("gpu"):
        parts.append(facts["gpu"])
    if facts.get("pyfuse3"):
        parts.append(f"pyfuse3 {facts['pyfuse3']}")
    return ", ".join(parts)


def number(value: float, digits: int = 0) -> str:
    return f"{value:,.{digits}f}"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}{TIMES}" if b else DASH


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def missing(target: str, name: str) -> list[str]:
    return [f"Not run yet: `make {target}` writes `docs/{name}`.", ""]
