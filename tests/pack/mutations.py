"""The archives the fuzz tests start from and how they mutate them: real archives written by GNU
tar, Python's ``tarfile`` and Info-ZIP (plain, compressed, sparse), and one to three bit flips,
cuts, inserted bytes or header fields set to values such as 2^33 or base-256 sizes.

``make test`` runs ``DEFAULT_EXAMPLES`` examples per test; ``DLFS_FUZZ_EXAMPLES=100000`` runs more.
"""

from __future__ import annotations

import io
import os
import random
import subprocess
import tarfile
from collections import Counter
from pathlib import Path

from fuzzing import fuzz_examples, fuzz_settings
from hypothesis import strategies as st

DEFAULT_EXAMPLES = 300
EXAMPLES = fuzz_examples(DEFAULT_EXAMPLES)
SECONDS_PER_EXAMPLE = 5.0
INTERESTING = [0, 1, 7, 8, 511, 512, 513, 2**31, 2**32, 2**33, 2**60, 2**63 - 1]

FUZZ = fuzz_settings(EXAMPLES)
#: The archives the examples start from (``archives``).
SEEDS = [
    "gnu.tar",
    "pax.tar.gz",
    "tarfile.tar",
    "info.zip",
    "stored.zip",
    "incremental-sparse.tar",
    "pax-sparse.tar",
]
#: Outcomes of the examples of the running test (the ``report`` fixture prints them).
OUTCOMES: Counter[str] = Counter()


def make_tree(root: Path) -> Path:
    """Folders, long and odd names, a symlink and a hard link, files small and larger."""
    rng = random.Random(36)
    for folder in ("cats", "dogs/puppies", "x" * 120 + "/" + "y" * 120):
        (root / folder).mkdir(parents=True)
        for k in range(3):
            (root / folder / f"img-{k}.jpg").write_bytes(rng.randbytes(rng.randint(0, 2000)))
    (root / "readme.txt").write_bytes(b"an archive for fuzzing\n" * 30)
    os.link(root / "readme.txt", root / "cats" / "readme-again.txt")
    (root / "latest").symlink_to("dogs/puppies")
    os.mkfifo(root / "fifo")
    return root


class Seeds(dict[str, bytes]):
    """The archives the examples mutate; named, not dumped, in a failing example's report."""

    def __repr__(self) -> str:
        return f"Seeds({', '.join(self)})"


def seed_archives(work: Path) -> Seeds:
    """The archives of ``SEEDS``, written under ``work`` from ``make_tree`` by the tools users have."""
    src = make_tree(work / "src")
    out = Seeds()
    for name, flags in {"gnu.tar": ["--format=gnu"], "pax.tar.gz": ["--format=pax", "-z"]}.items():
        subprocess.run(["tar", *flags, "-cf", work / name, "-C", src, "."], check=True, timeout=60)
        out[name] = (work / name).read_bytes()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(src / "cats", arcname="cats")
        tar.add(src / "readme.txt", arcname="/abs/readme.txt")
    out["tarfile.tar"] = buffer.getvalue()
    (src / "fifo").unlink()
    subprocess.run(["zip", "-q", "-r", "-y", work / "info.zip", "."], cwd=src, check=True, timeout=60)
    out["info.zip"] = (work / "info.zip").read_bytes()
    subprocess.run(["zip", "-q", "-r", "-y", "-0", work / "stored.zip", "."], cwd=src, check=True, timeout=60)
    out["stored.zip"] = (work / "stored.zip").read_bytes()
    with open(src / "cats" / "sparse.bin", "wb") as f:  # runs of data between holes
        for at in (5000, 70_000, 200_000):
            f.seek(at)
            f.write(rng_bytes(at))
    for name, flags in {
        "incremental-sparse.tar": ["--format=gnu", "-S", "-g", str(work / "snapshot")],
        "pax-sparse.tar": ["--format=pax", "--sparse", "--sparse-version=1.0"],
    }.items():
        subprocess.run(["tar", *flags, "-cf", work / name, "-C", src, "."], check=True, timeout=60)
        out[name] = (work / name).read_bytes()
    return out


def rng_bytes(seed: int) -> bytes:
    return random.Random(seed).randbytes(3000)


def mutate(raw: bytes, data: st.DataObject) -> bytes:
    """One to three mutations of ``raw``."""
    out = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 3))):
        if not out:
            break
        at = data.draw(st.integers(0, max(len(out) - 1, 0)))
        kind = data.draw(st.sampled_from(["flip", "cut", "insert", "octal", "base256", "byte"]))
        if kind == "flip":
            out[at] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "cut":
            del out[at:]
        elif kind == "insert":
            out[at:at] = data.draw(st.binary(min_size=1, max_size=600))
        elif kind == "byte":
            out[at] = data.draw(st.sampled_from([0, 0x2F, 0x2E, 0x30, 0x35, 0x78, 0x4C, 0xFF]))
        else:  # a tar size or mtime field, or a zip size (at the block's field or anywhere)
            block = at - at % 512 + data.draw(st.sampled_from([100, 108, 116, 124, 136]))
            value = data.draw(st.sampled_from(INTERESTING))
            field = (
                f"{value % 8**11:011o}\0".encode()
                if kind == "octal"
                else b"\x80" + (value % 2**64).to_bytes(11, "big")
            )
            where = block if block + 12 <= len(out) else at
            out[where : where + 12] = field
    return bytes(out)
