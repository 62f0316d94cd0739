"""The baselines dlfs over S3 is compared against: one object per file, and a RAM cache server.

The usual way to keep a small-file dataset in S3 is one object per file, fetched with one GET each:
``upload_objects`` stores a tree that way and ``get_objects`` reads it back in a given order (the
epoch's), both with a pool of threads over obstore, whose calls leave the GIL. ``memcached_latency``
measures the floor of a per-sample lookup in a networked cache (memcached on loopback), the other
layout people put in front of a slow store.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import obstore
from obstore.store import ObjectStore, S3Store
from pymemcache.client.base import Client as MemcacheClient
from seaweed import free_ports
from tqdm import tqdm

#: Seconds memcached gets to accept a connection, and after SIGTERM to exit.
MEMCACHED_START_TIMEOUT = 10.0
MEMCACHED_STOP_GRACE = 2.0

Item = TypeVar("Item")


@dataclass(frozen=True)
class Result:
    """What one pass over a set of objects moved, and how fast (MB = 10^6 bytes, as in ``report``)."""

    objects: int
    bytes: int
    seconds: float
    objects_per_s: float
    mb_per_s: float

    @classmethod
    def of(cls, objects: int, nbytes: int, seconds: float) -> Result:
        seconds = max(seconds, 1e-9)
        return cls(objects, nbytes, seconds, objects / seconds, nbytes / seconds / 1e6)


def s3_store(env: Mapping[str, str], bucket: str, prefix: str = "") -> S3Store:
    """An obstore S3 store from the AWS variables a server hands out (``SeaweedServer.env()``)."""
    return S3Store(
        bucket,
        prefix=prefix or None,
        endpoint=env["AWS_ENDPOINT_URL"],
        access_key_id=env["AWS_ACCESS_KEY_ID"],
        secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region=env["AWS_REGION"],
        client_options={"allow_http": True},
    )


def _timed_pool(
    work: Callable[[Item], int], items: list[Item], threads: int, desc: str, progress: bool
) -> Result:
    """Run ``work`` (which returns bytes moved) on every item with ``threads`` threads, in order."""
    total = 0
    started = time.perf_counter()
    with (
        ThreadPoolExecutor(max_workers=threads) as pool,
        tqdm(total=len(items), unit="obj", desc=desc, disable=not progress, dynamic_ncols=True) as bar,
    ):
        for size in pool.map(work, items):
            total += size
            bar.update()
    return Result.of(len(items), total, time.perf_counter() - started)


def _regular_files(root: Path) -> Iterable[Path]:
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder, name)
            if path.is_file() and not path.is_symlink():
                yield path


def upload_objects(store: ObjectStore, root: Path, threads: int, *, progress: bool = False) -> Result:
    """Store every regular file under ``root`` as one object, keyed by its path relative to ``root``."""
    files = sorted(_regular_files(root))

    def put(path: Path) -> int:
        data = path.read_bytes()
        obstore.put(store, path.relative_to(root).as_posix(), data)
        return len(data)

    return _timed_pool(put, files, threads, "upload", progress)


def get_objects(store: ObjectStore, keys: list[str], threads: int, *, progress: bool = False) -> Result:
    """GET every key whole, issued in the order given; the bytes are counted and dropped."""

    def get(key: str) -> int:
        return len(obstore.get(store, key).bytes())

    return _timed_pool(get, keys, threads, "get", progress)


def memcached_latency(value_size: int = 110_000, gets: int = 2000) -> dict[str, float]:
    """Percentiles of one GET of a ``value_size`` value from a memcached on loopback, one client."""
    binary = shutil.which("memcached")
    if binary is None:
        raise RuntimeError("memcached not found: run tools/install-deps.sh")
    (port,) = free_ports(1)
    # -u only takes effect as root, where memcached refuses to run without it; -U 0: no UDP.
    command = [binary, "-l", "127.0.0.1", "-p", str(port), "-U", "0", "-m", "256", "-I", "2m", "-u", "nobody"]
    process = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        client = _memcached_client(process, port)
        value = os.urandom(value_size)
        client.set("dlfs-sample", value)
        if client.get("dlfs-sample") != value:
            raise RuntimeError("memcached returned a different value than was set")
        samples = np.empty(gets, dtype=np.int64)
        for i in range(gets):
            started = time.perf_counter_ns()
            client.get("dlfs-sample")
            samples[i] = time.perf_counter_ns() - started
        client.close()
    finally:
        process.terminate()
        try:
            process.communicate(timeout=MEMCACHED_STOP_GRACE)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
    p50, p99 = np.percentile(samples, [50, 99]) / 1e3
    return {"p50_us": float(p50), "p99_us": float(p99), "gets": gets}


def _memcached_client(process: subprocess.Popen[bytes], port: int) -> MemcacheClient:
    """A client once memcached answers; its stderr in the error if it exits first."""
    deadline = time.monotonic() + MEMCACHED_START_TIMEOUT
    while True:
        if process.poll() is not None:
            assert process.stderr is not None
            raise RuntimeError(
                f"memcached exited ({process.returncode}): {process.stderr.read().decode().strip()}"
            )
        client = MemcacheClient(("127.0.0.1", port), connect_timeout=1, timeout=5, no_delay=True)
        try:
            client.version()
            return client
        except OSError:
            client.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
