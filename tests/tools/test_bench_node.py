"""``tools/bench_node.py --small``: every part of the node benchmark, run here on a small tree, read
back and rendered; and without FUSE, the native parts alone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from commands import TOOLS

sys.path.insert(0, str(TOOLS))
import bench_node
import bench_report

#: A sweep: every part of the node benchmark (its loader matrix, every root and reader count), so
#: make test-all runs it, not make test.
pytestmark = pytest.mark.slow

SMALL = bench_node.SCALES["small"]
#: The whole --small run, data generation included, on 2 busy cores.
TIMEOUT = 400


def run_small(work: Path, out: Path, env: dict[str, str] | None = None) -> dict:
    command = [sys.executable, TOOLS / "bench_node.py", "--small", "--out", out, "--work", work]
    done = subprocess.run(list(map(str, command)), capture_output=True, text=True, timeout=TIMEOUT, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("node")


@pytest.fixture(scope="module")
def small(work: Path) -> dict:
    return run_small(work, work / "node.json")


def test_machine_and_command_are_recorded(small: dict) -> None:
    machine = small["machine"]
    assert machine["cores"] == os.cpu_count() and machine["memory_bytes"] > 0
    assert machine["kernel"] == os.uname().release and "gpu" in machine
    assert small["command"].startswith("tools/bench_node.py --small --out ")
    assert small["results"]["fuse"] == {"works": True}


def test_no_mount_is_left_behind(small: dict, work: Path) -> None:
    assert str(work) not in Path("/proc/self/mounts").read_text()


def test_loader_matrix_reads_every_file_on_every_root(small: dict) -> None:
    loader = small["results"]["loader"]
    expected = {f"{job} warm {n}" for job in bench_node.LOADER_JOBS for n in SMALL.readers}
    assert set(loader["results"]) == expected
    for key, by_case in loader["results"].items():
        assert set(by_case) == {"native", "squashfuse_ll", "dlfs"}, key
        for case, row in by_case.items():
            assert row["items_per_s"] * row["seconds"] == pytest.approx(SMALL.files), (key, case)
            assert ("daemon_cpu_s" in row) == (case != "native"), (key, case)
        # torchvision's default loader opens buffered: one isatty() per file, answered by the C threads
        assert by_case["dlfs"]["native"][0]["answered"]["ioctl"] >= SMALL.files, key


def test_training_runs_every_epoch_from_every_root(small: dict) -> None:
    results = small["results"]
    assert results["packs"]["resize:256"]["bytes"] < results["packs"]["plain"]["bytes"]
    train = results["train"]
    roots = ("native", "dlfs plain", "dlfs resize:256")
    assert set(train["runs"]) == {f"{root} {t}" for root in roots for t in ("warm", "cold")}
    for key, run in train["runs"].items():
        assert run["images"] == SMALL.files, key
        assert 0 < run["data_wait_s"] < run["epoch_s"], key
        assert run["sampler"] == ("shuffle" if key.startswith("native") else "dlfs"), key
    assert train["workers"] == max(1, len(os.sched_getaffinity(0)) - 1) and train["device"] == "cpu"


def test_the_report_renders_the_node_section(small: dict, tmp_path: Path) -> None:
    (tmp_path / "bench-node.json").write_text(json.dumps(small))
    page = bench_report.render(tmp_path)
    section = page.split("## A training node's data path (`make bench-node`)")[1]
    assert "### The loader matrix" in section and "### Training end to end" in section
    for key in small["results"]["loader"]["results"]:
        assert f"| {key} |" in section
    for key in small["results"]["train"]["runs"]:
        assert f"| {key} |" in section
    assert section.count("(target ≥ ") == 6


def test_without_fuse_the_native_parts_still_run(small: dict, work: Path, tmp_path: Path) -> None:
    """No fusermount3 on PATH: the probe says why, and the native loader runs and epochs still run."""
    bare = tmp_path / "bin"
    bare.mkdir()
    for program in ("sync",):
        os.symlink(shutil.which(program), bare / program)  # type: ignore[arg-type]
    document = run_small(work, tmp_path / "node.json", env=os.environ | {"PATH": str(bare)})
    results = document["results"]
    assert results["fuse"] == {"works": False, "reason": "fusermount3 is not installed (the fuse3 package)"}
    assert set(results["loader"]["results"]) == {f"shuffleload warm {n}" for n in SMALL.readers}
    assert all(set(row) == {"native"} for row in results["loader"]["results"].values())
    assert set(results["train"]["runs"]) == {"native warm", "native cold"}
    assert any("FUSE does not work here" in reason for reason in results["skipped"])
