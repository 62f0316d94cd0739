"""fio-style micro-benchmarks for dataset trees: the same jobs on any list of roots, side by side.

A root is any directory that presents a dataset tree: the native source, a dlfs mount, a squashfuse or
ratarmount mount. Each job walks or reads the whole tree the way a training job does, with N readers
(threads, or processes like DataLoader workers), and reports files/s, MB/s, per-item latency
percentiles, the CPU time of the readers and of the FUSE daemon serving the root, that daemon's
RSS, and what the block devices behind the root did meanwhile (reads, MB, and like fio's ``util``
the share of the run they had I/O in flight: whether a cold job waited on the disk or on a CPU).
Comparisons are only meaningful within one run, so every root runs every job in the same
process, one after the other, with the page cache dropped before each run when ``cold``.

Jobs:

- ``scan``: what torchvision's ``ImageFolder`` does at construction (class folders, then a sorted
  walk of each); latency is per class folder.
- ``readdir``: list every directory with ``os.scandir`` (names only, like ``find``); per directory.
- ``stat``: ``os.stat`` every file.
- ``seqread`` / ``randread`` / ``orderread``: read every file whole, in tree order / a seeded random
  order / the published order of a dlfs root among the roots (which also arms its read-ahead). The
  same relative sequence is used on every root, so each reads the same files in the same order.
  A run's clock starts when its readers are ready, before a dlfs root's order file is read again:
  the read-ahead gets no head start over the other roots.

With N readers, reader k takes items k, k+N, ... of the sequence, so together they advance through it
the way DataLoader workers do. fio is not driven: with ``--opendir`` it reads whole blocks only and
skips files smaller than the block, which is not what a loader does.
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import resource
import stat
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dlfs.errors import DlfsError

log = logging.getLogger(__name__)

JOBS = ("scan", "readdir", "stat", "seqread", "randread", "orderread")
READ_JOBS = ("seqread", "randread", "orderread")
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
#: How long readers wait at the start line, so none is timed while the others are still starting.
START_TIMEOUT = 60.0
#: How long a run waits for a dlfs root to finish listing in the background (1.28 M files: ~6 s).
IDLE_TIMEOUT = 600.0


class BenchError(DlfsError):
    """A benchmark cannot run as asked: a root is missing, caches cannot be dropped, no order."""


def imagefolder_scan(root: str) -> int:
    """What torchvision's ImageFolder does at construction: find_classes, then make_dataset."""
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    return sum(scan_class(os.path.join(root, name)) for name in classes)


def scan_class(folder: str) -> int:
    """make_dataset for one class: a sorted ``os.walk`` and an extension check, no stat of the files."""
    count = 0
    for parent, _, files in sorted(os.walk(folder, followlinks=True)):
        for name in sorted(files):
            if os.path.join(parent, name).lower().endswith(IMAGE_EXTENSIONS):
                count += 1
    return count


@dataclass(frozen=True)
class Tree:
    """What one root holds, relative to it: class folders, every directory, regular files sorted."""

    classes: list[str]
    directories: list[str]
    files: list[str]

    @classmethod
    def walk(cls, root: str) -> Tree:
        """One untimed walk; a dlfs root's hidden control tree is never part of the dataset."""
        directories, files = [""], []
        stack = [""]
        while stack:
            rel = stack.pop()
            with os.scandir(os.path.join(root, rel)) as entries:
                for entry in entries:
                    path = rel + entry.name
                    if entry.is_dir(follow_symlinks=False):
                        if path != ".dlfs":
                            directories.append(path)
                            stack.append(path + "/")
                    elif entry.is_file():
                        files.append(path)
        classes = sorted(d for d in directories if d and "/" not in d)
        return cls(classes, sorted(directories), sorted(files))


# -- the work of one reader: a pure loop over its share, timing each item -----------------------


def _do_scan(root: str, item: str) -> int:
    scan_class(os.path.join(root, item))
    return 0


def _do_readdir(root: str, item: str) -> int:
    with os.scandir(os.path.join(root, item)) as entries:
        for _ in entries:
            pass
    return 0


def _do_stat(root: str, item: str) -> int:
    os.stat(os.path.join(root, item))
    return 0


def _do_read(root: str, item: str) -> int:
    # Unbuffered, as dlfs.torch.pil_loader reads: Python's buffered open() adds an isatty() ioctl,
    # which costs every FUSE filesystem a round trip per file and says nothing about its storage.
    with open(os.path.join(root, item), "rb", buffering=0) as f:
        return len(f.readall())


