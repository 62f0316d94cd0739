"""A real ``dlfs pack`` into S3 interrupted at each moment of its upload (SIGINT, SIGTERM, a second
signal while it cleans up) leaves nothing under its prefix; one killed outright leaves a shard and an
open upload, which ``dlfs info`` names and the next pack removes."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from subprocess import Popen

import pytest
from commands import DLFS, assert_one_line_error, dlfs
from s3env import objects, open_uploads, split
from seaweed import SeaweedServer
from trees import SMALL_SHARD
from waits import Asked, wait_for

from dlfs.core import format as fmt

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def big_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Incompressible files enough for three shards of ``INTERRUPTED_SHARD``, each uploaded in a few
    parts: a pack of it takes long enough to be interrupted at every stage."""
    root = tmp_path_factory.mktemp("big")
    for folder in range(4):
        (root / f"class{folder}").mkdir()
        for number in range(12):
            (root / f"class{folder}" / f"{number}.bin").write_bytes(os.urandom(2 << 20))
    return root


INTERRUPTED_SHARD = 40 << 20


def _progress_events(process: subprocess.Popen[bytes], events: list[int]) -> None:
    """Count the progress bar's refreshes on ``process``'s stderr (each begins with a CR)."""
    assert process.stderr is not None
    while chunk := process.stderr.read1(4096):  # type: ignore[attr-defined]
        events[0] += chunk.count(b"\r")


def _parts_stored(server: SeaweedServer, url: str) -> bool:
    """Has an open upload under ``url`` stored a part? (One may complete between the two asks.)"""
    bucket, prefix = split(url)
    client = server.client()
    uploads = client.list_multipart_uploads(Bucket=bucket, Prefix=prefix + "/").get("Uploads", [])
    try:
        return any(
            client.list_parts(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"]).get("Parts")
            for upload in uploads
        )
    except client.exceptions.NoSuchUpload:
        return False


#: Moments of a pack into S3, each as a condition seen from outside the packing process.
MOMENTS: dict[str, Callable[[SeaweedServer, str, list[int]], bool]] = {
    "after 3 progress events": lambda server, url, events: events[0] >= 3,
    "an upload open": lambda server, url, events: bool(open_uploads(server, url)),
    "a part stored": lambda server, url, events: _parts_stored(server, url),
    "a shard written": lambda server, url, events: bool(objects(server, url)),
    "a shard written and an upload open": lambda server, url, events: bool(
        [name for name in objects(server, url) if name.endswith(fmt.SHARD_SUFFIX)]
        and open_uploads(server, url)
    ),
}


@contextmanager
def pack_until(
    big_tree: Path, url: str, reached: Callable[[list[int]], bool], *extra: str
) -> Iterator[Popen[bytes]]:
    """A real ``dlfs pack`` of ``big_tree`` into ``url``, once ``reached`` (given the count of
    progress events) says so; killed and reaped on the way out if it still runs."""
    shard_size = str(INTERRUPTED_SHARD)
    command = [*DLFS, "pack", str(big_tree), url, "--shard-size", shard_size, "--threads", "2", *extra]
    pipe = subprocess.PIPE
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=pipe, stderr=pipe)
    events = [0]
    reader = threading.Thread(target=_progress_events, args=(process, events), daemon=True)
    reader.start()
    try:
        wait_for(
            lambda: reached(events) or process.poll() is not None,
            "the moment to interrupt the pack at",
            Asked(process.pid),
            seconds=60,
        )
        assert process.poll() is None, "the pack ended first"
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
        reader.join(timeout=30)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("moment", "signals"),
    [
        ("after 3 progress events", [signal.SIGINT]),
        ("after 3 progress events", [signal.SIGTERM]),
        ("an upload open", [signal.SIGTERM]),
        ("a part stored", [signal.SIGINT, signal.SIGINT]),  # as ``timeout`` and a shell send it
        ("a part stored", [signal.SIGTERM]),
        ("a shard written", [signal.SIGINT]),
        ("a shard written", [signal.SIGTERM, signal.SIGINT]),
    ],
)
def test_an_interrupted_pack_leaves_no_object_and_no_unfinished_upload(
    big_tree: Path, s3_server: SeaweedServer, s3: str, moment: str, signals: list[int]
) -> None:
    """A real ``dlfs pack`` interrupted at one moment of its upload, by SIGINT or SIGTERM, once or
    with a second signal while it cleans up: it says so, and nothing is left under its prefix."""
    url = f"{s3}/interrupted"
    with pack_until(big_tree, url, lambda events: MOMENTS[moment](s3_server, url, events)) as process:
        for signum in signals:
            process.send_signal(signum)
        assert process.wait(timeout=60) == 130
    assert objects(s3_server, url) == []
    assert open_uploads(s3_server, url) == []


def _killed_while_uploading(big_tree: Path, server: SeaweedServer, url: str, *extra: str) -> tuple[str, str]:
    """SIGKILL a pack into ``url`` once it has written a shard and opened another's upload; the
    names of those two."""
    before = objects(server, url)

    def new_shards() -> list[str]:
        return [n for n in objects(server, url) if n.endswith(fmt.SHARD_SUFFIX) and n not in before]

    def written_and_open(_: list[int]) -> bool:
        return bool(new_shards() and open_uploads(server, url))

    with pack_until(big_tree, url, written_and_open, *extra) as process:
        process.kill()
        process.wait(timeout=30)
    return new_shards()[0], open_uploads(server, url)[0].rsplit("/", 1)[1]


@pytest.mark.timeout(300)
def test_what_a_killed_pack_left_is_listed_by_info_and_removed_by_the_next_pack(
    big_tree: Path, odd_tree: Path, s3_server: SeaweedServer, s3: str
) -> None:
    """SIGKILL leaves a written shard and an open upload: ``dlfs info`` names them, beside a
    dataset or where there is none, and the next pack into the prefix removes them."""
    url = f"{s3}/killed"
    for force in ((), ("--force",)):
        shard, upload = _killed_while_uploading(big_tree, s3_server, url, *force)
        if force:
            info = dlfs("info", url).stdout
            assert shard in info and f"{upload} (unfinished upload)" in info and "next dlfs pack" in info
        else:
            result = dlfs("info", url, check=False)
            assert_one_line_error(result, "not a dlfs dataset", shard, f"{upload} (unfinished upload)")
        dlfs("pack", odd_tree, url, "--shard-size", str(SMALL_SHARD), "--force")
        assert shard not in objects(s3_server, url) and open_uploads(s3_server, url) == []
        assert "leftovers:        none" in dlfs("info", url).stdout
