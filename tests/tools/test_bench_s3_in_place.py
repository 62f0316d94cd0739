"""``tools/bench_s3_in_place.py`` end to end at a tiny size, on SeaweedFS on loopback."""

from __future__ import annotations

import json
from pathlib import Path

import bench_s3_in_place
import pytest
from commands import TOOLS, tool
from mounts import is_mounted

pytestmark = pytest.mark.timeout(300)


def test_the_s3_in_place_benchmark_measures_both_datasets_and_renders_them(tmp_path: Path) -> None:
    out = tool(TOOLS / "bench_s3_in_place.py", "--files", "60", "--classes", "2", "--shards", "3",
               "--readers", "2", "--repeat", "1", "--jobs", "orderload", "--no-shape",
               "--work", tmp_path / "read", "--s3-work", tmp_path / "s3", "--json")  # fmt: skip
    data = json.loads(out.stdout)["results"]
    results = data["results"]
    assert results["files"] == 60 and results["shards"] == 3
    assert set(results["making"]) == {"in place", "packed"}
    row = results["epochs"]["orderload"]
    for case in ("in place", "packed"):
        assert row[case]["items_per_s"] > 0 and row[case]["gets"] > 0, row
    page = "\n".join(bench_s3_in_place.render(data))
    assert "in place / packed" in page and "orderload" in page
    assert not is_mounted(tmp_path / "s3" / "mnt")
