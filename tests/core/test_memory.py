"""Fitting a mount's budgets to the memory it may take: the arithmetic, and the cgroup limits read
from fake v1 and v2 trees (the real cgroup is tried in tests/fuse/test_faults.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlfs.core import memory
from dlfs.core.errors import MountError

MiB = 1 << 20
BUFFER = 8 * MiB


def test_budgets_that_fit_are_kept_without_a_note() -> None:
    fitted = memory.fit(256 * MiB, 512 * MiB, 16, BUFFER, memory.Available(20 << 30, "MemAvailable"))
    assert fitted == memory.Budgets(256 * MiB, 512 * MiB, 16)


def test_budgets_too_large_are_cut_to_half_of_what_is_left_the_read_ahead_keeping_half() -> None:
    room = memory.Available(4 << 30, "MemAvailable")
    fitted = memory.fit(64 << 30, 16 << 30, 16, BUFFER, room)
    left = room.bytes - memory.UNDER_LOAD - 16 * BUFFER
    assert fitted.readahead_inflight == 16
    assert fitted.ram_cache_size + fitted.readahead_budget <= left // 2
    assert abs(fitted.ram_cache_size - fitted.readahead_budget) <= 1
    assert (
        fitted.note is not None and "MemAvailable" in fitted.note and "--ram-cache-size 64.0G" in fitted.note
    )


def test_a_huge_cache_is_cut_and_the_read_ahead_keeps_its_budget_and_the_note_names_only_that() -> None:
    fitted = memory.fit(100 << 40, 512 * MiB, 16, BUFFER, memory.Available(20 << 30, "MemAvailable"))
    assert fitted.readahead_budget == 512 * MiB and fitted.readahead_inflight == 16
    assert 0 < fitted.ram_cache_size < 10 << 30
    assert fitted.note is not None and fitted.note.startswith("--ram-cache-size 100.0T would take more than")
    assert "--readahead" not in fitted.note


def test_a_memory_limit_counts_what_the_daemon_holds_and_lets_the_budgets_fill_the_rest() -> None:
    held = memory.resident()
    room = memory.available(held + 512 * MiB)
    assert room.share == 1.0 and "--memory-limit" in room.source
    assert abs(room.bytes - 512 * MiB) < 64 * MiB  # this process grew a little meanwhile
    fitted = memory.fit(256 * MiB, 512 * MiB, 16, BUFFER, room)
    assert fitted.ram_cache_size + fitted.readahead_budget + fitted.readahead_inflight * BUFFER <= (
        room.bytes - memory.UNDER_LOAD
    )


def test_a_small_limit_takes_batches_in_flight_down_too() -> None:
    fitted = memory.fit(256 * MiB, 512 * MiB, 16, BUFFER, memory.Available(256 * MiB, "cgroup x limit"))
    usable = 256 * MiB - memory.UNDER_LOAD
    assert fitted.readahead_inflight * BUFFER <= usable // 2 and fitted.readahead_inflight >= 1
    budgets = fitted.ram_cache_size + fitted.readahead_budget
    assert 0 < budgets <= (usable - fitted.readahead_inflight * BUFFER) // 2
    assert "cgroup x limit" in (fitted.note or "")


def test_without_read_ahead_its_buffers_count_for_nothing() -> None:
    room = memory.Available(memory.UNDER_LOAD + memory.MIN_ROOM + MiB, "MemAvailable")
    assert memory.fit(0, 0, 16, BUFFER, room) == memory.Budgets(0, 0, 16)


def test_too_little_memory_for_one_batch_refuses_the_mount_in_one_line() -> None:
    with pytest.raises(MountError, match=r"only 80M of memory is available to the mount \(cgroup x limit\)"):
        memory.fit(256 * MiB, 512 * MiB, 16, BUFFER, memory.Available(80 * MiB, "cgroup x limit"))


def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_a_v1_limit_is_the_hierarchys_less_what_is_not_reclaimable(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "proc": "4:memory:/jobs/dlfs\n3:cpu:/\n0::/\n",
            "cg/memory/jobs/dlfs/memory.stat": f"cache 1\nhierarchical_memory_limit {512 * MiB}\n"
            f"total_inactive_file {100 * MiB}\n",
            "cg/memory/jobs/dlfs/memory.usage_in_bytes": str(300 * MiB),
        },
    )
    room = memory.cgroup_room(tmp_path / "proc", tmp_path / "cg")
    assert room is not None and room.bytes == (512 - 300 + 100) * MiB
    assert "jobs/dlfs" in room.source


def test_v1_without_a_limit_and_v2_without_one_give_none(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "proc": "4:memory:/\n0::/svc\n",
            "cg/memory/memory.stat": f"hierarchical_memory_limit {2**63 - 4096}\n",
            "cg/memory/memory.usage_in_bytes": str(MiB),
            "cg/svc/memory.max": "max\n",
            "cg/svc/memory.current": str(MiB),
        },
    )
    assert memory.cgroup_room(tmp_path / "proc", tmp_path / "cg") is None


def test_v2_takes_the_tightest_of_the_group_and_its_ancestors(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "proc": "0::/a/b\n",
            "cg/a/memory.max": str(256 * MiB),
            "cg/a/memory.current": str(200 * MiB),
            "cg/a/memory.stat": "inactive_file 0\n",
            "cg/a/b/memory.max": str(1 << 30),
            "cg/a/b/memory.current": str(150 * MiB),
            "cg/a/b/memory.stat": f"anon 1\ninactive_file {50 * MiB}\n",
        },
    )
    room = memory.cgroup_room(tmp_path / "proc", tmp_path / "cg")
    assert room is not None and room.bytes == 56 * MiB and room.source.endswith("/a limit")
