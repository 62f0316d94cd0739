"""One rank of a ``torch.distributed`` job (gloo, on 127.0.0.1) that makes a ShuffleSampler.

Run as ``python ddp_rank.py SPEC.json RANK``; the spec gives the port, the world size, each rank's
dataset folder (on the mount standing for its node), ``seed`` (None: the mount's) and, if given,
each rank's ``shares`` (the sampler's ``rank=``; by default the process's own). Prints one
JSON line: the rank's indices for epoch 0, or the ``OrderMismatchError`` it raised.
"""

from __future__ import annotations

import datetime
import json
import sys

import torch.distributed as dist
from torchvision import datasets

from dlfs.torch import OrderMismatchError, ShuffleSampler


def main() -> None:
    spec = json.loads(open(sys.argv[1]).read())
    rank = int(sys.argv[2])
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{spec['port']}",
        world_size=spec["world"],
        rank=rank,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        dataset = datasets.ImageFolder(spec["roots"][rank])
        try:
            share = spec["shares"][rank] if spec.get("shares") else None
            sampler = ShuffleSampler(dataset, rank=share, seed=spec["seed"])
        except OrderMismatchError as exc:
            print(json.dumps({"error": str(exc)}))
            return
        print(json.dumps({"indices": list(sampler), "size": len(dataset)}))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
