"""The end-to-end tools: one ImageFolder epoch (native and through dlfs) and the throttled disk."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from commands import TOOLS, dlfs, tool
from PIL import Image

CLASSES, PER_CLASS = 3, 12


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("train") / "src"
    for c in range(CLASSES):
        (root / f"n{c:08d}").mkdir(parents=True)
        for k in range(PER_CLASS):
            Image.new("RGB", (64 + k, 48), (c * 80, k * 20, 0)).save(root / f"n{c:08d}" / f"{k}.JPEG")
    return root


def test_one_epoch_native_and_through_dlfs(jpegs: Path, pack_and_mount) -> None:
    train = TOOLS / "train_imagefolder.py"
    native = json.loads(tool(train, jpegs, "--workers", "2", "--batch-size", "8", "--model", "--json").stdout)
    assert native["images"] == CLASSES * PER_CLASS
    assert 0 <= native["data_wait_s"] <= native["epoch_s"] and native["images_per_s"] > 0
    with pack_and_mount(jpegs, "--order", "block", "--block", "4", pack=("--placement", "random")) as mnt:
        through = json.loads(tool(train, mnt, "--sampler", "dlfs", "--workers", "2", "--json").stdout)
    assert through["images"] == CLASSES * PER_CLASS


def test_slow_disk_throttles_reads_of_every_process_inside(tmp_path: Path) -> None:
    """20 read IOPS: 40 uncached small files need about 2 s inside the cgroup, far less outside."""
    slowdisk = TOOLS / "slowdisk.py"
    mnt = tmp_path / "slow"
    tool(slowdisk, "up", mnt, "--size", "64M", "--iops", "20", "--bps", "10M")
    try:
        for k in range(40):
            (mnt / f"f{k}").write_bytes(bytes([k]) * 3000)
        subprocess.run(["sync"], check=True)

        def read_all(*prefix: str | Path) -> float:
            Path("/proc/sys/vm/drop_caches").write_text("3\n")
            started = time.monotonic()
            command = [*map(str, prefix), "sh", "-c", f"cat {mnt}/f* > /dev/null"]
            subprocess.run(command, check=True, timeout=60)
            return time.monotonic() - started

        assert read_all(sys.executable, slowdisk, "run", "--") >= 1.5
        assert read_all() < 1.0
    finally:
        tool(slowdisk, "down", mnt)
    assert not mnt.with_suffix(".img").exists()
    assert not Path("/sys/fs/cgroup/blkio/dlfs-slowdisk").exists()


def test_taking_one_slow_disk_down_leaves_another_throttled(tmp_path: Path) -> None:
    """Slow disks share the cgroup, each with a rule of its own: ``down`` removes only its own, and
    the cgroup goes with the last one (a test's disk once took a benchmark's limits with it)."""
    slowdisk = TOOLS / "slowdisk.py"
    rules = Path("/sys/fs/cgroup/blkio/dlfs-slowdisk/blkio.throttle.read_iops_device")
    first, second = tmp_path / "first", tmp_path / "second"
    tool(slowdisk, "up", first, "--size", "64M", "--iops", "20")
    try:
        tool(slowdisk, "up", second, "--size", "64M", "--iops", "30")
        assert sorted(line.split()[1] for line in rules.read_text().splitlines()) == ["20", "30"]
        tool(slowdisk, "down", second)
        assert [line.split()[1] for line in rules.read_text().splitlines()] == ["20"]
    finally:
        tool(slowdisk, "down", second)
        tool(slowdisk, "down", first)
    assert not rules.parent.exists()


@pytest.mark.slow  # a sweep of transform specs, each packed and read for epochs: make test-all runs it
def test_transform_benchmark_packs_reads_and_compares(tmp_path: Path) -> None:
    """``make bench-transform`` on a tiny photo tree: both packs, three loaders, ratios that add up."""
    out = tool(
        TOOLS / "bench_transform.py",
        "--files",
        "24",
        "--classes",
        "2",
        "--work",
        tmp_path,
        "--repeat",
        "1",
        "--json",
    )
    result = json.loads(out.stdout)["results"]
    plain, resized = result["packs"]["plain"], result["packs"]["resize:256"]
    assert plain["bytes"] == plain["source_bytes"] == resized["source_bytes"]
    assert resized["bytes"] < plain["bytes"] and resized["transformed_files"] == 24
    assert set(result["loaders"]) == {"native", "dlfs plain", "dlfs resize:256"}
    native = result["loaders"]["native"]["images_per_s"]["median"]
    for name, loader in result["loaders"].items():
        assert result["vs_native"][name] == pytest.approx(loader["images_per_s"]["median"] / native)
    assert str(tmp_path) not in Path("/proc/self/mounts").read_text(), "every mount is gone"


def test_big_index_benchmark_synthesises_what_pack_would_write(tmp_path: Path) -> None:
    """``tools/bench_bigindex.py``'s dataset passes every load check and verify, and its names are
    the ones its lookups ask for."""
    sys.path.insert(0, str(TOOLS))
    import bench_bigindex

    bench_bigindex.synthesise(tmp_path / "ds", 1005, 10)
    assert dlfs("verify", tmp_path / "ds").stdout.startswith("OK: checked 1005 files")
    info = json.loads(dlfs("info", tmp_path / "ds", "--json").stdout)
    assert (info["files"], info["directories"]) == (1005, 11)
    assert dlfs("ls", tmp_path / "ds", "n00000009").stdout.splitlines()[-1] == "n00000009_000099.JPEG"
