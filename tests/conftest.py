"""The fixtures every layer's tests share: an odd source tree, packing, real mounts that always
unmount, the session's S3 server, an ordinary user. Helpers live in modules named for what they
are about (``commands``, ``mounts``, ``trees``, ``waits``, ...); fixtures only one layer uses live in
that layer's conftest.py."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

# A failed comparison inside a helper module (this folder's, or a layer folder's) shows its difference:
# registered before any of them is imported, here or by a test.
pytest.register_assert_rewrite(
    "archives",
    "commands",
    "crafted_index",
    "damage",
    "footprint",
    "fuzzing",
    "index_bytes",
    "index_checks",
    "mounts",
    "mutations",
    "page_cache",
    "readahead_checks",
    "readers",
    "s3env",
    "scrapes",
    "system_files",
    "trees",
    "users",
    "waits",
)

from commands import dlfs  # noqa: E402
from mounts import mounted  # noqa: E402
from page_cache import tmpfs  # noqa: E402
from s3env import make_tls, use_s3  # noqa: E402
from seaweed import SeaweedServer  # noqa: E402
from trees import make_odd_tree, pack_odd_tree  # noqa: E402
from users import ORDINARY_USER  # noqa: E402

# No test, and no process a test starts, may ask the cloud's instance metadata service for
# credentials: botocore's chain does when none are configured, and that request leaves the machine.
# `make test` also runs the suite where no route leaves it (tools/loopback-only).
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"

#: What the ``mount`` and ``pack_and_mount`` factories return: ``with factory(...) as mnt:``.
MountFactory = Callable[..., AbstractContextManager[Path]]


@pytest.fixture
def on_disk() -> Iterator[Path]:
    """A directory on a disk (``/var/tmp``): a tmpfs file's pages cannot leave memory."""
    path = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="dlfs-test-"))
    try:
        yield path
    finally:
        shutil.rmtree(path)


@pytest.fixture
def in_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A filesystem that refuses reads that must not wait (``RWF_NOWAIT`` gives EOPNOTSUPP), as
    ``/dev/shm`` is, and ``/tmp`` where it is a tmpfs."""
    with tmpfs(tmp_path / "tmpfs", "512m") as path:
        yield path


@pytest.fixture
def odd_tree(tmp_path: Path) -> Path:
    """``trees.make_odd_tree`` under this test's tmp_path."""
    return make_odd_tree(tmp_path / "src")


@pytest.fixture
def packed(odd_tree: Path, tmp_path: Path) -> Path:
    """The odd tree packed in this process (the CLI's own pack is tested in tests/pack)."""
    return pack_odd_tree(odd_tree, tmp_path / "dataset")


@pytest.fixture
def mount(tmp_path: Path) -> MountFactory:
    """Factory: ``with mount(dataset, *flags) as mnt:`` at a fresh mountpoint under tmp_path
    (``mounts.mounted``: always unmounted, the daemon reaped, its log checked)."""
    counter = iter(range(1000))

    def factory(
        dataset: Path | str, *extra: str, log_file: Path | None = None, launcher: Sequence[str] = ()
    ) -> AbstractContextManager[Path]:
        return mounted(
            dataset, tmp_path / f"mnt{next(counter)}", *extra, log_file=log_file, launcher=launcher
        )

    return factory


@pytest.fixture
def pack_and_mount(tmp_path: Path, mount: MountFactory) -> MountFactory:
    """Factory: ``with pack_and_mount(src, *mount_flags, pack=(...)) as mnt:`` packs the tree
    ``src`` with the real CLI (``dlfs pack src DATASET *pack``) and mounts it (``mount``): the
    set-up of every test whose subject is the mount of a tree of its own. The dataset is
    ``dataset`` if given, else a fresh folder under tmp_path; tests of what pack itself says or
    leaves run it themselves."""
    counter = iter(range(1000))

    def factory(
        src: Path,
        *mount_flags: str,
        pack: Sequence[str] = (),
        dataset: Path | None = None,
        launcher: Sequence[str] = (),
    ) -> AbstractContextManager[Path]:
        dataset = dataset or tmp_path / f"dataset{next(counter)}"
        dlfs("pack", src, dataset, *pack)
        return mount(dataset, *mount_flags, launcher=launcher)

    return factory


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    """One real S3 server (SeaweedFS) for the session; tests keep apart by bucket. It serves HTTPS
    too, with a certificate signed by a private CA (``server.tls.ca``)."""
    root = tmp_path_factory.mktemp("seaweed")
    with SeaweedServer(root, tls=make_tls(tmp_path_factory.mktemp("tls"))) as server:
        yield server


@pytest.fixture
def s3(s3_server: SeaweedServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """A fresh prefix on the session's S3 server, with the environment pointing at it."""
    return use_s3(s3_server, monkeypatch, tmp_path)


@pytest.fixture(scope="session")
def ordinary_user() -> Iterator[str]:
    """An ordinary user with /dev/fuse access (Debian gives every user that: mode 0666)."""
    if subprocess.run(["id", ORDINARY_USER], capture_output=True, check=False).returncode != 0:
        add = ["useradd", "--create-home", ORDINARY_USER]
        subprocess.run(add, capture_output=True, check=True, timeout=60)
    mode = stat.S_IMODE(os.stat("/dev/fuse").st_mode)
    os.chmod("/dev/fuse", mode | 0o006)
    try:
        yield ORDINARY_USER
    finally:
        os.chmod("/dev/fuse", mode)
