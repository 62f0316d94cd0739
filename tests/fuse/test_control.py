"""The hidden control tree over a real mount: published orders, config and live stats."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
from commands import DLFS, assert_one_line_error, dlfs
from page_cache import drop_from_memory
from waits import Signal, wait_for

from dlfs.core import format as fmt
from dlfs.core.index import Index
from dlfs.core.order import OrderSpec, epoch_order
from dlfs.core.protocol import MAX_WORLD, escape, parse_order, unescape
from dlfs.core.store.local import LocalStore
from dlfs.fuse.control import ControlTree


def _lines(path: Path) -> list[str]:
    return parse_order(path.read_bytes())


def test_control_tree_resolves_but_is_never_listed(packed: Path, mount) -> None:
    with mount(packed) as mnt:
        assert ".dlfs" not in os.listdir(mnt)
        assert os.path.isdir(Path(mnt) / ".dlfs")
        assert sorted(os.listdir(Path(mnt) / ".dlfs")) == ["config", "files", "order", "set", "stats"]
        assert os.listdir(Path(mnt) / ".dlfs" / "order") == []
        assert os.stat(Path(mnt) / ".dlfs" / "..").st_ino == os.stat(mnt).st_ino


def test_published_order_is_the_pure_function_of_seed_epoch_and_rank(packed: Path, mount) -> None:
    index = Index.load(LocalStore(packed))
    files = index.regular_rows()
    spec = OrderSpec(seed=9)
    with mount(packed, "--seed", "9") as mnt:
        order = Path(mnt) / ".dlfs" / "order"
        for epoch in (0, 3):
            expected = index.paths(files[epoch_order(files.size, spec, epoch)])
            assert [os.fsencode(path) for path in _lines(order / f"epoch-{epoch}")] == expected
        shares = [_lines(order / f"epoch-2.rank-{rank}-of-3") for rank in range(3)]
        assert len({len(share) for share in shares}) == 1
        published = {path for share in shares for path in share}
        assert published == {os.fsdecode(path) for path in index.paths(files)}
        for path in shares[0][:20]:
            assert (Path(mnt) / path).is_file()


def test_names_with_newlines_and_backslashes_round_trip() -> None:
    for name in [b"plain", b"new\nline", b"back\\slash", b"both\\n\n"]:
        assert unescape(os.fsdecode(escape(name))) == os.fsdecode(name)
        assert b"\n" not in escape(name)


@pytest.mark.parametrize(
    "odd", [b"", b"new\nline", b"back\\slash", b"\xff\xfe not utf-8", b"caf\xc3\xa9/\xe2\x82"]
)
def test_an_order_file_parses_to_the_names_os_walk_gives(odd: bytes) -> None:
    paths = [b"n01/a.JPEG", b"n02/b c.JPEG", *([odd] if odd else []), b"\xc3\xa9t\xc3\xa9/x"]
    text = b"".join(escape(path) + b"\n" for path in paths)
    assert parse_order(text) == [os.fsdecode(path) for path in paths]


def test_bad_order_names_are_not_found(packed: Path, mount) -> None:
    with mount(packed) as mnt:
        order = Path(mnt) / ".dlfs" / "order"
        for name in ("epoch-x", "epoch-1.rank-2-of-2", "epoch-1.rank-0-of-0", "epoch--1", "nothing"):
            assert not (order / name).exists(), name
        assert not (Path(mnt) / ".dlfs" / "nope").exists()


def test_absurd_order_names_are_not_found_and_cost_nothing(packed: Path, mount) -> None:
    """An epoch of 10^18 is an epoch like any other; a world past MAX_WORLD or an epoch past
    int64 is no order file (not a sequence padded to a billion ranks, 8 GB)."""
    with mount(packed) as mnt:
        order = Path(mnt) / ".dlfs" / "order"
        files = len((order / "epoch-0").read_bytes().splitlines())
        assert len((order / f"epoch-{10**18}").read_bytes().splitlines()) == files
        for name in (
            "epoch-1.rank-0-of-1000000000",
            f"epoch-1.rank-0-of-{MAX_WORLD + 1}",
            f"epoch-{2**63}",
            f"epoch-{10**200}",
        ):
            assert not (order / name).exists(), name
        assert (order / f"epoch-1.rank-{MAX_WORLD - 1}-of-{MAX_WORLD}").read_bytes().count(b"\n") == 1


def test_control_files_refuse_writes(packed: Path, mount) -> None:
    with mount(packed) as mnt:
        control = Path(mnt) / ".dlfs"
        for path in (control / "stats", control / "config", control / "order" / "epoch-0"):
            for attempt in (lambda p=path: open(p, "r+b"), lambda p=path: os.truncate(p, 0)):
                with pytest.raises(OSError) as info:
                    attempt()
                assert info.value.errno in (errno.EROFS, errno.EACCES), path
        with pytest.raises(OSError) as info:
            open(control / "order" / "epoch-9", "wb")
        assert info.value.errno in (errno.EROFS, errno.EACCES)


def test_config_and_stats_are_json_and_stats_are_fresh(packed: Path, mount) -> None:
    with mount(packed, "--seed", "4", "--order", "block") as mnt:
        config = json.loads((Path(mnt) / ".dlfs" / "config").read_text())
        assert (
            config["seed"] == 4
            and config["mode"] == "block"
            and config["format_version"] == fmt.FORMAT_VERSION
        )
        assert len(config["dataset_id"]) == 32
        first = json.loads((Path(mnt) / ".dlfs" / "stats").read_text())
        for path in list(Path(mnt).glob("many/*"))[:50]:
            path.read_bytes()
        second = json.loads((Path(mnt) / ".dlfs" / "stats").read_text())
        assert second["requests"]["read"] > first["requests"].get("read", 0)
        assert second["requests"]["lookup"] > first["requests"]["lookup"]
        assert {"ram_cache", "storage", "readahead", "uptime_seconds"} <= set(second)


@pytest.mark.parametrize("mode", ["full", "block"])
def test_every_file_appears_once_per_epoch_in_both_modes(packed: Path, mount, mode: str) -> None:
    with mount(packed, "--order", mode, "--block", "8", "--window", "32") as mnt:
        lines = _lines(Path(mnt) / ".dlfs" / "order" / "epoch-5")
        files = [p for p in Path(mnt).rglob("*") if p.is_file() and not p.is_symlink()]
        assert len(lines) == len(files) == len(set(lines))
        assert np.unique(lines).size == len(lines)


def test_dlfs_stats_shows_totals_and_rates_of_a_mount(packed_on_disk: Path, odd_tree: Path, mount) -> None:
    for shard in packed_on_disk.glob("*.shard"):
        drop_from_memory(shard)  # so that reads wait for storage
    with mount(packed_on_disk, "--native-threads", "0") as mnt:  # Python answers the reads: latencies counted
        for path in sorted((odd_tree / "many").iterdir())[:50]:
            assert (mnt / "many" / path.name).read_bytes() == path.read_bytes()
        totals = json.loads(dlfs("stats", mnt, "--json").stdout)
        assert totals["reads"] >= 45 and totals["bytes_served"] > 0  # empty files need no READ
        assert totals["storage_waits"] > 0 and totals["read_p50_us"] is not None
        assert "reads" in dlfs("stats", mnt).stdout
        watching = subprocess.Popen(
            [*DLFS, "stats", str(mnt), "--watch", "0.2", "--json"], stdout=subprocess.PIPE, text=True
        )
        lines: list[dict[str, float]] = []
        with Signal() as line_read:

            def collect() -> None:
                for line in watching.stdout or ():
                    lines.append(json.loads(line))
                    line_read.set()

            collector = threading.Thread(target=collect)
            collector.start()
            try:
                wait_for(
                    lambda: len(lines) >= 2,
                    "two lines of rates from dlfs stats --watch",
                    line_read,
                    seen=lambda: lines,
                )
                for path in sorted((odd_tree / "classes" / "n00000000").iterdir()):
                    (mnt / "classes" / "n00000000" / path.name).read_bytes()
                wait_for(
                    lambda: any(line["reads_per_s"] > 0 for line in lines),
                    "a rate of reads above 0",
                    line_read,
                    seen=lambda: lines,
                )
            finally:
                watching.terminate()
                watching.wait(timeout=10)
                collector.join(timeout=10)
        assert len(lines) >= 3, lines
    assert_one_line_error(dlfs("stats", odd_tree, check=False), "not a dlfs mount")


def test_each_lookup_of_stats_gets_a_snapshot_of_its_own_until_forgotten(packed: Path) -> None:
    """The kernel keeps one size per inode: readers sharing one stats inode whose bytes changed
    under them read a snapshot cut short or padded with zeros (the soak test's 16 readers of
    stats did). So every lookup gets a fresh inode, whose bytes and size stay as they were."""
    calls = iter(range(1000))
    control = ControlTree(Index.load(LocalStore(packed)), OrderSpec(), lambda: {"n": "x" * next(calls)})
    first = control.lookup(control.root, b"stats")
    second = control.lookup(control.root, b"stats")
    assert first != second and control.is_volatile(first) and control.is_volatile(second)
    for inode, n in ((first, 0), (second, 1)):
        content = control.read(inode, 0, 1 << 20)
        assert json.loads(content) == {"n": "x" * n}
        assert control.attrs(inode).size == len(content)
    control.forget([first])
    with pytest.raises(LookupError):
        control.read(first, 0, 1 << 20)
    assert json.loads(control.read(second, 0, 1 << 20)) == {"n": "x"}
