#!/usr/bin/env python3
"""Metadata at ImageNet-21k scale: an index of 14.2 M files mounted and looked up, beside
ImageNet-1k's 1.28 M.

Packing 14.2 M real files takes most of an hour here and the question is the index, so each
dataset is synthesised: the index a pack of that many tiny files in that many class folders would
write (ImageNet-like names, in the order pack numbers rows, 16 bytes of payload each in one shard),
through the same encoder. For each size: the wall time of ``dlfs mount`` until the mount answers
(index copied, checksummed and validated; with the index in the page cache, and with the page
cache dropped), the daemon's RSS after mounting and after the lookups, and the latency of ``stat``
on random files (one process, each stat a LOOKUP of a file the kernel has not seen, in a folder it
has), with the daemon's CPU time per LOOKUP."""

from __future__ import annotations

import argparse
import json
import os
import stat
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchdoc import DASH, Json, print_document, table
from benchlib import can_drop_caches, current_dataset, dlfs_mount, drop_caches, warm_storage

from dlfs import __version__
from dlfs.core import format as fmt

PAYLOAD = b"0123456789abcdef"
#: Shapes measured: ImageNet-1k and ImageNet-21k (files, class folders).
SHAPES = {"imagenet-1k": (1_281_167, 1_000), "imagenet-21k": (14_197_122, 21_841)}


