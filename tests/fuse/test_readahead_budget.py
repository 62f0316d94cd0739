"""How much the read-ahead reads, and when: never more than its budget ahead of the reader, nothing
without a published order or with the budget at 0, and a run of files with one storage read however
wide the window spreads it."""

from __future__ import annotations

from pathlib import Path

from mounts import mount_stats
from readahead_checks import make_classes, published, read_all


def test_read_ahead_stays_within_its_budget(tmp_path: Path, pack_and_mount) -> None:
    src = make_classes(tmp_path / "src", classes=4, per_class=100, size=50_000)
    budget = 1 << 20
    with pack_and_mount(src, "--readahead-budget", str(budget), "--readahead-inflight", "2") as mnt:
        paths = published(mnt, "epoch-1.rank-0-of-2")
        for k in range(0, len(paths), 25):
            read_all(paths[k : k + 25])
            reading = mount_stats(mnt)["readahead"]["readings"]["epoch-1.rank-0-of-2"]
            assert reading["lead_bytes"] <= budget + 50_100, "at most one file beyond the budget"
            assert reading["fetched"] <= min(len(paths), k + 25 + budget // 50_000 + 1)


def test_without_a_published_order_nothing_is_read_ahead(packed: Path, odd_tree: Path, mount) -> None:
    with mount(packed) as mnt:
        for path in sorted(mnt.glob("many/*.dat"), reverse=True):
            assert path.read_bytes() == (odd_tree / path.relative_to(mnt)).read_bytes()
        assert mount_stats(mnt)["readahead"]["issued_files"] == 0


def test_read_ahead_off_still_reads_correctly(packed: Path, odd_tree: Path, mount) -> None:
    with mount(packed, "--readahead-budget", "0") as mnt:
        for path in published(mnt, "epoch-0"):
            assert path.read_bytes() == (odd_tree / path.relative_to(mnt)).read_bytes()
        assert mount_stats(mnt)["readahead"] is None


def test_block_order_runs_are_read_whole_from_a_wide_window(tmp_path: Path, pack_and_mount) -> None:
    """A window of many runs spreads each run's files over the window; the read-ahead still reads a
    run with one storage request instead of one per file."""
    src = make_classes(tmp_path / "src", classes=6, per_class=100, size=150_000)
    flags = ("--order", "block", "--block", "20", "--window", "300", "--readahead-budget", "64M")
    with pack_and_mount(src, *flags) as mnt:
        paths = published(mnt, "epoch-0")
        data = read_all(paths)
        readahead = mount_stats(mnt)["readahead"]
    assert data == [(src / p.relative_to(mnt)).read_bytes() for p in paths]
    assert readahead["issued_files"] >= 0.9 * len(paths), readahead
    assert readahead["storage_reads"] <= len(paths) // 5, f"{readahead['storage_reads']} reads for 30 runs"
