#!/usr/bin/env python3
"""A training node's data path in one command: ``tools/bench_node.py --out FILE [--small]``.

What a team asks before it adopts dlfs, measured on the node itself, with every baseline in the
same run:

- **The machine**: cores, memory, kernel, Python, GPU; and whether FUSE works, tried with a real
  dlfs mount (when it does not, the reason is recorded and only the native parts run).
- **The loader matrix**: an unmodified loader's reads (``tools/bench_loader.py``'s ``shuffleload``,
  ``shuffle=True``, and ``orderload``, the published order; torchvision's default loader) with 1,
  4, 8 and 16 reader processes, warm, a fresh mount for every run, over the native tree,
  squashfuse_ll and dlfs: files/s, and the CPU the FUSE daemon spent per file.
- **End to end**: torchvision's ResNet-50 (bf16 autocast, channels_last, batch 256, SGD) trained
  from an unmodified ``ImageFolder`` + ``DataLoader`` (``tools/train_imagefolder.py``: one worker per
  core the training loop leaves, the standard RandomResizedCrop/flip/normalize) over the native tree
  (``shuffle=True``), a dlfs mount and a dlfs ``--transform resize:256`` pack (both in the published
  order), warm and cold (page cache dropped): images/s, and the share of the epoch the GPU waited
  for its next batch.

The data is one tree of photo-like JPEGs of ImageNet's sizes and dimensions
(``tools/make_imagenet_like.py --payload photo``), generated under ``--work`` on first use.
``--small`` runs every part in a few minutes on a laptop-sized machine: a small tree, readers up to
4, and the training loop on the CPU with a small convolutional net instead of ResNet-50. Nothing is
downloaded: the model starts from random weights.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_loader import matrix
from bench_transform import PACK_FIGURES, pack
from benchdoc import DASH, TIMES, Json, document, number, ratio, table
from benchlib import can_drop_caches, dlfs_mount, drop_caches, ensure_tree, warm_storage

from dlfs.bench import peers

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class Scale:
    """How big each part runs: the node's, or ``--small``'s."""

    files: int
    classes: int
    readers: tuple[int, ...]
    #: Files a loader process takes at a time in the loader matrix.
    loader_batch: int
    model: str
    batch: int
    resolution: int


SCALES = {
    "node": Scale(20_000, 100, (1, 4, 8, 16), 64, "resnet50", 256, 224),
    "small": Scale(160, 4, (1, 4), 16, "small", 32, 224),
}
#: The loader matrix's jobs: what an unmodified training job reads, without and with the published order.
LOADER_JOBS = ("shuffleload", "orderload")
RESIZE = "resize:256"
#: Untimed training steps on random data before the first epoch: the GPU's kernels chosen and loaded.
WARMUP_STEPS = 3


def gpu_name() -> str | None:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def probe_fuse(work: Path) -> Json:
    """Whether a dlfs mount works here: a tiny dataset packed, mounted and read back for real."""
    if not os.path.exists("/dev/fuse"):
        return {
            "works": False,
            "reason": "/dev/fuse does not exist (load the fuse module, or pass the device in)",
        }
    if not shutil.which("fusermount3"):
        return {"works": False, "reason": "fusermount3 is not installed (the fuse3 package)"}
    src, dataset, mnt = work / "probe-src", work / "probe", work / "probe-mnt"
    shutil.rmtree(src, ignore_errors=True)
    (src / "a").mkdir(parents=True)
    payload = os.urandom(4096)
    (src / "a" / "0.JPEG").write_bytes(payload)
    step = "dlfs pack"
    try:
        pack(src, dataset)
        step = "dlfs mount"
        with dlfs_mount(dataset, mnt):
            if (mnt / "a" / "0.JPEG").read_bytes() != payload:
                return {"works": False, "reason": "a file read through the mount differs from its source"}
    except subprocess.CalledProcessError as exc:
        lines = (exc.stderr or "").strip().splitlines() or [f"exit status {exc.returncode}"]
        return {"works": False, "reason": f"{step} failed: {lines[-1]}"}
    except OSError as exc:
        return {"works": False, "reason": f"{step} failed: {exc}"}
    return {"works": True}


def loader_matrix(src: Path, plain: Path, work: Path, scale: Scale, fuse: bool, skipped: list[str]) -> Json:
    """The loader matrix over the roots this node can mount; what it cannot run goes to ``skipped``."""
    cases = ["native"]
    jobs = list(LOADER_JOBS)
    if fuse:
        squash = peers.PEERS[1]
        if peers.available(squash):
            cases.append("squashfuse_ll")
        else:
            skipped.append(f"squashfuse_ll: {' and '.join(squash.tools)} not installed")
        cases.append("dlfs")
    else:
        jobs.remove("orderload")
        skipped.append(
            "the loader matrix's FUSE roots and orderload (the published order comes from a mount)"
        )
    results = matrix(src, plain, work, cases, jobs, ["warm"], scale.readers, scale.loader_batch, 1)
    return {"readers": list(scale.readers), "batch": scale.loader_batch, "results": results}


def model_for(scale: Scale, classes: int) -> nn.Module:
    from torchvision import models
    from train_imagefolder import small_model

    return (
        small_model(classes) if scale.model == "small" else models.resnet50(weights=None, num_classes=classes)
    )


def end_to_end(
    src: Path, datasets: dict[str, Path], work: Path, scale: Scale, cold: bool, skipped: list[str]
) -> Json:
    """One epoch per case, one model trained on through all of them: images/s and the GPU's wait."""
    import torch
    from train_imagefolder import imagefolder_loader, run_epoch, sgd_step

    cuda = torch.cuda.is_available() and scale.model != "small"
    if scale.model != "small" and not cuda:
        skipped.append("end to end: no CUDA device for ResNet-50 (run with --small for the CPU loop)")
        return {}
    device = torch.device("cuda" if cuda else "cpu")
    if not cuda:
        torch.set_num_threads(1)  # the training loop's one core: the others are the loader's workers
    torch.backends.cudnn.benchmark = True
    workers = max(1, len(os.sched_getaffinity(0)) - 1)
    model = model_for(scale, scale.classes)
    step = sgd_step(model, device, bf16=cuda, channels_last=cuda)
    for _ in range(WARMUP_STEPS):
        step(
            torch.randn(scale.batch, 3, scale.resolution, scale.resolution),
            torch.randint(scale.classes, (scale.batch,)),
        )
    temperatures = ["warm", "cold"] if cold else ["warm"]
    if not cold:
        skipped.append("end to end, cold: dropping the page cache needs root (/proc/sys/vm/drop_caches)")
    roots: dict[str, Path | None] = {
        "native": None,
        **{f"dlfs {name}": path for name, path in datasets.items()},
    }
    mnt = work / "mnt"
    runs: dict[str, Json] = {}
    for temperature in temperatures:
        for name, dataset in roots.items():
            storage = dataset or src
            if temperature == "cold":
                drop_caches()
            else:
                warm_storage(storage)
            mounted: AbstractContextManager[object] = (
                dlfs_mount(dataset, mnt, "--log-file", str(work / "mount.log")) if dataset else nullcontext()
            )
            with mounted:
                root = mnt if dataset else src
                sampler = "dlfs" if dataset else "shuffle"
                _, loader, scan_s = imagefolder_loader(
                    root, sampler, scale.batch, workers, 0, pin_memory=cuda
                )
                run = {"sampler": sampler, "scan_s": scan_s, **run_epoch(loader, step)}
            runs[f"{name} {temperature}"] = run
            print(
                f"train {name:18} {temperature:5} {run['images_per_s']:8,.0f} images/s, "
                f"waited {run['data_wait_share']:.0%}",
                file=sys.stderr,
                flush=True,
            )
    return {
        "model": "torchvision's ResNet-50" if scale.model == "resnet50" else "A small convolutional net",
        "device": gpu_name() if cuda else "cpu",
        "bf16": cuda,
        "channels_last": cuda,
        "batch": scale.batch,
        "workers": workers,
        "runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="where to write the JSON")
    parser.add_argument("--small", action="store_true", help="every part, small, in a few minutes on a CPU")
    parser.add_argument(
        "--work", type=Path, default=Path("bench-data/node"), help="data (default bench-data/node)"
    )
    args = parser.parse_args()
    started = time.monotonic()
    scale = SCALES["small" if args.small else "node"]
    work: Path = args.work
    ensure_tree(work, scale.files, scale.classes, "photo")
    src = work / "src"
    fuse = probe_fuse(work)
    skipped: list[str] = []
    packs: dict[str, Json] = {}
    datasets: dict[str, Path] = {}
    if fuse["works"]:
        for name, flags in (("plain", ()), (RESIZE, ("--transform", RESIZE))):
            datasets[name] = work / name.replace(":", "-")
            summary = pack(src, datasets[name], *flags)
            packs[name] = {key: summary[key] for key in PACK_FIGURES}
    else:
        skipped.append(f"every dlfs part: FUSE does not work here ({fuse['reason']})")
    loader = loader_matrix(src, datasets.get("plain", src), work / "loader", scale, fuse["works"], skipped)
    train = end_to_end(src, datasets, work, scale, can_drop_caches(), skipped)
    results = {
        "scale": "small" if args.small else "node",
        "sizes": asdict(scale),
        "tree_bytes": sum(p.stat().st_size for p in src.rglob("*") if p.is_file()),
        "fuse": fuse,
        "packs": packs,
        "loader": loader,
        "train": train,
        "skipped": skipped,
        "seconds": time.monotonic() - started,
    }
    args.out.write_text(json.dumps(document(results, gpu=gpu_name()), indent=2) + "\n")
    print(f"wrote {args.out} in {results['seconds']:.0f} s", file=sys.stderr)


TITLE = "A training node's data path"


def render(data: Json) -> list[str]:
    """This benchmark's section of docs/benchmarks.md: the loader matrix, then training end to end,
    each beside its baseline and the target it is held to."""
    sizes = data["sizes"]
    fuse = data["fuse"]
    out = [
        f"`tools/bench_node.py` ({data['scale']} scale, {data['seconds']:.0f} s in all) on "
        f"{sizes['files']:,} photo-like JPEGs of ImageNet's sizes and dimensions in {sizes['classes']} "
        f"classes ({data['tree_bytes'] / 1e9:.2f} GB). FUSE: "
        + ("works (a dlfs mount read back)." if fuse["works"] else f"does not work: {fuse['reason']}."),
        "",
    ]
    if data["packs"]:
        made = [
            f"{name} {p['bytes'] / 1e9:.2f} GB in {p['seconds']:.1f} s" for name, p in data["packs"].items()
        ]
        out += ["`dlfs pack`: " + "; ".join(made) + ".", ""]
    if data["skipped"]:
        out += ["Left out: " + "; ".join(data["skipped"]) + ".", ""]
    out += loader_table(data["loader"])
    if data["train"]:
        out += train_table(data["train"])
    return out


def files_and_cpu(row: Json) -> str:
    """Files/s, and where a FUSE daemon served them its CPU per file."""
    files = row["items_per_s"] * row["seconds"]
    if "daemon_cpu_s" not in row or not files:
        return number(row["items_per_s"])
    return f"{number(row['items_per_s'])} ({row['daemon_cpu_s'] / files * 1e6:.0f} µs)"


def loader_table(loader: Json) -> list[str]:
    results = loader["results"]
    cases = [c for c in ("native", "squashfuse_ll", "dlfs") if any(c in row for row in results.values())]
    out = [
        "### The loader matrix",
        "",
        "Every file read by an unmodified loader (torchvision's default loader, batches of "
        f"{loader['batch']}) with `shuffle=True` (`shuffleload`) or the published order (`orderload`); "
        "warm, a fresh mount and an ImageFolder scan before every FUSE run; one run each. Files/s, "
        "then the FUSE daemon's CPU per file in µs.",
        "",
    ]
    rows = []
    for key, by_case in results.items():
        fps = {case: by_case[case]["items_per_s"] for case in cases if case in by_case}
        rows.append(
            [
                key,
                *[files_and_cpu(by_case[c]) if c in fps else DASH for c in cases],
                ratio(fps.get("dlfs", 0), fps.get("native", 0)),
                ratio(fps.get("dlfs", 0), fps.get("squashfuse_ll", 0)),
            ]
        )
    out += table(["job, temperature, readers", *cases, "dlfs / native", "dlfs / squashfuse_ll"], rows)
    return [*out, "", *loader_targets(results, loader["readers"]), ""]


def loader_targets(results: Json, readers: list[int]) -> list[str]:
    """The loader matrix's targets, measured at the reader counts this run had."""

    def fps(job: str, n: int, case: str) -> float:
        return results.get(f"{job} warm {n}", {}).get(case, {}).get("items_per_s", 0.0)

    mid, most = (8 if 8 in readers else readers[-1]), readers[-1]
    rows: list[tuple[str, str, float]] = [
        (
            f"published order, {mid} readers: dlfs / native",
            "0.5",
            quotient(fps("orderload", mid, "dlfs"), fps("orderload", mid, "native")),
        ),
        (
            f"`shuffle=True`, {mid} readers: dlfs / squashfuse_ll",
            "1.5",
            quotient(fps("shuffleload", mid, "dlfs"), fps("shuffleload", mid, "squashfuse_ll")),
        ),
        (
            f"published order, dlfs: {most} readers / 1",
            "4",
            quotient(fps("orderload", most, "dlfs"), fps("orderload", 1, "dlfs")),
        ),
    ]
    return target_lines(rows)


def quotient(a: float, b: float) -> float:
    """a / b, or 0 (not measured) where b was not."""
    return a / b if b else 0.0


def target_lines(rows: list[tuple[str, str, float]]) -> list[str]:
    """Each target: the ratio it asks, the ratio measured, and whether it was met."""
    lines = []
    for label, wanted, got in rows:
        if not got:
            lines.append(f"- {label}: not measured (target ≥ {wanted}{TIMES})")
            continue
        met = "met" if got >= float(wanted) else "**not met**"
        lines.append(f"- {label}: {got:.2f}{TIMES} (target ≥ {wanted}{TIMES}, {met})")
    return ["Targets:", "", *lines]


def train_table(train: Json) -> list[str]:
    runs = train["runs"]
    out = [
        "### Training end to end",
        "",
        f"{train['model']} on {train['device']}"
        + (", bf16 autocast, channels_last" if train["bf16"] else "")
        + f", batch {train['batch']}, SGD; ImageFolder + DataLoader with {train['workers']} worker "
        "processes and RandomResizedCrop(224)/flip/normalize; the native tree with `shuffle=True`, "
        "the dlfs mounts in the published order (`ShuffleSampler`). One epoch each; *cold*: page "
        "cache dropped, then mount and scan. *Waited*: the share of the epoch the device sat idle "
        "for its next batch.",
        "",
    ]
    rows = []
    for key, run in runs.items():
        temperature = key.rsplit(" ", 1)[1]
        native = runs.get(f"native {temperature}")
        rows.append(
            [
                key,
                f"{run['images']:,}",
                number(run["images_per_s"]),
                ratio(run["images_per_s"], native["images_per_s"]) if native else DASH,
                f"{run['data_wait_share']:.0%}",
                f"{run['scan_s']:.2f}",
            ]
        )
    out += table(["data, temperature", "images", "images/s", "vs native", "waited", "scan s"], rows)

    def vs(key: str, base: str) -> float:
        return quotient(
            runs.get(key, {}).get("images_per_s", 0.0), runs.get(base, {}).get("images_per_s", 0.0)
        )

    targets = [
        ("a dlfs mount, warm: / native", "0.95", vs("dlfs plain warm", "native warm")),
        ("a dlfs mount, cold, published order: / native", "1.0", vs("dlfs plain cold", "native cold")),
        (f"a dlfs `{RESIZE}` pack, warm: / native", "1.5", vs(f"dlfs {RESIZE} warm", "native warm")),
    ]
    return [*out, "", *target_lines(targets), ""]


if __name__ == "__main__":
    main()
