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


def train_epoch(args: argparse.Namespace) -> dict[str, float]:
    started = time.perf_counter()
    dataset = datasets.ImageFolder(args.root, transform=TRAIN_TRANSFORM)
    scanned = time.perf_counter()
    if args.sampler == "dlfs":
        from dlfs.torch import ShuffleSampler

        sampler = ShuffleSampler(dataset)
        sampler.set_epoch(args.epoch)
        loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers)
    else:
        torch.manual_seed(args.epoch)
        loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
    model = small_model(len(dataset.classes)) if args.model else None
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01) if model else None
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
        if model and optimiser:
            optimiser.zero_grad()
            nn.functional.cross_entropy(model(inputs), targets).backward()
            optimiser.step()
    ended = time.perf_counter()
    return {
        "images": images,
        "scan_s": scanned - started,
        "epoch_s": ended - first,
        "images_per_s": images / (ended - first),
        "data_wait_s": waited,
        "data_wait_share": waited / (ended - first),
    }


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
