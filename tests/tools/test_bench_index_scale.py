"""``tools/bench_index_scale.py`` at a tiny size, run from outside the checkout: the tar has the
shape asked for, each command's time is in the JSON, the indexes it measured were real, and its
section of docs/benchmarks.md renders the ratio against its target."""

from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path

import pytest
from commands import TOOLS, tool

sys.path.insert(0, str(TOOLS))
import bench_index_scale as bis

CLASSES, PER_CLASS = 3, 40
#: Making the tar, then cat, dlfs and ratarmount on it once each, on 2 busy cores.
TIMEOUT = 240


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    cwd = tmp_path_factory.mktemp("index-scale")
    done = tool(
        *(TOOLS / "bench_index_scale.py", "--classes", CLASSES, "--per-class", PER_CLASS, "--size", 500),
        *("--work", "data", "--json"),
        timeout=TIMEOUT,
        cwd=cwd,
    )
    return json.loads(done.stdout), cwd


def test_each_command_ran_on_a_tar_of_the_shape_asked_for(run: tuple[dict, Path]) -> None:
    document, cwd = run
    results = document["results"]
    assert results["members"] == CLASSES * PER_CLASS
    with tarfile.open(cwd / "data" / "train.tar") as outer:
        classes = outer.getnames()
    assert len(classes) == CLASSES and all(name.endswith(".tar") for name in classes)
    assert set(results["seconds"]) == {bis.CAT, bis.IN_PLACE, bis.RATARMOUNT}
    for name, spread in results["seconds"].items():
        assert 0 < spread["min"] <= spread["median"] <= spread["max"], name
    assert all(size > 0 for size in results["index_bytes"].values())


def test_the_section_gives_the_ratio_and_says_whether_the_target_is_met(run: tuple[dict, Path]) -> None:
    document, _ = run
    page = "\n".join(bis.render(document["results"]))
    seconds = {name: spread["median"] for name, spread in document["results"]["seconds"].items()}
    met = seconds[bis.IN_PLACE] <= bis.TARGET * seconds[bis.RATARMOUNT]
    assert f"`{bis.RATARMOUNT}`" in page
    assert (
        "Target: dlfs in place at most 0.33 of ratarmount's time: " + ("met" if met else "not met")
    ) in page
