"""The index answers from numpy columns exactly what the source tree says (property-tested)."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlfs.core import format as fmt
from dlfs.core.index import Index
from dlfs.core.store.local import LocalStore
from dlfs.pack import PackOptions, pack

names = st.binary(min_size=1, max_size=12).filter(
    lambda n: b"/" not in n and b"\0" not in n and n not in (b".", b"..")
)
trees = st.recursive(
    st.binary(max_size=300),
    lambda children: st.dictionaries(names, children, max_size=6),
    max_leaves=25,
)


def _materialise(root: bytes, tree: dict[bytes, object]) -> None:
    os.mkdir(root)
    for name, child in tree.items():
        path = root + b"/" + name
        if isinstance(child, dict):
            _materialise(path, child)
        else:
            with open(path, "wb") as f:
                f.write(child)  # type: ignore[arg-type]


def _pack_tree(tree: dict[bytes, object], work: Path, **options: object) -> Index:
    work.mkdir(parents=True, exist_ok=True)
    src = os.fsencode(work / "src")
    _materialise(src, tree)
    pack(os.fsdecode(src), work / "dst", PackOptions(progress=False, shard_size=4096, **options))  # type: ignore[arg-type]
    return Index.load(LocalStore(work / "dst"))


def _walk(tree: dict[bytes, object], prefix: bytes = b"") -> list[tuple[bytes, object]]:
    out = []
    for name, child in tree.items():
        path = prefix + name
        out.append((path, child))
        if isinstance(child, dict):
            out.extend(_walk(child, path + b"/"))
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=st.dictionaries(names, trees, max_size=6), placement=st.sampled_from(["tree", "random"]))
def test_index_resolves_every_path_and_lists_every_directory(
    tree: dict[bytes, object], placement: str
) -> None:
    with tempfile.TemporaryDirectory() as work:
        index = _pack_tree(tree, Path(work), placement=placement, seed=5)
        assert np.all(np.diff(index.parent.astype(np.int64)[1:]) >= 0), "parent column must never decrease"
        entries = _walk(tree)
        assert index.count == len(entries) + 1
        for path, content in entries:
            row = index.resolve(path)
            assert row is not None and index.path(row) == path
            if isinstance(content, dict):
                assert index.is_dir(row)
                listed = [index.name(r) for r in index.children(row)]
                assert listed == sorted(content)
                subdirs = sum(isinstance(c, dict) for c in content.values())
                assert index.attrs(row).nlink == 2 + subdirs
            else:
                assert index.is_file(row) and index.attrs(row).size == len(content)
                assert int(index.checksum[row]) == fmt.checksum(content)
            assert index.lookup(row if isinstance(content, dict) else 0, b"\x00missing") is None
        assert [index.name(r) for r in index.children(fmt.ROOT_ROW)] == sorted(tree)
        every = range(index.count)
        assert [index.attrs(row) for row in every] == index.attrs_run(every), "scalar and run agree"
        rows = np.random.default_rng(index.count).permutation(np.arange(1, index.count))
        lines = b"".join(path + b"\n" for path in index.paths(rows))
        assert index.path_lines(rows, chunk=3) == lines, "paths built one by one and gathered agree"


def test_children_of_a_file_is_empty_and_root_is_not_its_own_child(tmp_path: Path) -> None:
    index = _pack_tree({b"a": b"x", b"d": {b"e": b"y"}}, tmp_path)
    assert fmt.ROOT_ROW not in index.children(fmt.ROOT_ROW)
    assert len(index.children(index.resolve(b"a"))) == 0
    assert index.resolve(b"a/b") is None
    assert stat.S_ISDIR(index.attrs(fmt.ROOT_ROW).mode)


def test_random_order_is_seeded_and_differs_from_source_order(tmp_path: Path) -> None:
    tree = {f"f{k:03d}".encode(): bytes([k]) * 10 for k in range(200)}

    def offsets(work: Path, **options: object) -> list[int]:
        index = _pack_tree(tree, work, **options)
        rows = [index.resolve(name) for name in sorted(tree)]
        return [int(index.shard[row]) * 10**9 + int(index.offset[row]) for row in rows]

    source = offsets(tmp_path / "a")
    assert source == sorted(source), "source order lays files out in tree order"
    first = offsets(tmp_path / "b", placement="random", seed=11)
    assert first == offsets(tmp_path / "c", placement="random", seed=11)
    assert first != source and first != offsets(tmp_path / "d", placement="random", seed=12)


def test_encoded_index_round_trips_every_column() -> None:
    rng = np.random.default_rng(0)
    arrays = {name: rng.integers(0, 200, size=17).astype(dtype) for name, dtype in fmt.SECTIONS.items()}
    arrays["name_off"] = rng.integers(0, 200, size=18).astype(fmt.SECTIONS["name_off"])
    raw = fmt.encode_index(arrays, {"dataset_id": "ab" * 16, "shards": []})
    decoded = fmt.decode_index(memoryview(raw), "test")
    for name in fmt.SECTIONS:
        assert np.array_equal(decoded.arrays[name], arrays[name])
    assert decoded.meta["dataset_id"] == "ab" * 16


def test_a_value_too_wide_for_its_column_is_refused_not_cut_short() -> None:
    arrays = {name: np.zeros(3, dtype=dtype) for name, dtype in fmt.SECTIONS.items()}
    arrays["name_off"] = np.zeros(4, dtype=np.uint64)
    arrays["offset"] = np.array([0, 1 << 32, 0], dtype=np.uint64)
    with pytest.raises(ValueError, match="offset: values out of range"):
        fmt.encode_index(arrays, {"dataset_id": "ab" * 16, "shards": []})


def test_the_summary_counts_what_pack_wrote(odd_tree: Path, tmp_path: Path) -> None:
    packed = pack(odd_tree, tmp_path / "ds", PackOptions(progress=False, shard_size=1 << 16, compress=True))
    summary = Index.load(LocalStore(tmp_path / "ds")).summary()
    assert summary == {key: getattr(packed, key) for key in summary}
    assert summary["shards"] > 1 and summary["compressed_files"] > 0


def test_a_recursive_listing_gives_each_folder_its_entries_then_its_subfolders(tmp_path: Path) -> None:
    index = _pack_tree({b"b": {b"y": b"1", b"x": {b"z": b"2"}}, b"a": b"3", b"c": {}}, tmp_path)
    assert [shown for _, shown in index.listing(fmt.ROOT_ROW)] == [b"a", b"b", b"c"]
    assert [shown for _, shown in index.listing(fmt.ROOT_ROW, recursive=True)] == [
        b"a", b"b", b"c", b"b/x", b"b/y", b"b/x/z"
    ]  # fmt: skip
    row = index.resolve(b"b/x/z")
    assert list(index.listing(row, recursive=True)) == [(row, b"b/x/z")]
    assert [shown for _, shown in index.listing(index.resolve(b"b"))] == [b"x", b"y"]
