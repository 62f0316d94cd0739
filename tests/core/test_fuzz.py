"""Fuzzing the index loader and the shard reads (``FileBytes``): damaged or crafted bytes give a clean error.

The index loader, fed random bytes and mutations of a real index (bit flips, cuts, 64-bit fields set
to values such as 2^60, column values, metadata fields, each resealed with a valid trailer or not),
must either refuse with a ``DatasetError`` or load an index that is a sound tree; never another
exception, a hang or a large allocation. ``FileBytes``, on mutated shards, must return each file's
exact bytes or raise ``IntegrityError`` (a missing shard: ``DatasetError``); never wrong bytes.

``make test`` runs ``DEFAULT_EXAMPLES`` examples per test; ``DLFS_FUZZ_EXAMPLES=100000`` runs more.
Each test prints how many ran.
"""

from __future__ import annotations

import json
import os
import random
import stat
import struct
import subprocess
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from fuzzing import fuzz_examples, fuzz_settings
from hypothesis import given
from hypothesis import strategies as st
from index_bytes import load, reseal, with_meta
from index_checks import assert_sound

from dlfs.core import archive_meta
from dlfs.core import format as fmt
from dlfs.core.errors import DatasetError, IntegrityError
from dlfs.core.file_bytes import FileBytes
from dlfs.core.index import Index
from dlfs.core.ram_cache import RamCache
from dlfs.core.store.local import LocalStore
from dlfs.pack import PackOptions, pack

DEFAULT_EXAMPLES = 1000
EXAMPLES = fuzz_examples(DEFAULT_EXAMPLES)
#: An example slower than this counts as a hang.
SECONDS_PER_EXAMPLE = 5.0
#: Most a load may allocate beyond a few times the index's own size (the valid one takes ~0.1 MiB).
ALLOCATION_SLACK = 16 << 20
INTERESTING = [0, 1, 2, 7, 8, 46, 47, 63, 64, 255, 256, 2**31, 2**32 - 1, 2**32, 2**60, 2**63, 2**64 - 1]

FUZZ = fuzz_settings(EXAMPLES)


def make_tree(root: Path) -> Path:
    """Folders, a symlink, a hard link, files raw and compressible (stored lz4) across several
    shards, and a file with holes (sparse where a tar of it is: ``in_place_dataset``)."""
    rng = random.Random(25)
    for folder in ("cats", "dogs", "dogs/puppies"):
        (root / folder).mkdir(parents=True)
        for k in range(6):
            data = (
                rng.randbytes(rng.randint(0, 3000))
                if k % 2
                else f"{folder} {k}\n".encode() * rng.randint(1, 90)
            )
            (root / folder / f"img-{k:03d}.jpg").write_bytes(data)
    (root / "readme.txt").write_bytes(b"a dataset for fuzzing\n" * 20)
    os.link(root / "readme.txt", root / "cats" / "readme-again.txt")
    (root / "latest").symlink_to("dogs/puppies")
    with open(root / "dogs" / "holes.bin", "wb") as f:
        for at in (5000, 40_000):
            f.seek(at)
            f.write(rng.randbytes(700))
    return root


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("fuzz")
    dst = work / "dst"
    pack(make_tree(work / "src"), dst, PackOptions(progress=False, shard_size=4096, compress=True))
    return dst


@pytest.fixture(scope="module")
def in_place_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same tree as a tar, indexed in place (``dlfs pack --in-place``): an index whose metadata
    names the files the daemon opens."""
    work = tmp_path_factory.mktemp("fuzz-in-place")
    tar = work / "src.tar"
    command = ["tar", "--format=pax", "--sparse", "-cf", tar, "-C", make_tree(work / "src"), "."]
    subprocess.run(command, check=True, timeout=60)
    pack(tar, work / "dst", PackOptions(progress=False, in_place=True))
    return work / "dst"


@pytest.fixture
def report(
    request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> Iterator[Callable[[str], None]]:
    """Count examples; at the end print how many ran and record them in the test's properties."""
    ran = {"examples": 0}

    def one(kind: str) -> None:
        ran["examples"] += 1
        ran[kind] = ran.get(kind, 0) + 1

    yield one
    request.node.user_properties.append(("fuzz_examples", ran["examples"]))
    kinds = ", ".join(f"{kind} {count}" for kind, count in sorted(ran.items()) if kind != "examples")
    with capsys.disabled():
        print(f"\n{request.node.name}: {ran['examples']} examples ran ({kinds})")
    assert ran["examples"] >= min(EXAMPLES, 50)


