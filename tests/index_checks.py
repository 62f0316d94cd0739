"""What any index that loaded must give the mount, checked row by row: the property the index fuzz
tests assert of every mutated index the loader accepts, and the in-place tests of what they build."""

from __future__ import annotations

import numpy as np

from dlfs.core import format as fmt
from dlfs.core.index import Index


def assert_sound(index: Index) -> None:
    """What the mount shows of an index that loaded: every row reached once from the root, each
    name one path component, no name twice in a folder, every path leading back to its row, and
    every file's bytes inside its shard."""
    seen = np.zeros(index.count, dtype=bool)
    seen[fmt.ROOT_ROW] = True
    folders = [fmt.ROOT_ROW]
    while folders:
        row = folders.pop()
        names = index.names_run(index.children(row))
        assert names == sorted(set(names))
        for child, name in zip(index.children(row), names, strict=True):
            assert not seen[child] and 1 <= len(name) <= 255 and name not in (b".", b"..")
            assert b"/" not in name and b"\0" not in name
            seen[child] = True
            assert index.resolve(index.path(child)) == child
            if index.is_dir(child):
                folders.append(child)
            elif index.is_symlink(child):
                assert 1 <= len(index.readlink(child)) <= 4095
            else:
                assert index.is_file(child)
                shard = int(index.shard[child])
                assert int(index.offset[child]) + int(index.stored[child]) <= index.shard_sizes[shard]
    assert seen.all()
