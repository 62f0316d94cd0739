"""The read-ahead following its readers: one that starts the epoch over is followed from the start,
workers taking turns are one reader (no restarts), and one that goes quiet has its read-ahead
paused until it reads again."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mounts import counters_of, mount_stats
from readahead_checks import RANK_0, forget_everything, make_classes, published, read_all
from waits import wait_for


def test_restarting_an_epoch_is_followed(tmp_path: Path, pack_and_mount) -> None:
    src = make_classes(tmp_path / "src", classes=2, per_class=150, size=4000)
    with pack_and_mount(src, "--readahead-budget", "200K") as mnt:
        paths = published(mnt, "epoch-0")
        read_all(paths[:250])
        Path("/proc/sys/vm/drop_caches").write_text("3\n")  # forget the pages: the restart must refetch
        read_all(paths[:30])
        stats = mount_stats(mnt)["readahead"]
        assert stats["restarts"] >= 1


def test_interleaved_workers_are_one_reader_not_restarts(tmp_path: Path, pack_and_mount) -> None:
    """8 workers taking files k, k+8, ... never keep step; that must not look like restarts or skips.

    Like DataLoader workers, they drift apart only so far: the loader hands each worker its next
    indices as batches are consumed in order (at most workers x prefetch_factor batches out). Here
    a barrier every 16 files per worker bounds the drift to 128 positions, less than the 1 MiB
    lead (333 files). Free-running threads drifted a lead apart on a loaded machine, which is
    exactly what an epoch restart looks like.
    """
    in_step = threading.Barrier(8, timeout=60)

    def worker(share: list[Path]) -> list[bytes]:
        out = []
        for k in range(0, len(share), 16):
            in_step.wait()
            out += read_all(share[k : k + 16])
        return out

    src = make_classes(tmp_path / "src", classes=4, per_class=200, size=3000)
    with pack_and_mount(src, "--readahead-budget", "1M", "--ram-cache-size", "1M") as mnt:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")  # the kernel knows no file: every push lists first
        paths = published(mnt, "epoch-0")
        with ThreadPoolExecutor(8) as pool:
            shares = list(pool.map(worker, [paths[k::8] for k in range(8)]))
        # The read-ahead may finish its last batches after the readers are done.
        wait_for(
            lambda: not mount_stats(mnt)["readahead"]["inflight"],
            "the last batches in flight",
            counters_of(mnt),
        )
        stats = mount_stats(mnt)
    assert sorted(b for share in shares for b in share) == sorted(
        read_all([src / p.relative_to(mnt) for p in paths])
    )
    assert stats["readahead"]["restarts"] == 0 and stats["readahead"]["misses_ahead"] == 0, json.dumps(stats)
    readahead = stats["readahead"]
    # Each file is fetched ahead once, or skipped because a worker already read it into the kernel.
    assert readahead["issued_files"] + readahead["already_cached"] == len(paths), json.dumps(readahead)


def test_an_abandoned_reading_pauses_until_its_reader_reads_again(tmp_path: Path, pack_and_mount) -> None:
    """A job that stops mid-epoch: once its reader is quiet for ``--readahead-pause``, its reading
    shows paused, and evictions fetch nothing again; the reader's next read resumes the read-ahead
    from there."""
    src = make_classes(tmp_path / "src", classes=4, per_class=150, size=20_000)
    with pack_and_mount(src, "--readahead-budget", "2M", "--readahead-pause", "2") as mnt:
        paths = published(mnt, "epoch-0")
        read_all(paths[:100])

        def readahead() -> dict:
            return mount_stats(mnt)["readahead"]

        wait_for(
            lambda: readahead()["readings"][f"epoch-0.{RANK_0}"]["paused"],
            "the quiet reading to pause",
            counters_of(mnt),
        )
        paused = readahead()
        assert paused["paused_readings"] == 1 and paused["pauses"] == 1, json.dumps(paused)
        for _ in range(5):
            forget_everything(mnt, 100)
        wait_for(lambda: not readahead()["inflight"], "the batches in flight to end", counters_of(mnt))
        evicted = readahead()
        assert evicted["forgotten_ahead"] > 0, "the engine saw the lead forgotten"
        assert evicted["issued_files"] == paused["issued_files"], json.dumps(evicted)
        assert read_all(paths[100:101]) == [(src / paths[100].relative_to(mnt)).read_bytes()]
        wait_for(lambda: readahead()["resumes"] == 1, "the reading to resume", counters_of(mnt))
        # The budget holds 100 files: most of them are fetched ahead of the reader again.
        pushed = paused["pushed_files"] + 50
        wait_for(
            lambda: readahead()["pushed_files"] >= pushed,
            f"{pushed} files pushed",
            counters_of(mnt),
            seen=readahead,
        )
        assert readahead()["readings"][f"epoch-0.{RANK_0}"]["cursor"] == 100
