"""The read-ahead over a real mount, from every kind of storage it reads: shards on a disk and on a
tmpfs, a tar indexed in place, shards not in memory, and a kernel without ``cachestat``. Each epoch
read in the published order is served from the page cache, byte for byte the source (tests/readahead
drives the engine without a mount)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from commands import dlfs
from mounts import mount_stats
from page_cache import drop_from_memory
from readahead_checks import epoch_read_ahead, make_classes, published, read_all, wait_settled

from dlfs.core.libc import cached_pages

WITHOUT_CACHESTAT = [sys.executable, str(Path(__file__).with_name("without_cachestat.py"))]


@pytest.mark.parametrize("filesystem", ["on_disk", "in_tmpfs"])
def test_reads_in_published_order_are_served_from_the_page_cache(
    filesystem: str, request: pytest.FixtureRequest, mount
) -> None:
    """Also from a dataset on tmpfs, which refuses the C loop's reads that must not wait."""
    root: Path = request.getfixturevalue(filesystem)
    src = make_classes(root / "src")
    dlfs("pack", src, root / "ds", "--shard-size", "1M")
    paths, data, after = epoch_read_ahead(root / "ds", mount)
    assert data == [(src / path).read_bytes() for path in paths]
    readahead = after["readahead"]
    assert readahead["storage_reads"] < readahead["issued_files"], "neighbours share a storage read"


def test_an_in_place_dataset_is_read_ahead_from_its_tar_cold(on_disk: Path, mount) -> None:
    """``dlfs pack --in-place``: the shards lie in the tar, and the C loop reads each at its
    base, here directly (O_DIRECT) from a tar not in memory, at offsets the base leaves
    unaligned."""
    src = make_classes(on_disk / "src")
    tar = on_disk / "src.tar"
    subprocess.run(["tar", "-cf", tar, "-C", src, "."], check=True, timeout=60)
    dlfs("pack", "--in-place", tar, on_disk / "ds")
    drop_from_memory(tar)
    paths, data, after = epoch_read_ahead(on_disk / "ds", mount)
    assert data == [(src / path).read_bytes() for path in paths]
    assert after["readahead"]["cold_batches"] >= 1, after["readahead"]


def test_without_cachestat_files_are_read_ahead_and_answered_natively(on_disk: Path, mount) -> None:
    """A kernel before 6.5 (those of most clusters) has no cachestat, which the read-ahead and the
    native request server ask before reading: a seccomp filter takes it away here. The read-ahead
    then asks with reads that must not wait (on a disk, which takes them), and the native server
    reads on."""
    probe = "import os; from dlfs.core.libc import cachestat; print(cachestat(os.open('/', os.O_RDONLY), 1))"
    asked = subprocess.run([*WITHOUT_CACHESTAT, sys.executable, "-c", probe], capture_output=True, text=True)
    assert asked.stdout.strip() == "None", asked  # the filter works: no cachestat in what it starts
    src = make_classes(on_disk / "src")
    dlfs("pack", src, on_disk / "ds", "--shard-size", "1M")
    paths, data, _ = epoch_read_ahead(on_disk / "ds", mount, launcher=WITHOUT_CACHESTAT)
    assert data == [(src / path).read_bytes() for path in paths]
    shuffled = random.Random(0).sample(paths, len(paths))
    with mount(on_disk / "ds", "--readahead-budget", "0", launcher=WITHOUT_CACHESTAT) as mnt:
        again = read_all([mnt / p for p in shuffled])
        native = mount_stats(mnt)["native"]
    assert again == [(src / p).read_bytes() for p in shuffled]
    assert native["answered"].get("read", 0) >= len(paths), json.dumps(native)


def test_an_epoch_from_cold_storage_is_read_past_the_shards_page_cache(on_disk: Path, pack_and_mount) -> None:
    """Shards not in memory: the C loop reads them directly (O_DIRECT), so the files arrive intact
    and the dataset is cached once, in the mount, instead of twice (the shards too)."""
    src = make_classes(on_disk / "src", classes=4, per_class=100, size=50_000)
    dataset = on_disk / "ds"
    with pack_and_mount(src, dataset=dataset) as mnt:
        shards = sorted(dataset.glob("*.shard"))
        for shard in shards:
            drop_from_memory(shard)
        paths = published(mnt, "epoch-0")
        wait_settled(mnt, "epoch-0", len(paths))
        cached = 0
        for shard in shards:
            fd = os.open(shard, os.O_RDONLY)
            cached += cached_pages(fd, shard.stat().st_size) * 4096
            os.close(fd)
        data = read_all(paths)
        readahead = mount_stats(mnt)["readahead"]
    assert data == [(src / p.relative_to(mnt)).read_bytes() for p in paths]
    assert readahead["cold_batches"] >= 1 and readahead["pushed_files"] > 0.9 * len(paths), readahead
    # What did go through the page cache: the sentinels, one probe read per batch.
    assert cached < 0.1 * sum(shard.stat().st_size for shard in shards), (cached, json.dumps(readahead))