def try_load(raw: bytes) -> Index | None:
    """The index the bytes hold, or None after a DatasetError; anything else fails the test."""
    tracemalloc.start()
    started = time.monotonic()
    try:
        return load(raw)
    except DatasetError as exc:
        assert "\n" not in str(exc)
        return None
    finally:
        elapsed = time.monotonic() - started
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert elapsed < SECONDS_PER_EXAMPLE, f"loading took {elapsed:.1f} s"
        assert peak < 4 * len(raw) + ALLOCATION_SLACK, f"loading allocated {peak} bytes"


def assert_shards_inside(index: Index) -> None:
    """An in-place index that loaded names only absolute, normalised archive paths, and each of
    its shards lies inside its archive."""
    bases = zip(index.shard_archive, index.shard_base, strict=True) if index.archives else []
    for number, (archive, base) in enumerate(bases):
        owner = index.archives[int(archive)]
        assert archive_meta.is_archive_path(owner["path"])
        assert 0 <= int(base) <= int(base) + index.shard_sizes[number] <= owner["size"]


def flipped(raw: bytes, flips: list[tuple[int, int]]) -> bytes:
    out = bytearray(raw)
    for at, bit in flips:
        out[at % len(out)] ^= 1 << bit
    return bytes(out)


def with_u64(raw: bytes, at: int, value: int) -> bytes:
    out = bytearray(raw)
    struct.pack_into("<Q", out, at, value)
    return bytes(out)


def sections(raw: bytes) -> list[tuple[int, int, int]]:
    """(offset, count, item size) of each column of a valid index."""
    meta = fmt.decode_index(memoryview(raw), "valid").meta
    return [
        (offset, count, np.dtype(fmt.SECTIONS[name]).itemsize)
        for name, (offset, count) in meta["sections"].items()
        if count
    ]


def with_column_value(raw: bytes, place: tuple[int, int, int], row: int, value: int) -> bytes:
    offset, count, size = place
    out = bytearray(raw)
    out[offset + (row % count) * size : offset + (row % count + 1) * size] = (
        value % (1 << 8 * size)
    ).to_bytes(size, "little")
    return bytes(out)