WORK: dict[str, Callable[[str, str], int]] = {
    "scan": _do_scan,
    "readdir": _do_readdir,
    "stat": _do_stat,
    **dict.fromkeys(READ_JOBS, _do_read),
}


@dataclass
class _Share:
    """One reader's result: per-item latencies, bytes read, when it finished, its own CPU time."""

    latencies: list[float]
    nbytes: int
    finished: float
    cpu: float


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _run_share(job: str, root: str, items: Sequence[str], start: Callable[[], object], who: int) -> _Share:
    work = WORK[job]
    start()
    cpu = _cpu(who)
    latencies = []
    nbytes = 0
    clock = time.perf_counter
    for item in items:
        began = clock()
        nbytes += work(root, item)
        latencies.append(clock() - began)
    return _Share(latencies, nbytes, clock(), _cpu(who) - cpu)


def _process_reader(job: str, root: str, items: Sequence[str], barrier: Any, conn: Any) -> None:
    try:
        share = _run_share(job, root, items, lambda: _meet(barrier), resource.RUSAGE_SELF)
        conn.send(share)
    except BaseException as exc:
        conn.send(exc)
        raise


def _meet(barrier: Any) -> None:
    """A reader's side of the start: ready (spawned, waiting), then released together."""
    barrier.wait(START_TIMEOUT)
    barrier.wait(START_TIMEOUT)


def _run_readers(
    job: str, root: str, items: Sequence[str], readers: int, processes: bool, arm: Callable[[], object]
) -> tuple[float, list[_Share]]:
    """Run ``readers`` readers over ``items`` from one start line; (seconds, each reader's share).

    The clock starts once every reader is spawned and waiting, and before ``arm`` (reading a dlfs
    root's published order, which starts its read-ahead): a read-ahead armed before the clock would
    get a head start no other root gets (it was 0.4-2 s of fetching, 20 % of a cold epoch).
    """
    shares: list[_Share | BaseException] = []
    if processes:
        ctx = mp.get_context("fork")
        barrier: Any = ctx.Barrier(readers + 1)
        pipes = [ctx.Pipe(duplex=False) for _ in range(readers)]
        workers: list[Any] = [
            ctx.Process(target=_process_reader, args=(job, root, items[k::readers], barrier, pipes[k][1]))
            for k in range(readers)
        ]
    else:
        barrier = threading.Barrier(readers + 1)

        def thread_reader(k: int) -> None:
            try:
                shares.append(
                    _run_share(job, root, items[k::readers], lambda: _meet(barrier), resource.RUSAGE_THREAD)
                )
            except BaseException as exc:
                shares.append(exc)

        workers = [threading.Thread(target=thread_reader, args=(k,)) for k in range(readers)]
    for worker in workers:
        worker.start()
    barrier.wait(START_TIMEOUT)
    started = time.perf_counter()
    try:
        arm()
    except BaseException:
        barrier.abort()  # the readers give up at once instead of waiting out START_TIMEOUT
        for worker in workers:
            worker.join()
        raise
    barrier.wait(START_TIMEOUT)
    if processes:
        shares = [recv.recv() for recv, _ in pipes]
    for worker in workers:
        worker.join()
    for share in shares:
        if isinstance(share, BaseException):
            raise BenchError(f"{job} on {root} failed: {share}") from share
    done = [s for s in shares if isinstance(s, _Share)]
    return max(s.finished for s in done) - started, done


# -- the FUSE daemon behind a root ---------------------------------------------------------------


