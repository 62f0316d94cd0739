"""``dlfs bench``: every job on a native tree, a real dlfs mount and the real peers, read back exactly."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from commands import TOOLS, assert_one_line_error, dlfs, tool
from mounts import is_mounted
from trees import write
from waits import bound

from dlfs import bench
from dlfs.bench import runner

CLASSES, PER_CLASS = 5, 30
ALL_JOBS = ",".join(bench.JOBS)
#: CPU seconds a second of wall time can hold at most.
CPUS = len(os.sched_getaffinity(0))


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ImageNet-shaped folders with files of varied size, plus a nested folder and a non-image."""
    root = tmp_path_factory.mktemp("bench") / "src"
    rng = random.Random(3)
    for c in range(CLASSES):
        for k in range(PER_CLASS):
            write(root / f"n{c:08d}" / f"n{c:08d}_{k}.JPEG", rng.randbytes(rng.randrange(0, 40_000)))
    write(root / "n00000000" / "extra" / "deep.JPEG", b"deep")
    write(root / "n00000001" / "notes.txt", b"not an image")
    return root


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def by_job(report: dict) -> dict[str, dict[str, dict]]:
    out: dict[str, dict[str, dict]] = {}
    for result in report["results"]:
        out.setdefault(result["job"], {})[result["root"]] = result
    return out


@pytest.mark.parametrize("workers", ["process", "thread"])
def test_every_job_counts_the_same_work_on_native_and_dlfs(tree: Path, pack_and_mount, workers: str) -> None:
    files = sum(1 for p in tree.rglob("*") if p.is_file())
    with pack_and_mount(tree) as mnt:
        out = dlfs(
            "bench",
            tree,
            f"mine={mnt}",
            "--job",
            ALL_JOBS,
            "--readers",
            "3",
            "--workers",
            workers,
            "--repeat",
            "2",
            "--json",
        )
    report = json.loads(out.stdout)
    jobs = by_job(report)
    assert list(jobs) == list(bench.JOBS)
    expected_items = {"scan": CLASSES, "readdir": CLASSES + 2, "stat": files}
    for job, roots in jobs.items():
        assert set(roots) == {"native", "mine"}
        for label, result in roots.items():
            assert result["items"] == expected_items.get(job, files), (job, label)
            assert len(result["runs"]) == 2
            assert (
                result["min"]["items_per_s"]
                <= result["median"]["items_per_s"]
                <= result["max"]["items_per_s"]
            )
            assert result["median"]["items_per_s"] > 0 and result["median"]["p50_us"] > 0
            # The daemon's figures appear exactly for the FUSE root.
            assert ("daemon_cpu_s" in result["median"]) == (label == "mine")
            if job in bench.READ_JOBS:
                assert all(run["bytes"] == tree_bytes(tree) for run in result["runs"]), (job, label)
    assert jobs["orderread"]["mine"]["median"]["daemon_rss_after"] > 0


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A filesystem on a block device of its own: a loop-mounted ext4 image (tools/slowdisk.py,
    unthrottled: no process enters its cgroup)."""
    mnt = tmp_path / "disk"
    tool(TOOLS / "slowdisk.py", "up", mnt, "--size", "64M")
    try:
        yield mnt
    finally:
        tool(TOOLS / "slowdisk.py", "down", mnt)


def test_disk_figures_count_what_the_root_read_from_its_device(tree: Path, disk: Path, mount: object) -> None:
    """A native tree and a dlfs mount of shards on one device: a cold read of either shows the
    device reading at least the tree's bytes; a root in memory has no disk figures."""
    shutil.copytree(tree, disk / "src")
    dlfs("pack", disk / "src", disk / "dataset")
    items = bench.Tree.walk(str(tree)).files
    cold = bench.Options(cold=True)
    with mount(disk / "dataset", "--readahead-budget", "0") as mnt:  # type: ignore[operator]
        runs = {
            root: bench.run_once(bench.Root(root, str(path)), "seqread", items, cold)
            for root, path in {"native": disk / "src", "dlfs": mnt}.items()
        }
    for root, run in runs.items():
        assert run["disk_read_mb"] * 1e6 >= tree_bytes(tree), (root, run)
        assert run["disk_reads"] > 0 and 0 <= run["disk_busy"] <= 1, (root, run)
    # The kernel adds busy time in whole jiffies, at I/O boundaries: one 0.12 s run of 273 fast
    # loop-device reads once showed none. Two runs that both show none would mean it is not read.
    assert max(run["disk_busy"] for run in runs.values()) > 0, runs
    assert bench.block_devices(str(disk), None)[0].parent.name == (
        f"{os.major(disk.stat().st_dev)}:{os.minor(disk.stat().st_dev)}"
    )
    in_memory = bench.run_once(bench.Root("proc", "/proc/self"), "stat", ["status"], bench.Options())
    assert "disk_busy" not in in_memory


