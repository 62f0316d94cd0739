"""``tools/bench_archive.py`` end to end at a tiny size, run from outside the checkout: every
measurement in the JSON (ratarmount's included), no mount left behind, and its section of
docs/benchmarks.md rendered with each ratio from the run beside its target."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from commands import TOOLS

sys.path.insert(0, str(TOOLS))
import bench_archive as ba
import bench_report

#: A sweep: every measurement of the archive benchmark (each source, ratarmount, the two-step
#: baseline), so make test-all runs it, not make test.
pytestmark = pytest.mark.slow

FILES, CLASSES = 240, 4
#: The whole tiny run, data generation included, on 2 busy cores.
TIMEOUT = 300
STEPS = {
    ba.CAT,
    ba.PACK,
    ba.TWO_STEP,
    ba.IN_PLACE,
    ba.RATARMOUNT_INDEX,
    *ba.SOURCES.values(),
    *(f"dlfs pack {name}" for name in ba.SOURCES),
}
READS = {f"{job} {temperature}" for job in ("shuffleload", "orderload") for temperature in ("warm", "cold")}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str, Path]:
    """(the JSON document, the progress on stderr, the directory it ran in)."""
    cwd = tmp_path_factory.mktemp("archive")
    command = [TOOLS / "bench_archive.py", "--files", FILES, "--classes", CLASSES, "--repeat", "1"]
    done = subprocess.run(
        [sys.executable, *map(str, command), "--work", "data", "--json"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=cwd,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr, cwd


def test_every_measurement_is_in_the_json(run: tuple[dict, str, Path]) -> None:
    document, progress, cwd = run
    results = document["results"]
    assert document["command"].startswith("tools/bench_archive.py --files 240")
    assert (results["files"], results["classes"]) == (FILES, CLASSES)
    assert results["bytes"][ba.TRAIN] > results["bytes"]["files"] > 0
    assert set(results["seconds"]) == STEPS
    for name, spread in results["seconds"].items():
        assert 0 < spread["min"] <= spread["median"] <= spread["max"], name
        assert f"round 1/1  {name}" in progress
    assert set(results["reads"]) == READS
    for key, by_case in results["reads"].items():
        assert set(by_case) == set(ba.CASES), key
        for case, row in by_case.items():
            assert row["items_per_s"] * row["seconds"] == pytest.approx(FILES), (key, case)
            assert row["daemon_rss_after"] > 0, (key, case)  # the daemon serving it was found
            assert f"{key}, {case}: " in progress
    assert set(results["index_bytes_per_file"]) == set(ba.CASES)
    assert all(size > 0 for size in results["index_bytes_per_file"].values())
    assert (cwd / "data" / ba.TRAIN).is_file() and not (cwd / "data" / "scratch").exists()
    assert str(cwd) not in Path("/proc/self/mounts").read_text()


def test_the_report_renders_the_archive_section(run: tuple[dict, str, Path], tmp_path: Path) -> None:
    document = run[0]
    (tmp_path / "bench-archive.json").write_text(json.dumps(document))
    page = bench_report.render(tmp_path)
    section = page.split(f"## {ba.TITLE} (`make bench-archive`)")[1].split("\n## ")[0]
    results = document["results"]
    seconds = {name: spread["median"] for name, spread in results["seconds"].items()}
    for name in STEPS:
        assert f"| `{name}` |" in section
    for step, against, bound in ba.TIME_TARGETS:
        ratio = f"`{against}` | {seconds[step] / seconds[against]:.2f}\u00d7 |"
        assert ratio in section, (step, against)
        assert bound is None or f"\u2264 {bound:.2f}\u00d7" in section
    for key, by_case in results["reads"].items():
        fps = {case: by_case[case]["items_per_s"] for case in ba.CASES}
        row = next(line for line in section.splitlines() if line.startswith(f"| {key} |"))
        for against, bound in ba.READ_TARGETS:
            assert f"{fps['in place'] / fps[against]:.2f}\u00d7 (\u2265 {bound:.1f}\u00d7, " in row, key
    for case in ba.CASES:
        per_file = results["index_bytes_per_file"][case]
        assert f"| {case} | {per_file:.0f} |" in section