def proc_cpu(pid: int) -> float:
    """User + system seconds of a process and all its threads, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def block_devices(root: str, pid: int | None) -> list[Path]:
    """The sysfs ``stat`` file of each block device a root's bytes come from: its own filesystem's,
    or for a FUSE root (``pid``: its daemon), those of the files the daemon holds open (dlfs's
    shards, a squashfs image, a tar). Empty for memory-backed filesystems, and for a daemon whose
    descriptors this user may not see."""
    try:
        paths = [root] if pid is None else [fd.path for fd in os.scandir(f"/proc/{pid}/fd")]
    except OSError:
        return []
    devices = set()
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:  # closed since it was listed
            continue
        if pid is None or stat.S_ISREG(st.st_mode):
            devices.add(st.st_dev)
    found = (Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat") for dev in sorted(devices))
    return [path for path in found if path.exists()]


def _disk_counters(devices: list[Path]) -> np.ndarray:
    """Per device: reads completed, sectors read, milliseconds with I/O in flight (the kernel's
    Documentation/block/stat.rst, fields 1, 3 and 10)."""
    fields = [path.read_text().split() for path in devices]
    return np.array([[int(f[0]), int(f[2]), int(f[9])] for f in fields], dtype=np.int64).reshape(-1, 3)


def daemon_pid(root: str) -> int | None:
    """The process serving the FUSE mount at ``root``: it holds /dev/fuse and names ``root`` in argv.

    The kernel does not say which process serves a mount, but every FUSE daemon in use (dlfs,
    squashfuse_ll, ratarmount) is started with the mountpoint as an argument, relative to its cwd.
    """
    target = os.path.realpath(root)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            args = Path(entry.path, "cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(os.path.join(entry.path, "cwd"))
            named = any(os.path.realpath(os.path.join(cwd, os.fsdecode(a))) == target for a in args if a)
            if named and any(
                os.readlink(fd.path) == "/dev/fuse" for fd in os.scandir(os.path.join(entry.path, "fd"))
            ):
                return int(entry.name)
        except OSError:
            continue
    return None


# -- runs, repeats, roots ------------------------------------------------------------------------


@dataclass(frozen=True)
class Root:
    label: str
    path: str

    @classmethod
    def parse(cls, text: str) -> Root:
        """``PATH`` or ``LABEL=PATH``; an unlabelled root is named after its filesystem type."""
        label, sep, path = text.partition("=")
        if not sep:
            label, path = "", text
        if not os.path.isdir(path):
            raise BenchError(f"{path}: not a directory; give a dataset tree or a mounted dataset")
        return cls(label or _fstype_label(path), path)


def _fstype_label(path: str) -> str:
    from dlfs.mount import mounted_fstype

    fstype = mounted_fstype(path)
    if fstype is None:
        return "native"
    return fstype.removeprefix("fuse.").removeprefix("fuseblk.")


@dataclass
class Options:
    jobs: Sequence[str] = JOBS
    readers: int = 1
    processes: bool = True
    cold: bool = False
    repeat: int = 1
    seed: int = 0
    epoch: int = 0


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


DROP_CACHES = "/proc/sys/vm/drop_caches"


def check_can_drop_caches() -> None:
    if not os.access(DROP_CACHES, os.W_OK):
        raise BenchError(
            f"--cold needs to write {DROP_CACHES} (permission denied); run as root or drop --cold"
        )


def drop_caches() -> None:
    """Drop the page, dentry and inode caches: what a cold run starts from."""
    subprocess.run(["sync"], check=True)
    Path(DROP_CACHES).write_text("3\n")


def _order_file(root: Root, epoch: int) -> Path:
    return Path(root.path, ".dlfs", "order", f"epoch-{epoch}")


def _is_dlfs(root: Root) -> bool:
    """A dlfs mount, told by its config file: resolving an order file would arm the read-ahead."""
    return Path(root.path, ".dlfs", "config").is_file()


def _first_dlfs(roots: Sequence[Root]) -> Root:
    for root in roots:
        if _is_dlfs(root):
            return root
    raise BenchError("orderread needs a dlfs mount among the roots: its published order is what is read")


def published_order(roots: Sequence[Root], epoch: int) -> list[str]:
    """Epoch ``epoch``'s order from the first dlfs root; reading it arms that mount's read-ahead."""
    from dlfs.control import parse_order

    return parse_order(_order_file(_first_dlfs(roots), epoch).read_bytes())


def wait_idle(root: str, timeout: float = IDLE_TIMEOUT) -> float:
    """Wait until a dlfs mount has no folder left to list in the background; returns the seconds
    waited (0 for any other root).

    After a scan of the whole tree under ``--readdirplus auto`` the daemon lists every folder again
    with attributes, for the read-ahead: work a training job overlaps with its setup, and that the
    next run of a benchmark must not pay for.
    """
    stats = Path(root, ".dlfs", "stats")
    started = time.monotonic()
    if not stats.is_file():
        return 0.0
    while json.loads(stats.read_bytes()).get("listing_folders", 0):
        if time.monotonic() - started > timeout:
            raise BenchError(f"the mount on {root} was still listing folders after {timeout:g} s")
        time.sleep(0.02)
    return time.monotonic() - started


def run_once(root: Root, job: str, items: Sequence[str], options: Options) -> dict[str, float]:
    """One timed pass of ``job`` over ``items`` on ``root``: throughput, latency, CPU, daemon RSS,
    and the disk figures where the root sits on block devices. A dlfs root's background listing
    (see ``wait_idle``) ends first."""
    waited = wait_idle(root.path)
    if options.cold:
        drop_caches()
    pid = daemon_pid(root.path)
    rss_before = proc_rss(pid) if pid else 0
    devices = block_devices(root.path, pid)

    def arm() -> None:  # re-arms a dlfs root's read-ahead, as the sampler does
        if job == "orderread" and _is_dlfs(root):
            _order_file(root, options.epoch).read_bytes()

    disk = _disk_counters(devices)
    daemon_cpu = proc_cpu(pid) if pid else 0.0
    seconds, shares = _run_readers(job, root.path, items, options.readers, options.processes, arm)
    disk = _disk_counters(devices) - disk
    latencies = np.fromiter((x for s in shares for x in s.latencies), dtype=np.float64) * 1e6
    p50, p99, p999 = np.percentile(latencies, [50, 99, 99.9]) if latencies.size else (0.0, 0.0, 0.0)
    nbytes = sum(s.nbytes for s in shares)
    run = {
        "seconds": seconds,
        "items_per_s": len(items) / seconds,
        "mb_per_s": nbytes / seconds / 1e6,
        "bytes": float(nbytes),
        "p50_us": float(p50),
        "p99_us": float(p99),
        "p999_us": float(p999),
        "reader_cpu_s": sum(s.cpu for s in shares),
    }
    if pid:
        run |= {
            "daemon_cpu_s": proc_cpu(pid) - daemon_cpu,
            "daemon_rss_before": float(rss_before),
            "daemon_rss_after": float(proc_rss(pid)),
            "waited_for_background_s": waited,
        }
    if devices:  # the busiest device's share of the run with I/O in flight, as fio's util
        run |= {
            "disk_reads": float(disk[:, 0].sum()),
            "disk_read_mb": float(disk[:, 1].sum()) * 512 / 1e6,
            "disk_busy": min(float(disk[:, 2].max()) / 1e3 / seconds, 1.0),
        }
    return run


def job_items(job: str, tree: Tree, order: list[str] | None, seed: int) -> list[str]:
    if job == "scan":
        return tree.classes
    if job == "readdir":
        return tree.directories
    if job in ("stat", "seqread"):
        return tree.files
    if job == "randread":
        rng = np.random.default_rng(seed)
        return [tree.files[i] for i in rng.permutation(len(tree.files))]
    assert order is not None
    return order


def run(
    roots: Sequence[Root], options: Options, progress: Callable[[Result], None] | None = None
) -> list[Result]:
    """Every job on every root, ``repeat`` times each; the jobs outermost so roots alternate."""
    unknown = set(options.jobs) - set(JOBS)
    if unknown:
        raise BenchError(f"unknown job(s) {', '.join(sorted(unknown))}; choose from {', '.join(JOBS)}")
    if options.readers < 1 or options.repeat < 1:
        raise BenchError("--readers and --repeat must be at least 1")
    if options.cold:
        check_can_drop_caches()
    trees = {root.path: Tree.walk(root.path) for root in roots}
    if "orderread" in options.jobs:
        _first_dlfs(roots)  # fail early when there is no order to follow, without arming anything
    order = None
    results = []
    for job in options.jobs:
        if job == "orderread" and order is None:
            # Read only now: reading it arms a dlfs root's read-ahead, which must not work during
            # the jobs before this one.
            order = published_order(roots, options.epoch)
        for root in roots:
            items = job_items(job, trees[root.path], order, options.seed)
            if not items:
                raise BenchError(f"{root.path}: nothing for {job} to do (no files or class folders)")
            result = Result(root.label, root.path, job, options.readers, len(items))
            for _ in range(options.repeat):
                result.runs.append(run_once(root, job, items, options))
            log.debug("%s on %s: %s", job, root.label, result.median)
            if progress:
                progress(result)
            results.append(result)
    return results


# -- reporting -------------------------------------------------------------------------------------


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
        raise BenchError("--plot needs matplotlib: pip install 'dlfs[bench]'") from exc
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
