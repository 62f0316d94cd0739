"""Random trees, each written by GNU tar, packed (or indexed in place), mounted, and compared with
what ``tar x`` extracts: names of every kind, folders, files of odd sizes and modes, symlinks of
every kind, hard links. ``DLFS_FUZZ_EXAMPLES`` sets how many trees (``make test`` runs a few)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from archives import pack_and_compare, write_tar
from fuzzing import fuzz_examples, fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

#: Name characters: letters, a space, dots, unicode, and bytes that are not UTF-8 (GNU and pax
#: tars both carry them).
NAME = (
    st.lists(
        st.sampled_from(["a", "b", "Z", " ", ".", "-", "é", "名", "\udcff", "x" * 60]), min_size=1, max_size=4
    )
    .map("".join)
    .filter(lambda name: name not in (".", ".."))
)
MTIME = st.integers(min_value=0, max_value=4_000_000_000)


@st.composite
def trees(draw: st.DrawFn) -> list[tuple[str, str, object, int, int]]:
    """Entries in the order they are made: (kind, path, what, mode, mtime); folders before what
    they hold, a hard link after its file."""
    entries: list[tuple[str, str, object, int, int]] = []
    folders, files = [""], []
    for _ in range(draw(st.integers(min_value=1, max_value=10))):
        parent = draw(st.sampled_from(folders))
        path = f"{parent}/{draw(NAME)}".lstrip("/")
        if any(path == entry[1] for entry in entries):
            continue
        kind = draw(
            st.sampled_from(
                ["file", "file", "folder", "symlink", "hardlink"] if files else ["file", "folder"]
            )
        )
        mtime = draw(MTIME)
        if kind == "file":
            size = draw(st.sampled_from([0, 1, 511, 512, 513, 3000]))
            entries.append(
                (kind, path, os.urandom(size), draw(st.sampled_from([0o644, 0o600, 0o755, 0o444])), mtime)
            )
            files.append(path)
        elif kind == "folder":
            entries.append((kind, path, None, draw(st.sampled_from([0o755, 0o700, 0o750])), mtime))
            folders.append(path)
        elif kind == "symlink":
            target = draw(st.sampled_from(["/etc/hostname", "../../out", "dangling", *files]))
            entries.append((kind, path, target, 0o777, mtime))
        else:
            entries.append((kind, path, draw(st.sampled_from(files)), 0, 0))
    return entries


def make(root: Path, entries: list[tuple[str, str, object, int, int]]) -> None:
    """Make the tree, then set folders' modes and times deepest first (making entries in a folder
    changes its mtime, and a folder without write permission takes no entries)."""
    for kind, path, what, mode, mtime in entries:
        target = os.fsencode(root) + b"/" + os.fsencode(path)
        if kind == "file":
            with open(target, "wb") as f:
                f.write(what)  # type: ignore[arg-type]
            os.chmod(target, mode)
            os.utime(target, (mtime, mtime))
        elif kind == "folder":
            os.mkdir(target)
        elif kind == "symlink":
            os.symlink(str(what), target)
            os.utime(target, (mtime, mtime), follow_symlinks=False)
        else:
            os.link(os.fsencode(root) + b"/" + os.fsencode(str(what)), target)
    for kind, path, _, mode, mtime in sorted(entries, key=lambda entry: -entry[1].count("/")):
        if kind == "folder":
            target = os.fsencode(root) + b"/" + os.fsencode(path)
            os.chmod(target, mode)
            os.utime(target, (mtime, mtime))


@fuzz_settings(fuzz_examples(8))
@given(entries=trees(), form=st.sampled_from(["gnu", "pax", "oldgnu"]), in_place=st.booleans())
def test_a_random_tree_written_by_tar_mounts_as_tar_x_extracts_it(
    entries: list[tuple[str, str, object, int, int]], form: str, in_place: bool
) -> None:
    work = Path(tempfile.mkdtemp(prefix="dlfs-property-"))
    try:
        (work / "src").mkdir()
        make(work / "src", entries)
        archive = write_tar(form, work / "src", work / "tree.tar")
        pack_and_compare(work, archive, *(["--in-place"] if in_place else []))
    finally:
        shutil.rmtree(work)
