#!/usr/bin/env python3
"""obstore against boto3 as dlfs's S3 client, on a SeaweedFS server on loopback.

What dlfs asks of a client: many ranged GETs of a file's size from threads at once (the mount), and
multipart uploads of shards (pack). Both clients get the same work, twice, alternating; the
figures are requests or MiB per second and the client process's CPU (2 cores: CPU per request is
what bounds a busy node). docs/design.md quotes the result.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import obstore
from boto3.s3.transfer import TransferConfig
from s3_baselines import s3_store
from seaweed import SeaweedServer

from dlfs.bench.probes import rusage_cpu

BUCKET = "clients"
PART = 16 << 20
TRANSFER = TransferConfig(multipart_chunksize=PART, max_concurrency=4)


def timed(work: Callable[[], object]) -> tuple[float, float]:
    """Wall and CPU seconds of ``work``."""
    wall, cpu = time.perf_counter(), rusage_cpu()
    work()
    return time.perf_counter() - wall, rusage_cpu() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gets", type=int, default=4000)
    parser.add_argument("--size", type=int, default=110_000, help="bytes per ranged GET")
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--upload-mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    with SeaweedServer(tempfile.mkdtemp(dir="/var/tmp", prefix="dlfs-clients-")) as server:
        server.create_bucket(BUCKET)
        store, client = s3_store(server.env(), BUCKET), server.client()
        obstore.put(store, "blob", os.urandom(64 << 20))
        rng = random.Random(0)
        offsets = [rng.randrange(0, (64 << 20) - args.size) for _ in range(args.gets)]

        def by_obstore(offset: int) -> int:
            return len(obstore.get_range(store, "blob", start=offset, length=args.size))

        def by_boto3(offset: int) -> int:
            answer = client.get_object(
                Bucket=BUCKET, Key="blob", Range=f"bytes={offset}-{offset + args.size - 1}"
            )
            return len(answer["Body"].read())

        payload = os.urandom(args.upload_mib << 20)
        uploads = {
            "obstore": lambda: obstore.put(
                store, "up", iter([payload[i : i + (1 << 20)] for i in range(0, len(payload), 1 << 20)]),
                chunk_size=PART, max_concurrency=4,
            ),
            "boto3": lambda: client.upload_fileobj(
                io.BytesIO(payload), BUCKET, "up", Config=TRANSFER
            ),
        }  # fmt: skip
        for _ in range(args.repeat):
            for name, get in (("obstore", by_obstore), ("boto3", by_boto3)):
                with ThreadPoolExecutor(args.threads) as pool:
                    wall, cpu = timed(lambda get=get, pool=pool: sum(pool.map(get, offsets)))
                print(
                    f"{name:8} {args.gets} ranged GETs of {args.size:,} B, {args.threads} threads: "
                    f"{args.gets / wall:,.0f}/s, {cpu / args.gets * 1e6:,.0f} µs CPU each"
                )
            for name, upload in uploads.items():
                wall, cpu = timed(upload)
                print(
                    f"{name:8} multipart upload of {args.upload_mib} MiB: "
                    f"{args.upload_mib / wall:,.0f} MiB/s, {cpu:.2f} s CPU"
                )


if __name__ == "__main__":
    main()
