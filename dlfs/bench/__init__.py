"""fio-style micro-benchmarks for dataset trees: the same jobs on any list of roots, side by side.

A root (``roots``) is any directory that presents a dataset tree: the native source, a dlfs mount,
a squashfuse or ratarmount mount. Each job (``jobs``) walks or reads the whole tree the way a
training job does, with N readers (``readers``: threads, or processes like DataLoader workers),
and the runner (``runner``) reports files/s, MB/s, per-item latency percentiles, the CPU time of
the readers and of the FUSE daemon serving the root, that daemon's RSS, and what the block devices
behind the root did meanwhile (``probes``). ``report`` turns results into a table or plots;
``peers`` builds and mounts the other tools next to dlfs.

fio is not driven: with ``--opendir`` it reads whole blocks only and skips files smaller than the
block, which is not what a loader does.
"""

from dlfs.bench.errors import BenchError
from dlfs.bench.jobs import JOBS, READ_JOBS, Tree, imagefolder_scan, job_items
from dlfs.bench.probes import block_devices, proc_cpu, proc_rss
from dlfs.bench.readers import START_TIMEOUT
from dlfs.bench.report import Result, median_runs, plot, table
from dlfs.bench.roots import Root, published_order, wait_idle
from dlfs.bench.runner import DROP_CACHES, Options, check_can_drop_caches, drop_caches, run, run_once

__all__ = [
    "DROP_CACHES",
    "JOBS",
    "READ_JOBS",
    "START_TIMEOUT",
    "BenchError",
    "Options",
    "Result",
    "Root",
    "Tree",
    "block_devices",
    "check_can_drop_caches",
    "drop_caches",
    "imagefolder_scan",
    "job_items",
    "median_runs",
    "plot",
    "proc_cpu",
    "proc_rss",
    "published_order",
    "run",
    "run_once",
    "table",
    "wait_idle",
]