def test_orderread_follows_the_published_order(tree: Path, pack_and_mount) -> None:
    with pack_and_mount(tree, "--seed", "9") as mnt:
        roots = [bench.Root.parse(str(tree)), bench.Root.parse(str(mnt))]
        assert [root.label for root in roots] == ["native", "dlfs"]
        order = bench.published_order(roots, epoch=1)
        tree_order = bench.Tree.walk(str(mnt)).files
        assert sorted(order) == tree_order and order != tree_order
        assert bench.job_items("orderread", bench.Tree.walk(str(tree)), order, 0) == order
        assert bench.job_items("randread", bench.Tree.walk(str(tree)), order, 0) != tree_order


def test_cold_runs_and_plot(tree: Path, tmp_path: Path) -> None:
    png = tmp_path / "bench.png"
    out = dlfs("bench", tree, "--job", "scan,seqread", "--cold", "--repeat", "1", "--plot", png)
    assert "cold (page cache dropped before each run)" in out.stdout
    assert [line.split()[0] for line in out.stdout.splitlines()[3:]] == ["scan", "seqread"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_peers_are_built_mounted_measured_and_unmounted(tree: Path, tmp_path: Path) -> None:
    work = tmp_path / "peers"
    out = dlfs(
        "bench",
        tree,
        "--peers",
        "--work",
        work,
        "--job",
        "stat,orderread",
        "--readers",
        "2",
        "--repeat",
        "1",
        "--json",
        timeout=300,
    )
    report = json.loads(out.stdout)
    assert set(report["peers"]) == {"dlfs", "squashfuse_ll", "ratarmount"}
    for job, roots in by_job(report).items():
        assert list(roots) == ["native", "dlfs", "squashfuse_ll", "ratarmount"], job
        if job == "orderread":
            assert {result["median"]["bytes"] for result in roots.values()} == {tree_bytes(tree)}
        # Every peer's daemon is found, so its CPU and RSS are reported.
        assert all(roots[peer]["median"]["daemon_rss_after"] > 0 for peer in report["peers"]), job
    for peer in report["peers"]:
        assert not is_mounted(work / peer / "mnt")
    # A second run reuses the images (same source); the stamps say when each was built.
    stamps = {peer: (work / peer / "stamp.json").stat().st_mtime_ns for peer in report["peers"]}
    dlfs("bench", tree, "--peers", "--work", work, "--job", "scan", "--repeat", "1", timeout=300)
    assert stamps == {peer: (work / peer / "stamp.json").stat().st_mtime_ns for peer in stamps}


def test_user_errors_are_one_line(tree: Path, tmp_path: Path) -> None:
    assert_one_line_error(dlfs("bench", tree, "--job", "orderread", check=False), "need a dlfs mount")
    assert_one_line_error(dlfs("bench", tmp_path / "nope", check=False), "not a directory")
    assert_one_line_error(dlfs("bench", tree, "--job", "scan,fly", check=False), "unknown job", "fly")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_one_line_error(dlfs("bench", empty, "--job", "stat", check=False), "nothing for stat")


def test_cold_without_permission_says_so() -> None:
    as_nobody = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        sys.executable,
        "-m",
        "dlfs.cli",
    ]
    result = subprocess.run(
        [*as_nobody, "bench", "/tmp", "--cold", "--job", "scan"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd="/",
    )
    assert_one_line_error(result, "drop_caches", "run as root or drop --cold")


def test_jobs_before_orderread_run_without_the_read_ahead(tree: Path, pack_and_mount) -> None:
    armed = {}
    with pack_and_mount(tree) as mnt:

        def progress(result: bench.Result) -> None:
            armed[result.job] = json.loads((mnt / ".dlfs" / "stats").read_text())["readahead"]["readings"]

        bench.run(
            [bench.Root.parse(str(mnt))], bench.Options(jobs=["stat", "orderread"], readers=2), progress
        )
    assert armed["stat"] == {} and list(armed["orderread"]) == ["epoch-0.rank-0-of-1"]


def test_a_run_starts_once_the_mount_is_done_listing_in_the_background(tree: Path, pack_and_mount) -> None:
    """After a whole-tree scan (``--readdirplus auto``) the daemon lists every folder again; a timed
    run waits for that, so that it does not pay for the run before it."""
    with pack_and_mount(tree, "--readdirplus", "auto") as mnt:
        stats = mnt / ".dlfs" / "stats"
        assert bench.imagefolder_scan(str(mnt)) == CLASSES * PER_CLASS + 1
        one = ["n00000000/n00000000_0.JPEG"]
        began = time.monotonic()
        run = bench.run_once(bench.Root.parse(str(mnt)), "stat", one, bench.Options())
        took = time.monotonic() - began
        after = json.loads(stats.read_text())
    assert after["listing_folders"] == 0 and after["listed_folders"] == CLASSES + 1, after
    assert 0 <= run["waited_for_background_s"] <= took - run["seconds"], (run, took)
    assert bench.wait_idle(str(tree)) == 0.0, "a root that is no dlfs mount has nothing to wait for"


def test_waiting_for_the_background_listing_ends_or_times_out(tmp_path: Path) -> None:
    stats = tmp_path / ".dlfs" / "stats"
    stats.parent.mkdir()
    stats.write_text(json.dumps({"listing_folders": 3}))
    with pytest.raises(bench.BenchError, match="still listing folders"):
        bench.wait_idle(str(tmp_path), timeout=0.1)
    (tmp_path / "idle").write_text(json.dumps({"listing_folders": 0}))
    done = threading.Timer(0.3, os.replace, (tmp_path / "idle", stats))  # whole, as the mount's is
    done.start()
    try:
        assert 0.25 <= bench.wait_idle(str(tmp_path), timeout=10) < bound(5)
    finally:
        done.cancel()


@pytest.mark.parametrize("processes", [True, False])
def test_arming_the_read_ahead_counts_in_the_run(
    tree: Path, pack_and_mount, monkeypatch: pytest.MonkeyPatch, processes: bool
) -> None:
    """The read-ahead starts when the order is read; were that before the clock, dlfs would get a
    head start (it was up to 2 s of fetching) that no other root gets."""
    order_file = runner.order_file
    pause = 0.5

    def slow_order_file(root: bench.Root, epoch: int) -> Path:
        time.sleep(pause)
        return order_file(root, epoch)

    monkeypatch.setattr(runner, "order_file", slow_order_file)
    with pack_and_mount(tree) as mnt:
        root = bench.Root.parse(str(mnt))
        items = bench.published_order([root], epoch=0)
        run = bench.run_once(root, "orderread", items, bench.Options(readers=2, processes=processes))
        assert run["seconds"] >= pause

        def broken_order_file(root: bench.Root, epoch: int) -> Path:
            raise OSError("the order file went away")

        monkeypatch.setattr(runner, "order_file", broken_order_file)
        began = time.monotonic()
        with pytest.raises(OSError, match="went away"):
            bench.run_once(root, "orderread", items, bench.Options(readers=2, processes=processes))
        assert time.monotonic() - began < bench.START_TIMEOUT / 2, "readers left waiting at the start line"


def test_scale_benchmark_reports_every_figure(tmp_path: Path) -> None:
    """``tools/bench_scale.py`` end to end on a small tree, the order file's steps included."""
    began = time.monotonic()
    out = tool(
        TOOLS / "bench_scale.py",
        "--files",
        "300",
        "--classes",
        "3",
        "--repeat",
        "1",
        "--work",
        tmp_path,
        "--json",
    )
    took = time.monotonic() - began
    document = json.loads(out.stdout)
    assert document["command"].startswith("tools/bench_scale.py --files 300")
    assert document["machine"]["cores"] == os.cpu_count()
    results = document["results"]
    assert results["entries"] == 300 + 3 + 1 and results["pack_seconds"] > 0
    assert results["rss_after_mount"] > 0 and results["mount_seconds"] > 0
    timed = (
        "native_scan",
        "dlfs_scan",
        "native_scan_cold",
        "dlfs_scan_cold",
        "order_lookup",
        "order_read",
        "order_parse",
    )
    for key in timed:
        assert results[key]["median"] > 0, key
    figures = {"scanner_user", "scanner_sys", "daemon"}
    for side, more in (("native", set()), ("dlfs", {"background", "background_cpu"})):
        cpu = results[f"{side}_scan_cold_cpu"]  # too short a scan for whole clock ticks: bounds only
        assert set(cpu) == figures | more, cpu
        assert all(0 <= f["min"] <= f["median"] <= f["max"] <= took * CPUS for f in cpu.values()), cpu
    assert 0 <= results["background_after_find"] < took
    assert not is_mounted(tmp_path / "mnt")


@pytest.mark.slow  # a sweep of every case of the read benchmark: make test-all runs it
def test_read_benchmark_reports_every_case(tmp_path: Path) -> None:
    """``tools/bench_read.py`` end to end on a small tree: every case, warm and cold, as JSON, and
    each case's files/s and CPU per file as it goes."""
    out = tool(TOOLS / "bench_read.py", "--files", "200", "--classes", "2", "--readers", "2", "--repeat", "1",
               "--work", tmp_path, "--json")  # fmt: skip
    results = json.loads(out.stdout)["results"]
    cases = ["native", "dlfs read-ahead", "dlfs read-ahead, always", "dlfs no read-ahead"]
    expected = {f"{case} {temperature}" for case in cases for temperature in ("warm", "cold")}
    assert set(results) == expected | {"dlfs read-ahead 2nd epoch warm"}
    for case, by_readers in results.items():
        row = by_readers["2"]
        assert row["items_per_s"] > 0 and row["bytes"] > 0, case
        assert ("daemon_cpu_s" in row) == case.startswith("dlfs"), case
    progress = [line for line in out.stderr.splitlines() if "readers:" in line]
    assert len(progress) == len(results)
    assert all(re.search(r"files/s, +\d+ us CPU per file$", line) for line in progress), progress
    assert not is_mounted(tmp_path / "mnt")


def test_batches_split_the_sequence_the_way_dataloader_workers_do() -> None:
    items = [str(k) for k in range(10)]
    assert [bench.readers.reader_items(items, k, 3) for k in range(3)] == [items[k::3] for k in range(3)]
    shares = [bench.readers.reader_items(items, k, 2, batch=3) for k in range(2)]
    assert shares == [["0", "1", "2", "6", "7", "8"], ["3", "4", "5", "9"]]


def test_loader_jobs_open_files_the_way_torchvision_does(tree: Path, tmp_path: Path, mount: object) -> None:
    """shuffleload and orderload open each file buffered, so each asks isatty(): one IOCTL per file,
    which the mount's C threads answer."""
    dataset = tmp_path / "dataset"
    dlfs("pack", tree, dataset)
    files = sum(1 for p in tree.rglob("*") if p.is_file())

    def ioctls(mnt: Path) -> int:
        return json.loads((mnt / ".dlfs" / "stats").read_bytes())["native"]["answered"].get("ioctl", 0)

    with mount(dataset) as mnt:  # type: ignore[operator]
        before = ioctls(mnt)
        out = dlfs(
            "bench", mnt, "--job", "shuffleload,orderload", "--readers", "3", "--batch", "4",
            "--repeat", "1", "--json",
        )  # fmt: skip
        after = ioctls(mnt)
    report = json.loads(out.stdout)
    assert report["options"]["batch"] == 4
    assert {r["job"]: r["median"]["bytes"] for r in report["results"]} == dict.fromkeys(
        ("shuffleload", "orderload"), tree_bytes(tree)
    )
    # Besides: the bench's own reads of .dlfs/stats and the order file, a handful.
    assert 2 * files <= after - before <= 2 * files + 10


def test_of_two_processes_holding_dev_fuse_for_a_root_the_last_started_is_its_daemon(tmp_path: Path) -> None:
    """The daemon of an earlier mount of the same root may still be exiting when the next is probed."""
    from dlfs.bench.probes import daemon_pid

    holder = "import sys, time; f = open('/dev/fuse', 'rb', buffering=0); print(flush=True); time.sleep(60)"
    root = tmp_path / "mnt"
    root.mkdir()
    started = []
    try:
        for _ in range(2):
            process = subprocess.Popen(
                [sys.executable, "-c", holder, str(root)], stdout=subprocess.PIPE, cwd=tmp_path
            )
            assert process.stdout is not None and process.stdout.readline() == b"\n"
            started.append(process)
        assert daemon_pid(str(root)) == started[1].pid
        assert daemon_pid(str(tmp_path)) is None
    finally:
        for process in started:
            process.kill()
            process.wait(timeout=10)
