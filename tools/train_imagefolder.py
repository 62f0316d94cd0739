#!/usr/bin/env python3
"""One training epoch the way an unmodified script runs it: ImageFolder + DataLoader + (optionally) a model.

The dataset is ``torchvision.datasets.ImageFolder`` with its default loader and the standard ResNet-50
training transform; the loader either shuffles (``--sampler shuffle``, what scripts do today) or
follows the mount's published order (``--sampler dlfs``, the one-line change). Reports images/s, the
epoch time and how long the loop waited on the loader: the part of the epoch storage is to blame for.
``--model`` adds a small CNN's forward, backward and SGD step per batch, so compute overlaps loading.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

#: The ResNet-50 ImageNet training transform (torchvision references, train.py).
TRAIN_TRANSFORM = transforms.Compose(
    [
        transforms.RandomResizedCrop(224),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
    ]
)


def small_model(classes: int) -> nn.Module:
    """A few strided convolutions: enough compute to overlap loading, small enough for 2 cores."""
    return nn.Sequential(
        nn.Conv2d(3, 16, 5, stride=4),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, classes),
    )


def imagefolder_loader(
    root: str | Path, sampler: str, batch_size: int, workers: int, epoch: int, pin_memory: bool = False
) -> tuple[datasets.ImageFolder, DataLoader, float]:
    """The dataset and loader an unmodified script builds, and the seconds ImageFolder's scan took."""
    started = time.perf_counter()
    dataset = datasets.ImageFolder(str(root), transform=TRAIN_TRANSFORM)
    scan_s = time.perf_counter() - started
    common = {"batch_size": batch_size, "num_workers": workers, "pin_memory": pin_memory}
    if sampler == "dlfs":
        from dlfs.torch import ShuffleSampler

        order = ShuffleSampler(dataset)
        order.set_epoch(epoch)
        return dataset, DataLoader(dataset, sampler=order, **common), scan_s
    torch.manual_seed(epoch)
    return dataset, DataLoader(dataset, shuffle=True, **common), scan_s


Step = Callable[[torch.Tensor, torch.Tensor], None]


def sgd_step(model: nn.Module, device: torch.device, bf16: bool = False, channels_last: bool = False) -> Step:
    """One training step of ``model`` on ``device``: forward (under bf16 autocast if asked), backward, SGD.

    On a GPU the step ends when the device is done, so that the loop's wait for the next batch is
    time the device sat idle for want of data, not time it was still busy with the last step.
    """
    model.to(device)
    if channels_last:
        model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    layout = torch.channels_last if channels_last else torch.contiguous_format

    def step(inputs: torch.Tensor, targets: torch.Tensor) -> None:
        inputs = inputs.to(device, non_blocking=True).contiguous(memory_format=layout)
        targets = targets.to(device, non_blocking=True)
        optimiser.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        optimiser.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return step


def run_epoch(loader: DataLoader, step: Step | None) -> dict[str, float]:
    """One pass over ``loader``, ``step`` on every batch: images/s and how long the loop waited for data."""
    images = 0
    waited = 0.0
    # The clock starts before the loader asks the sampler for the order, which arms dlfs's read-ahead:
    # started after, the read-ahead would get a head start the native tree does not.
    first = time.perf_counter()
    batches = iter(loader)
    while True:
        asked = time.perf_counter()
        batch = next(batches, None)
        waited += time.perf_counter() - asked
        if batch is None:
            break
        inputs, targets = batch
        images += len(targets)
        if step:
            step(inputs, targets)
    ended = time.perf_counter()
    return {
        "images": images,
        "epoch_s": ended - first,
        "images_per_s": images / (ended - first),
        "data_wait_s": waited,
        "data_wait_share": waited / (ended - first),
    }


def train_epoch(args: argparse.Namespace) -> dict[str, float]:
    dataset, loader, scan_s = imagefolder_loader(
        args.root, args.sampler, args.batch_size, args.workers, args.epoch
    )
    step = sgd_step(small_model(len(dataset.classes)), torch.device("cpu")) if args.model else None
    return {"scan_s": scan_s, **run_epoch(loader, step)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("root", help="the ImageFolder root: a native tree or a dlfs mount")
    parser.add_argument("--sampler", choices=("shuffle", "dlfs"), default="shuffle")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers (default 2)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epoch", type=int, default=0, help="which epoch's order to read (default 0)")
    parser.add_argument("--model", action="store_true", help="add a small CNN's training step per batch")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    result = train_epoch(args)
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"{result['images']} images in {result['epoch_s']:.1f} s ({result['images_per_s']:.0f} images/s), "
        f"waited on data {result['data_wait_s']:.1f} s ({result['data_wait_share']:.0%}); "
        f"ImageFolder scan {result['scan_s']:.2f} s"
    )


if __name__ == "__main__":
    main()
