"""The S3-object-source benchmark, run tiny: it packs every object it uploaded and renders its table."""

from __future__ import annotations

import json
import os
from pathlib import Path

import bench_s3_source
import pytest
from commands import TOOLS, tool


# The shaped network's run repeats the loopback one's checks behind netshape, a sweep of the network
# shapes: make test-all runs it.
@pytest.mark.parametrize("network", ["loopback", pytest.param("shaped", marks=pytest.mark.slow)])
def test_the_benchmark_packs_every_object_and_renders_its_table(tmp_path: Path, network: str) -> None:
    if network == "shaped" and os.geteuid() != 0:
        pytest.skip("the shaped network needs root")
    flags = ["--loopback"] if network == "loopback" else ["--rtt-ms", "2"]
    result = tool(
        TOOLS / "bench_s3_source.py",
        *("--objects", "40", "--size", "3000", "--repeat", "1", "--threads", "4", "--pack-threads", "2", "8"),
        *("--work", tmp_path / "work", "--json", *flags),
        timeout=180,
    )
    results = json.loads(result.stdout)["results"]
    assert results["objects"] == 40 and 40 * 1500 <= results["bytes"] <= 40 * 4500
    assert list(results["get_objects"]) == ["4"] and list(results["dlfs_pack"]) == ["2", "8"]
    for run in [*results["get_objects"].values(), *results["dlfs_pack"].values()]:
        assert (run["objects"], run["bytes"]) == (40, results["bytes"]) and run["objects_per_s"] > 0
    assert results["dlfs_pack"]["8"]["peak_rss"] > 0
    page = "\n".join(bench_s3_source.render(results))
    assert "| `dlfs pack --threads 8` |" in page and "| GETs, 4 threads |" in page
    assert not (tmp_path / "work").exists()