def _digits(values: np.ndarray, width: int) -> np.ndarray:
    """Each value as ``width`` zero-padded ASCII digits: an (n, width) uint8 array."""
    powers = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
    return (values[:, None] // powers % 10 + ord("0")).astype(np.uint8)


def synthesise(dst: Path, files: int, classes: int) -> None:
    """Write the index and the one shard of ``files`` files in ``classes`` folders into ``dst``."""
    dataset_id = fmt.new_dataset_id()
    per_class = np.full(classes, files // classes, dtype=np.int64)
    per_class[: files % classes] += 1
    class_of = np.repeat(np.arange(classes, dtype=np.int64), per_class)
    within = np.arange(files, dtype=np.int64) - np.repeat(np.cumsum(per_class) - per_class, per_class)
    # Class folders n00000000.. and files n00000000_000000.JPEG..: zero-padded, so that sorted by
    # bytes, as pack sorts every folder, is sorted by number.
    folder_names = np.hstack([np.full((classes, 1), ord("n"), np.uint8), _digits(np.arange(classes), 8)])
    file_names = np.hstack(
        [
            np.full((files, 1), ord("n"), np.uint8),
            _digits(class_of, 8),
            np.full((files, 1), ord("_"), np.uint8),
            _digits(within, 6),
            np.frombuffer(b".JPEG" * files, np.uint8).reshape(files, 5),
        ]
    )
    rows = 1 + classes + files
    name_len = np.concatenate(
        [[0], np.full(classes, folder_names.shape[1]), np.full(files, file_names.shape[1])]
    )
    name_off = np.zeros(rows + 1, dtype=np.uint64)
    np.cumsum(name_len, out=name_off[1:])
    is_file = np.arange(rows) > classes
    shard_size = fmt.HEADER_SIZE + files * len(PAYLOAD)
    offset = np.zeros(rows, dtype=np.uint64)
    offset[is_file] = fmt.HEADER_SIZE + np.arange(files, dtype=np.uint64) * len(PAYLOAD)
    arrays = {
        "parent": np.concatenate([[0], np.zeros(classes, np.int64), 1 + class_of]),
        "name_off": name_off,
        "names": np.concatenate([folder_names.ravel(), file_names.ravel()]),
        "mode": np.where(is_file, stat.S_IFREG | 0o644, stat.S_IFDIR | 0o755),
        "owner": np.zeros(rows, np.uint16),
        "owners": np.zeros(2, np.uint32),
        "size": np.where(is_file, len(PAYLOAD), 0),
        "mtime": np.full(rows, 1_600_000_000 * 10**9, np.int64),
        "shard": np.zeros(rows, np.uint32),
        "offset": offset,
        "stored": np.where(is_file, len(PAYLOAD), 0),
        "checksum": np.where(is_file, np.uint64(fmt.checksum(PAYLOAD)), np.uint64(0)),
        "flags": np.zeros(rows, np.uint8),
        "links": np.zeros(0, np.uint8),
    }
    shard = fmt.shard_name(dataset_id, 0)
    meta = {
        "dataset_id": dataset_id,
        "created_ns": time.time_ns(),
        "dlfs_version": __version__,
        "build": {"source": f"synthesised: {files} files in {classes} folders", "transform": "none"},
        "shards": [(shard, shard_size)],
    }
    dst.mkdir(parents=True, exist_ok=True)
    with open(dst / shard, "wb") as out:
        out.write(fmt.shard_header(dataset_id, 0))
        chunk = PAYLOAD * (1 << 20)
        left = files * len(PAYLOAD)
        while left:
            out.write(chunk[:left])
            left -= min(left, len(chunk))
    (dst / fmt.INDEX_NAME).write_bytes(fmt.encode_index(arrays, meta))


def lookups(mnt: Path, files: int, classes: int, count: int) -> list[float]:
    """Seconds of ``stat`` on ``count`` random files, each a file the kernel has not looked up, in
    a folder it has (looked up first, untimed: 21,841 folders would otherwise make most stats at
    14.2 M files two LOOKUPs and one at 1.28 M)."""
    rng = np.random.default_rng(0)
    per_class = files // classes
    picks = rng.choice(per_class * classes, size=count, replace=False)
    times = []
    for pick in picks.tolist():
        cls, k = divmod(pick, per_class)
        folder = mnt / f"n{cls:08d}"
        os.stat(folder)
        path = folder / f"n{cls:08d}_{k:06d}.JPEG"
        started = time.perf_counter()
        os.stat(path)
        times.append(time.perf_counter() - started)
    return times


def memory(pid: int) -> dict[str, int]:
    """The daemon's RSS and its parts: anonymous memory (what it allocated), shared memory (the
    pages of the index's sealed copy that it has mapped) and file pages (its libraries)."""
    fields = {"VmRSS": "rss", "RssAnon": "anon", "RssShmem": "shmem", "RssFile": "file"}
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in fields:
            found[fields[key]] = int(value.split()[0]) * 1024
    return found


def measure(dataset: Path, mnt: Path, files: int, classes: int, count: int) -> dict[str, float]:
    index = dataset / fmt.INDEX_NAME
    result: dict[str, float] = {"index_bytes": index.stat().st_size}
    runs = [("warm", lambda: warm_storage(index))] + ([("cold", drop_caches)] if can_drop_caches() else [])
    for name, before in runs:
        before()
        with dlfs_mount(dataset, mnt) as (pid, took):
            result[f"mount_{name}_s"] = took
            if name == "warm":
                result |= {f"{key}_after_mount": value for key, value in memory(pid).items()}
                times = sorted(lookups(mnt, files, classes, count))
                result |= {f"{key}_after_lookups": value for key, value in memory(pid).items()}
                native = json.loads((mnt / ".dlfs" / "stats").read_text())["native"]
                result["lookup_cpu_us"] = native["cpu_us_per_request"]["lookup"]
                result["stat_p50_us"] = statistics.median(times) * 1e6
                result["stat_p99_us"] = times[int(0.99 * (len(times) - 1))] * 1e6
    return result


def ensure_dataset(work: Path, shape: str) -> Path:
    """The dataset of ``shape`` under ``work``, synthesised on first use."""
    files, classes = SHAPES[shape]
    dataset = work / shape
    if not current_dataset(dataset):
        print(f"synthesising {shape}: {files:,} files in {classes:,} folders", file=sys.stderr, flush=True)
        synthesise(dataset, files, classes)
    return dataset


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work", type=Path, default=Path("bench-data/bigindex"))
    parser.add_argument("--shape", nargs="+", choices=SHAPES, default=list(SHAPES))
    parser.add_argument("--lookups", type=int, default=20_000, help="random files stat'ed per shape")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = {}
    for shape in args.shape:
        files, classes = SHAPES[shape]
        dataset = ensure_dataset(args.work, shape)
        results[shape] = {
            "files": files,
            "classes": classes,
            **measure(dataset, args.work / "mnt", files, classes, args.lookups),
        }
        print(f"{shape}: {json.dumps(results[shape])}", file=sys.stderr, flush=True)
    if args.json:
        print_document(results)
        return
    for shape, r in results.items():
        print(
            f"{shape:>13}: index {r['index_bytes'] / 2**20:,.0f} MiB, mount {r['mount_warm_s']:.2f} s warm"
            + (f" / {r['mount_cold_s']:.2f} s cold" if "mount_cold_s" in r else "")
            + f", RSS {r['rss_after_mount'] / 2**20:,.0f} MiB after mount "
            f"({r['anon_after_mount'] / 2**20:,.0f} anonymous), {r['rss_after_lookups'] / 2**20:,.0f} MiB "
            f"after lookups ({r['anon_after_lookups'] / 2**20:,.0f} anonymous), "
            f"stat p50 {r['stat_p50_us']:.0f} us, p99 {r['stat_p99_us']:.0f} us, "
            f"daemon CPU per LOOKUP {r['lookup_cpu_us']:.1f} us"
        )


TITLE = "An index of 14.2 M files"


def render(data: Json) -> list[str]:
    """This benchmark's section of docs/benchmarks.md, from its JSON results."""
    out = [
        "The index pack writes for ImageNet-1k's and ImageNet-21k's shapes (tiny payloads), synthesised "
        "by `tools/bench_bigindex.py` through pack's own encoder: `dlfs mount` until the mount answers "
        "(the index copied into the daemon's sealed memory, checksummed and checked row by row; with the "
        "index file in the page cache, and after dropping it), the daemon's RSS after mounting and after "
        "20,000 `stat`s of random files (of which anonymous; the rest is the sealed index copy, mapped "
        "whole, and the daemon's libraries), the latency of those `stat`s (each a LOOKUP of a file the "
        "kernel has not seen, in a folder it has) and the daemon's CPU time per LOOKUP.",
        "",
    ]
    mib = 1 << 20
    rows = []
    for shape, r in data.items():
        rows.append(
            [
                shape,
                f"{r['files']:,}",
                f"{r['index_bytes'] / mib:,.0f}",
                f"{r['mount_warm_s']:.2f}",
                f"{r['mount_cold_s']:.2f}" if "mount_cold_s" in r else DASH,
                f"{r['rss_after_mount'] / mib:,.0f} ({r['anon_after_mount'] / mib:,.0f})",
                f"{r['rss_after_lookups'] / mib:,.0f} ({r['anon_after_lookups'] / mib:,.0f})",
                f"{r['stat_p50_us']:.0f}",
                f"{r['stat_p99_us']:.0f}",
                f"{r['lookup_cpu_us']:.1f}" if "lookup_cpu_us" in r else DASH,
            ]
        )
    header = ["shape", "files", "index MiB", "mount s warm", "mount s cold", "RSS MiB mounted (anon)"]
    header += ["RSS MiB after stats (anon)", "stat p50 µs", "stat p99 µs", "CPU µs per LOOKUP"]
    out += table(header, rows)
    return [*out, ""]


if __name__ == "__main__":
    main()
