"""The names of a folder in an index: loaded only in Python's order of bytes with no name twice,
however long the prefix two names share, and a bad one named by its row at any size of index
(names are checked in blocks of rows)."""

from __future__ import annotations

import stat

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from index_bytes import load

from dlfs.core import format as fmt
from dlfs.core import validate
from dlfs.core.errors import DatasetError


def one_folder(names: list[bytes]) -> bytes:
    """An index of a root holding one empty file per name, in the order given."""
    count = len(names) + 1
    arrays: dict[str, np.ndarray] = {
        name: np.zeros(0 if name in fmt.BLOBS else count, dtype=dtype) for name, dtype in fmt.SECTIONS.items()
    }
    arrays["mode"][:] = stat.S_IFREG | 0o644
    arrays["mode"][0] = stat.S_IFDIR | 0o755
    arrays["offset"][1:] = fmt.HEADER_SIZE
    arrays["name_off"] = np.concatenate(([0, 0], np.cumsum([len(n) for n in names]))).astype(np.uint64)
    arrays["names"] = np.frombuffer(b"".join(names), dtype=np.uint8)
    arrays["links"] = np.zeros(0, dtype=np.uint8)
    arrays["owners"] = np.zeros(2, dtype=np.uint32)
    dataset_id = "0123456789abcdef" * 2
    meta = {"dataset_id": dataset_id, "shards": [[fmt.shard_name(dataset_id, 0), fmt.HEADER_SIZE]]}
    return fmt.encode_index(arrays, meta)


component = st.binary(min_size=1, max_size=3).filter(lambda n: b"/" not in n and b"\0" not in n)


prefixes = st.sampled_from([b"", b"p", b"p" * 15, b"p" * 16, b"p" * 17, b"p" * 31, b"p" * 32, b"q" * 40])


@settings(max_examples=300, deadline=None)
@given(
    names=st.lists(st.builds(bytes.__add__, prefixes, component), min_size=2, max_size=12),
    order=st.booleans(),
)
def test_sibling_order_is_judged_as_python_compares_bytes(names: list[bytes], order: bool) -> None:
    """Names that share 15, 16, 17, 31 or 32 bytes, or that are prefixes of each other."""
    names = sorted(n for n in names if n not in (b".", b"..")) if order else names
    assume(names and all(n not in (b".", b"..") for n in names))
    if names == sorted(set(names)):
        assert load(one_folder(names)).names_run(range(1, len(names) + 1)) == names
    else:
        with pytest.raises(DatasetError, match=r"same name|out of name order"):
            load(one_folder(names))


@pytest.mark.parametrize("at", [70_000, validate.BLOCK - 1, validate.BLOCK])
def test_refusals_name_the_first_bad_entry_of_a_large_index(at: int) -> None:
    """Names are checked in blocks of rows: a duplicate far from the first block, or in a pair
    across two blocks, is still found and named by its row."""
    names = [f"f{k:07d}".encode() for k in range(100_000)]
    names[at + 1] = names[at]
    with pytest.raises(DatasetError, match=f"entry {at + 2} has the same name"):
        load(one_folder(names))
    names[at + 1] = names[at] + b"a"
    assert load(one_folder(names)).lookup(0, names[at + 1]) == at + 2
