"""Results and their reports: one job on one root over its repeats, as JSON, a table or plots."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dlfs.bench.errors import BenchError


def median_runs(runs: Sequence[dict[str, float]]) -> dict[str, float]:
    """Per figure, the median over runs (every run has the same keys)."""
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


@dataclass
class Result:
    """One job on one root: the median of ``repeat`` runs, and every run in ``runs``."""

    root: str
    path: str
    job: str
    readers: int
    items: int
    runs: list[dict[str, float]] = field(default_factory=list)

    @property
    def median(self) -> dict[str, float]:
        return median_runs(self.runs)

    def spread(self, key: str) -> tuple[float, float]:
        values = [run[key] for run in self.runs]
        return min(values), max(values)

    def to_dict(self) -> dict[str, object]:
        return {
            "root": self.root,
            "path": self.path,
            "job": self.job,
            "readers": self.readers,
            "items": self.items,
            "median": self.median,
            "min": {key: self.spread(key)[0] for key in self.runs[0]},
            "max": {key: self.spread(key)[1] for key in self.runs[0]},
            "runs": self.runs,
        }


def table(results: Sequence[Result]) -> str:
    """A fixed-width table: medians, with the min-max of items/s when repeated."""
    head = (
        f"{'job':10}{'root':16}{'items':>9}{'items/s':>11}{'(min-max)':>20}{'MB/s':>9}"
        f"{'p50 us':>9}{'p99 us':>9}{'p99.9 us':>10}{'cpu rd s':>9}{'cpu fs s':>9}{'fs RSS MiB':>11}"
        f"{'disk %':>7}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        m = r.median
        low, high = r.spread("items_per_s")
        spread = f"{low:,.0f}-{high:,.0f}" if len(r.runs) > 1 else ""
        daemon = (
            f"{m['daemon_cpu_s']:9.2f}{m['daemon_rss_after'] / 2**20:11.1f}"
            if "daemon_cpu_s" in m
            else f"{'-':>9}{'-':>11}"
        )
        lines.append(
            f"{r.job:10}{r.root[:15]:16}{r.items:9,}{m['items_per_s']:11,.0f}{spread:>20}{m['mb_per_s']:9,.1f}"
            f"{m['p50_us']:9,.0f}{m['p99_us']:9,.0f}{m['p999_us']:10,.0f}{m['reader_cpu_s']:9.2f}{daemon}"
            + (f"{100 * m['disk_busy']:7.0f}" if "disk_busy" in m else f"{'-':>7}")
        )
    return "\n".join(lines)


def plot(results: Sequence[Result], out: str) -> None:
    """Bar charts per job: items/s (with the min-max as error bars) and p50/p99 latency per root."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise BenchError("--plot needs matplotlib: pip install 'dlfs-data[bench]'") from exc
    jobs = list(dict.fromkeys(r.job for r in results))
    fig, axes = plt.subplots(len(jobs), 2, figsize=(11, 2.8 * len(jobs)), squeeze=False)
    for row, job in enumerate(jobs):
        rows = [r for r in results if r.job == job]
        labels = [r.root for r in rows]
        x = np.arange(len(rows))
        rate = [r.median["items_per_s"] for r in rows]
        low = [rate[i] - r.spread("items_per_s")[0] for i, r in enumerate(rows)]
        high = [r.spread("items_per_s")[1] - rate[i] for i, r in enumerate(rows)]
        unit = "class folders" if job == "scan" else "directories" if job == "readdir" else "files"
        axes[row][0].bar(x, rate, yerr=[low, high], color="tab:blue", capsize=3)
        axes[row][0].set_title(f"{job}: {unit}/s ({rows[0].readers} readers)")
        axes[row][1].bar(x - 0.2, [r.median["p50_us"] for r in rows], 0.4, label="p50")
        axes[row][1].bar(x + 0.2, [r.median["p99_us"] for r in rows], 0.4, label="p99")
        axes[row][1].set_title(f"{job}: latency per item, us")
        axes[row][1].legend()
        for ax in axes[row]:
            ax.set_xticks(x, labels)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
