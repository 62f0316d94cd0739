"""Modes and ownership through a mount, as another user sees them: exactly what the source allows
(the kernel checks them: ``default_permissions``), and nothing at all without ``--allow-other``."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from mounts import mounted
from users import as_user

from dlfs.pack import PackOptions, pack

#: Run as the ordinary user: for each path, what reading it (a file) or listing it (a folder)
#: gives, "ok" or the errno's name.
PROBE = """
import errno, json, os, sys
out = {}
for path in sys.argv[1:]:
    try:
        if path.endswith("/"):
            os.listdir(path)
        else:
            with open(path, "rb") as f:
                f.read()
        out[path] = "ok"
    except OSError as exc:
        out[path] = errno.errorcode[exc.errno]
print(json.dumps(out))
"""

#: Entry -> (mode, owned by the ordinary user); folders end with "/".
TREE = {
    "public.txt": (0o644, False),
    "secret.txt": (0o600, False),
    "group-only.txt": (0o640, False),
    "mine.txt": (0o600, True),
    "closed/": (0o700, False),
    "closed/inside.txt": (0o644, False),
    "listable-only/": (0o644, False),
    "listable-only/file.txt": (0o644, False),
    "open/": (0o755, False),
    "open/file.txt": (0o644, False),
}


@pytest.fixture
def shared_dir(ordinary_user: str) -> Iterator[Path]:
    """A folder on disk every user can traverse (pytest's own are root's alone), with ``src``: the
    tree above, modes set after the files are written."""
    root = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="dlfs-perm-"))
    root.chmod(0o755)
    src = root / "src"
    src.mkdir(mode=0o755)
    for name in TREE:
        if name.endswith("/"):
            (src / name).mkdir()
        else:
            (src / name).write_bytes(name.encode())
    for name, (mode, mine) in sorted(TREE.items(), key=lambda item: -item[0].count("/")):
        if mine:
            shutil.chown(src / name, ordinary_user)
        (src / name).chmod(mode)
    try:
        yield root
    finally:
        for name in TREE:
            if name.endswith("/"):
                (src / name).chmod(0o755)
        shutil.rmtree(root)


def _probe(root: Path) -> dict[str, str]:
    paths = [str(root / name) + ("/" if name.endswith("/") else "") for name in TREE]
    seen = json.loads(as_user("python3", "-c", PROBE, *paths).stdout)
    return {name: seen[str(root / name) + ("/" if name.endswith("/") else "")] for name in TREE}


def test_another_user_is_allowed_and_refused_exactly_as_on_the_source(shared_dir: Path) -> None:
    src, dataset, mnt = shared_dir / "src", shared_dir / "dataset", shared_dir / "mnt"
    pack(src, dataset, PackOptions(progress=False))
    mnt.mkdir(mode=0o755)
    native = _probe(src)
    assert native["public.txt"] == "ok" and native["mine.txt"] == "ok"
    assert native["secret.txt"] == native["closed/"] == native["closed/inside.txt"] == "EACCES"
    assert native["listable-only/"] == "ok" and native["listable-only/file.txt"] == "EACCES"
    with mounted(dataset, mnt, "--allow-other"):
        assert _probe(mnt) == native
        for name in ("mine.txt", "secret.txt", "closed/"):
            assert os.stat(mnt / name).st_uid == os.stat(src / name).st_uid, name
            assert os.stat(mnt / name).st_mode == os.stat(src / name).st_mode, name
        refused = as_user("sh", "-c", f"echo x >> {mnt / 'mine.txt'}", check=False)
        assert refused.returncode != 0 and "Read-only file system" in refused.stderr


def test_without_allow_other_another_user_sees_nothing(shared_dir: Path) -> None:
    src, dataset, mnt = shared_dir / "src", shared_dir / "dataset", shared_dir / "mnt"
    pack(src, dataset, PackOptions(progress=False))
    mnt.mkdir(mode=0o755)
    with mounted(dataset, mnt):
        assert set(_probe(mnt).values()) == {"EACCES"}
        listing = as_user("ls", mnt, check=False)
        assert listing.returncode != 0 and "Permission denied" in listing.stderr