JSON_VALUES = st.one_of(
    st.sampled_from(INTERESTING),
    st.integers(-(2**70), 2**70),
    st.text(max_size=12),
    st.none(),
    st.booleans(),
    st.lists(st.integers(-5, 2**62), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


def json_paths(value: object, path: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    """The path to every value inside a JSON document (keys and list positions)."""
    inner = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    return [path] + [p for key, item in inner for p in json_paths(item, (*path, key))]


def with_meta_value(raw: bytes, path: tuple[str | int, ...], value: object) -> bytes:
    """The index with the metadata value at ``path`` replaced by ``value`` (removed: ``REMOVE``)."""
    meta_offset = fmt.INDEX_HEADER.unpack_from(raw)[3]
    meta = json.loads(raw[meta_offset : -fmt.TRAILER.size])
    if not path:
        return with_meta(raw, b"" if value is REMOVE else json.dumps(value).encode())
    holder = meta
    for key in path[:-1]:
        holder = holder[key]
    if value is REMOVE:
        del holder[path[-1]]
    else:
        holder[path[-1]] = value
    return with_meta(raw, json.dumps(meta).encode())


REMOVE = object()


def mutations(valid: bytes) -> st.SearchStrategy[tuple[str, bytes]]:
    size = len(valid)
    places = sections(valid)
    meta = fmt.decode_index(memoryview(valid), "valid").meta
    kinds = {
        "flips": st.lists(st.tuples(st.integers(0, size - 1), st.integers(0, 7)), min_size=1, max_size=6).map(
            lambda flips: flipped(valid, flips)
        ),
        "cut": st.integers(0, size - 1).map(lambda at: valid[:at]),
        "u64": st.tuples(st.integers(0, size // 8 - 1), st.sampled_from(INTERESTING)).map(
            lambda f: with_u64(valid, 8 * f[0], f[1])
        ),
        "column": st.tuples(
            st.sampled_from(places),
            st.integers(0, 1 << 20),
            st.sampled_from(INTERESTING) | st.integers(0, 2**64 - 1),
        ).map(lambda c: with_column_value(valid, *c)),
        "meta": st.tuples(st.sampled_from(json_paths(meta)), JSON_VALUES | st.just(REMOVE)).map(
            lambda m: with_meta_value(valid, *m)
        ),
    }
    return st.one_of(*(strategy.map(lambda raw, kind=kind: (kind, raw)) for kind, strategy in kinds.items()))


def maybe_resealed(raw: bytes, seal: bool) -> bytes:
    return reseal(raw) if seal and len(raw) >= fmt.HEADER_SIZE + fmt.TRAILER.size else raw


def test_random_bytes_are_a_dataset_error(report: Callable[[str], None]) -> None:
    header = fmt.INDEX_MAGIC + struct.pack("<II", fmt.FORMAT_VERSION, 0)

    @FUZZ
    @given(body=st.binary(max_size=2048), with_magic=st.booleans(), seal=st.booleans())
    def run(body: bytes, with_magic: bool, seal: bool) -> None:
        raw = maybe_resealed(header + body if with_magic else body, seal)
        report("magic" if with_magic else "random")
        assert try_load(raw) is None or with_magic

    run()


@pytest.mark.parametrize("packed", ["dataset", "in_place_dataset"])
def test_mutated_indexes_load_soundly_or_are_a_dataset_error(
    packed: str, request: pytest.FixtureRequest, report: Callable[[str], None]
) -> None:
    valid = (request.getfixturevalue(packed) / fmt.INDEX_NAME).read_bytes()
    assert_sound(load(valid))
    assert_shards_inside(load(valid))

    @FUZZ
    @given(mutation=mutations(valid), seal=st.booleans())
    def run(mutation: tuple[str, bytes], seal: bool) -> None:
        kind, raw = mutation
        index = try_load(maybe_resealed(raw, seal))
        report(f"{kind}{' resealed' if seal else ''}{' loaded' if index is not None else ''}")
        if index is not None:
            assert_sound(index)

    run()


def test_mutated_shards_give_right_bytes_or_an_integrity_error(
    dataset: Path, tmp_path: Path, report: Callable[[str], None]
) -> None:
    source = dataset.parent / "src"
    index = Index.load(LocalStore(dataset))
    rows = index.regular_rows()
    expected = {row: (source / index.path(row).decode()).read_bytes() for row in rows.tolist()}
    shards = {name: (dataset / name).read_bytes() for name in index.shard_names}
    assert np.count_nonzero(index.flags[rows] & fmt.FLAG_LZ4) and not np.all(index.flags[rows] & fmt.FLAG_LZ4)

    def damage(kind: str, raw: bytes, at: int, length: int, flips: list[tuple[int, int]]) -> bytes | None:
        at %= len(raw)
        if kind == "flips":
            return flipped(raw, flips)
        if kind == "zeros":
            return raw[:at] + bytes(min(length, len(raw) - at)) + raw[at + length :]
        if kind == "cut":
            return raw[:at]
        return None  # deleted

    @FUZZ
    @given(
        shard=st.sampled_from(index.shard_names),
        kind=st.sampled_from(["flips", "zeros", "cut", "deleted"]),
        at=st.integers(0, 1 << 16),
        length=st.integers(1, 4096),
        flips=st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 7)), min_size=1, max_size=4),
    )
    def run(shard: str, kind: str, at: int, length: int, flips: list[tuple[int, int]]) -> None:
        for name, raw in shards.items():
            (dataset / name).write_bytes(raw)
        damaged = damage(kind, shards[shard], at, length, flips)
        if damaged is None:
            (dataset / shard).unlink()
        else:
            (dataset / shard).write_bytes(damaged)
        store = LocalStore(dataset)
        file_bytes = FileBytes(index, store, RamCache(1 << 20))
        failed = 0
        try:
            for row in rows.tolist():
                try:
                    data = file_bytes.load(row)
                except (IntegrityError, DatasetError):  # ShardError is a DatasetError
                    failed += 1
                    continue
                assert bytes(data) == expected[row], index.path(row)
        finally:
            store.close()
        report(f"{kind}{' with failures' if failed else ''}")

    try:
        run()
    finally:
        for name, raw in shards.items():
            (dataset / name).write_bytes(raw)


def test_the_fuzzed_dataset_has_every_kind_of_entry(dataset: Path) -> None:
    """What the fuzzing needs to reach: folders, a symlink, several shards (lz4 and raw files are
    asserted where the shards are fuzzed)."""
    index = Index.load(LocalStore(dataset))
    kinds = index.mode & fmt.TYPE_MASK
    assert {stat.S_IFDIR, stat.S_IFREG, stat.S_IFLNK} == set(np.unique(kinds).tolist())
    assert len(index.shard_names) > 3
    assert len(index.hard_links) == 2, "the hard-link table"


def test_the_fuzzed_in_place_dataset_has_a_sparse_file_and_a_hard_link(in_place_dataset: Path) -> None:
    index = Index.load(LocalStore(in_place_dataset))
    assert len(index.sparse) == 1 and len(index.hard_links) == 2
