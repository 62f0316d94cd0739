"""docs/benchmarks.md: every checked-in benchmark JSON renders through its tool's table, and the page
in docs/ is what the report makes of them."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from commands import TOOLS

sys.path.insert(0, str(TOOLS))
import bench_report

DOCS = TOOLS.parent / "docs"
CHECKED_IN = sorted(DOCS.glob("bench-*.json"))


def test_every_checked_in_json_is_a_section_s_file_and_a_document() -> None:
    named = {name for section in bench_report.SECTIONS for name in section.files}
    assert CHECKED_IN
    for path in CHECKED_IN:
        assert path.name in named, f"{path.name}: no section of the report reads it"
        document = json.loads(path.read_text())
        assert {"machine", "command", "results"} <= set(document), path.name
        assert document["machine"]["cores"] > 0 and document["command"], path.name


def test_the_page_in_docs_is_the_report_of_the_checked_in_json() -> None:
    page = bench_report.render(DOCS)
    for section in bench_report.SECTIONS:
        assert f"(`make {section.target}`)" in page
        present = (DOCS / section.files[0]).exists()
        assert (f"`make {section.target}` writes `docs/{section.files[0]}`" in page) != present, section
    assert page == (DOCS / "benchmarks.md").read_text(), "docs/benchmarks.md is stale: run make bench-report"


def test_json_without_machine_and_command_renders_like_a_document(tmp_path: Path) -> None:
    """What ``dlfs bench --json`` writes (results only) renders as its document does; the table of
    targets says that it does not record its command."""
    for path in CHECKED_IN:
        shutil.copy(path, tmp_path / path.name)
    warm = tmp_path / "bench-jobs-warm.json"
    document = json.loads(warm.read_text())
    warm.write_text(json.dumps(document["results"]))
    page, reference = bench_report.render(tmp_path), bench_report.render(DOCS)

    def jobs_section(text: str) -> str:
        return text.split("## Side by side with the peers")[1].split("\n## ")[0]

    assert jobs_section(page) == jobs_section(reference)
    assert f"`{document['command']}`" in reference and f"`{document['command']}`" not in page


@pytest.mark.parametrize("missing", ["bench-pack.json", "bench-loader-scaling.json"])
def test_a_missing_json_is_said_or_left_out(tmp_path: Path, missing: str) -> None:
    """A section's first file missing: a line says which target writes it; a later one: its rows go."""
    for path in CHECKED_IN:
        if path.name != missing:
            shutil.copy(path, tmp_path / path.name)
    page = bench_report.render(tmp_path)
    said = "Not run yet: `make bench-pack` writes `docs/bench-pack.json`."
    assert (said in page) == (missing == "bench-pack.json")
    assert ("(`bench-loader-scaling.json`)" in page) == (missing != "bench-loader-scaling.json")
