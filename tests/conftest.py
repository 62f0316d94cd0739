"""Shared fixtures: an odd source tree, packing, and real mounts that always unmount."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from seaweed import SeaweedServer, Tls

from dlfs import system_install
from dlfs.core import format as fmt
from dlfs.core.index import Index
from dlfs.core.libc import cached_pages
from dlfs.core.store.local import LocalStore
from dlfs.pack import PackOptions, pack

# The tests' shared helper modules: a failed comparison inside one shows its difference.
pytest.register_assert_rewrite("archives")

# No test, and no process a test starts, may ask the cloud's instance metadata service for
# credentials: botocore's chain does when none are configured, and that request leaves the machine.
# `make test` also runs the suite where no route leaves it (tools/loopback-only).
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"

DLFS = [sys.executable, "-P", "-m", "dlfs.cli"]
#: The command a user types: the entry point pip installed beside this interpreter.
DLFS_COMMAND = Path(sys.executable).with_name("dlfs")
TOOLS = Path(__file__).resolve().parent.parent / "tools"
#: Small shards so every odd tree spans several of them and has a file larger than one shard.
SMALL_SHARD = 64 * 1024


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


def fuzz_examples(default: int) -> int:
    """Examples per fuzz test: ``DLFS_FUZZ_EXAMPLES``, else ``default`` (what ``make test`` runs)."""
    return int(os.environ.get("DLFS_FUZZ_EXAMPLES", default))


def fuzz_settings(examples: int) -> settings:
    """Hypothesis settings of the fuzz tests: no deadline (each test bounds an example's time
    itself), no example database, and large inputs allowed."""
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.function_scoped_fixture,
        ],
    )


FIXED_NS = 1_600_000_000_123_456_789
#: (uid, gid) of entries of the odd tree that root does not own: numbers that need 32 bits, and
#: one pair shared by two entries.
OWNERS = {
    "plain.txt": (1234, 5678),
    "exec.sh": (4_000_000_000, 4_000_000_001),
    "many/file-0001.dat": (1234, 5678),
    "empty-dir": (70_000, 0),
    "link-to-file": (0, 65_536),
}
TEST_BUCKET = "dlfs-tests"
#: Where code planted in a directory would import from (``plant``).
PLANTED = ("dlfs.py", "dlfs/__init__.py")
#: The ordinary user the tests run commands as (``ordinary_user``, ``as_user``).
ORDINARY_USER = "dlfs-test"


def dlfs(
    *args: str | os.PathLike[str],
    check: bool = True,
    timeout: float = 120,
    launcher: Sequence[str] = (),
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess, as a user would (started by ``launcher``, if any; with
    ``cwd``, the command a user types, run from there)."""
    command = [str(DLFS_COMMAND)] if cwd is not None else DLFS
    result = subprocess.run(
        [*launcher, *command, "-q", *map(str, args)],
        capture_output=True,
        text=True,
        errors="surrogateescape",
        timeout=timeout,
        check=False,
        cwd=cwd,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"dlfs {' '.join(map(str, args))} failed: {result.stderr}")
    return result


def tool(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run one of ``tools/`` (a path under ``TOOLS``) with this interpreter; fail on a non-zero exit."""
    return subprocess.run(
        [sys.executable, *map(str, args)], capture_output=True, text=True, timeout=timeout, check=True
    )


@pytest.fixture
def on_disk() -> Iterator[Path]:
    """A directory on a disk (``/var/tmp``): a tmpfs file's pages cannot leave memory."""
    path = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="dlfs-test-"))
    try:
        yield path
    finally:
        shutil.rmtree(path)


@contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A fresh tmpfs of ``size`` at ``path`` (made here; needs root), unmounted on the way out."""
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "dlfs-test", path], check=True, timeout=30)
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", path], check=True, timeout=30)


@pytest.fixture
def in_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A filesystem that refuses reads that must not wait (``RWF_NOWAIT`` gives EOPNOTSUPP), as
    ``/dev/shm`` is, and ``/tmp`` where it is a tmpfs."""
    with tmpfs(tmp_path / "tmpfs", "512m") as path:
        yield path


def drop_from_memory(path: Path) -> None:
    """Evict a file's pages from the page cache, as if it had never been read (no root needed).

    Asked again until ``cachestat`` sees none left: right after a heavy benchmark a single pass once
    left pages behind (two cold-storage tests then found their shards in memory).
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        for _ in range(50):
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            if cached_pages(fd, os.fstat(fd).st_size) in (0, None):
                return
            time.sleep(0.02)
        raise AssertionError(f"{path}: pages stay in the page cache after 50 evictions")
    finally:
        os.close(fd)


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    """A user error: non-zero exit, one line on stderr, no traceback, and the words that help."""
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def write(path: Path, data: bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode)


def make_odd_tree(root: Path) -> Path:
    """Every case a real dataset throws at pack: odd names, links, empties, depth, sizes, modes,
    owners (uids and gids past 16 bits, a directory and a symlink of their own)."""
    rng = __import__("random").Random(7)
    write(root / "plain.txt", b"hello dlfs\n")
    write(root / "empty.bin", b"")
    write(root / "with space.txt", b"spaces\n")
    write(root / "new\nline.txt", b"newline in name\n")
    write(root / "ünïcødé-名前.txt", b"unicode\n")
    write(root / "exec.sh", b"#!/bin/sh\necho hi\n", 0o755)
    write(root / "private", b"secret\n", 0o600)
    write(root / "readonly", b"ro\n", 0o444)
    write(root / "compressible.txt", b"the same line again\n" * 5000)
    write(root / "random.bin", rng.randbytes(100_000))
    write(root / "larger-than-a-shard.bin", rng.randbytes(5 * SMALL_SHARD + 123))
    (root / "empty-dir").mkdir()
    (root / "empty-dir-0700").mkdir(mode=0o700)
    deep = root / "deep"
    for level in range(40):
        deep = deep / f"d{level}"
    write(deep / "leaf.txt", b"deep leaf\n")
    for k in range(300):
        write(root / "many" / f"file-{k:04d}.dat", rng.randbytes(rng.randint(0, 3000)))
    for k in range(3):
        for j in range(20):
            write(
                root / "classes" / f"n0000000{k}" / f"n0000000{k}_{j}.JPEG",
                rng.randbytes(rng.randint(500, 20_000)),
            )
    raw = os.fsencode(root) + b"/non-utf8-\xff\xfe.bin"
    with open(raw, "wb") as f:
        f.write(b"latin junk name\n")
    os.symlink("plain.txt", root / "link-to-file")
    os.symlink("classes", root / "link-to-dir")
    os.symlink("/etc/hostname", root / "link-absolute-outside")
    os.symlink("../../../outside/of/src", root / "many" / "link-escaping")
    os.symlink("does-not-exist", root / "link-dangling")
    for path, (uid, gid) in OWNERS.items():
        os.chown(root / path, uid, gid, follow_symlinks=False)
    set_times(root)
    return root


def set_times(root: Path) -> None:
    """Distinct nanosecond mtimes, set bottom-up so directory times survive their children."""
    entries = sorted(Path(root).rglob("*"), key=lambda p: len(p.parts), reverse=True)
    for k, path in enumerate([*entries, Path(root)]):
        ns = FIXED_NS + k * 1_000_003
        os.utime(path, ns=(ns, ns), follow_symlinks=False)


def find_listing(root: Path) -> bytes:
    """Names, types, sizes, modes, owners, mtimes and link targets of every entry, as find prints
    them."""
    out = subprocess.run(
        ["find", ".", "-printf", r"%P %y %s %m %U %G %T@ %l\0"],
        cwd=root,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    return b"\0".join(sorted(out.split(b"\0")))


@pytest.fixture
def odd_tree(tmp_path: Path) -> Path:
    return make_odd_tree(tmp_path / "src")


def _pack_odd_tree(odd_tree: Path, dst: Path) -> Path:
    pack(odd_tree, dst, PackOptions(shard_size=SMALL_SHARD, progress=False))
    return dst


@pytest.fixture
def packed(odd_tree: Path, tmp_path: Path) -> Path:
    """The odd tree packed in this process (the CLI's own pack is tested in tests/pack)."""
    return _pack_odd_tree(odd_tree, tmp_path / "dataset")


@pytest.fixture
def packed_on_disk(odd_tree: Path, on_disk: Path) -> Path:
    """``packed`` on a disk, for tests whose reads must wait for storage (``drop_from_memory``):
    where ``/tmp`` is a tmpfs, ``packed`` is in memory for good."""
    return _pack_odd_tree(odd_tree, on_disk / "dataset")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie of ours counts as gone.
    status = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1]
    return not status.startswith("Z")


def is_mounted(mnt: Path) -> bool:
    target = os.fsencode(os.path.realpath(mnt))
    with open("/proc/self/mountinfo", "rb") as f:
        return any(line.split()[4] == target for line in f)


def force_unmount(mnt: Path) -> None:
    """fusermount3 -u, then lazy unmount as the last resort; never raises."""
    for command in (["fusermount3", "-u", str(mnt)], ["fusermount3", "-u", "-z", str(mnt)]):
        if not is_mounted(mnt):
            return
        subprocess.run(command, capture_output=True, timeout=30, check=False)


def unmount_and_reap(mnt: Path, pid: int) -> bool:
    """Unmount (``force_unmount``) and wait for the daemon to exit on its own; one still running
    15 s later is killed. Returns whether it exited on its own, which every clean unmount must."""
    force_unmount(mnt)
    if wait_until(lambda: not pid_alive(pid), 15):
        return True
    os.kill(pid, signal.SIGKILL)
    return False


def wait_until(condition: Callable[[], bool], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def mount_pid(result: subprocess.CompletedProcess[str]) -> int:
    """The daemon pid a background ``dlfs mount`` printed."""
    return int(re.search(r"daemon pid (\d+)", result.stdout).group(1))  # type: ignore[union-attr]


@contextmanager
def mounted(
    dataset: Path,
    mnt: Path,
    *extra: str,
    log_file: Path | None = None,
    launcher: Sequence[str] = (),
    cwd: Path | None = None,
) -> Iterator[Path]:
    """Mount with the real CLI (background daemon, started by ``launcher``, if any, from ``cwd``,
    if any); always unmount, reap the daemon, check its log.

    The daemon must exit on its own once unmounted: one still alive 15 s later is killed and the
    test fails (a descriptor the test left open on the mount, or a daemon that hangs on exit).
    """
    mnt.mkdir(parents=True, exist_ok=True)
    log_file = log_file or mnt.parent / f"{mnt.name}.log"
    result = dlfs("mount", dataset, mnt, "--log-file", log_file, *extra, launcher=launcher, cwd=cwd)
    pid = mount_pid(result)
    try:
        yield mnt
    finally:
        exited = unmount_and_reap(mnt, pid)
        log_text = log_file.read_text(errors="replace")
        assert "Traceback" not in log_text, log_text
    # Past the finally, so that a failing test reports its own error, not this one.
    assert exited, f"the daemon of {mnt} was still running 15 s after the unmount"


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[Callable[..., object]]:
    """Factory: ``with mount(dataset) as mnt:`` at a fresh mountpoint under tmp_path."""
    counter = iter(range(1000))

    def factory(
        dataset: Path, *extra: str, log_file: Path | None = None, launcher: Sequence[str] = ()
    ) -> object:
        mnt = tmp_path / f"mnt{next(counter)}"
        return mounted(dataset, mnt, *extra, log_file=log_file, launcher=launcher)

    yield factory


def listing_requests(mnt: Path) -> int:
    """READDIR and READDIRPLUS requests the mount answered so far: in Python (``requests``) and in
    the native request server's C threads (``native``)."""
    stats = json.loads((mnt / ".dlfs" / "stats").read_bytes())
    native = (stats.get("native") or {}).get("answered", {})
    return stats["requests"].get("readdir", 0) + native.get("readdir", 0) + native.get("readdirplus", 0)


def payload_place(dataset: Path, relpath: str) -> tuple[Path, int, int]:
    """Where a file's stored bytes lie: (shard path, offset, length)."""
    store = LocalStore(dataset)
    index = Index.load(store)
    row = index.resolve(relpath.encode())
    assert row is not None
    place = dataset / index.shard_names[int(index.shard[row])], int(index.offset[row]), int(index.stored[row])
    store.close()
    return place


def flip_byte(path: Path, offset: int) -> None:
    """Corrupt one byte in place (for the checksum tests)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def make_tls(directory: Path, ip: str = "127.0.0.1") -> Tls:
    """A private CA and a certificate it signed for ``ip`` (openssl, as an operator would)."""
    names = ("ca.pem", "ca.key", "s3.pem", "s3.key", "s3.csr", "s3.cnf")
    ca, ca_key, cert, key, request, extensions = (directory / name for name in names)
    extensions.write_text(f"subjectAltName=IP:{ip}\nextendedKeyUsage=serverAuth\n")
    new_key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for command in (
        ["req", "-x509", *new_key, "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", "/CN=dlfs test CA"],
        ["req", *new_key, "-keyout", key, "-out", request, "-subj", f"/CN={ip}"],
        ["x509", "-req", "-in", request, "-CA", ca, "-CAkey", ca_key, "-out", cert, "-days", "2",
         "-extfile", extensions],
    ):  # fmt: skip
        subprocess.run(["openssl", *map(str, command)], check=True, capture_output=True, timeout=60)
    return Tls(cert, key, ca)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    """One real S3 server (SeaweedFS) for the session; tests keep apart by bucket. It serves HTTPS
    too, with a certificate signed by a private CA (``server.tls.ca``)."""
    root = tmp_path_factory.mktemp("seaweed")
    with SeaweedServer(root, tls=make_tls(tmp_path_factory.mktemp("tls"))) as server:
        yield server


def use_s3(server: SeaweedServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """Point the AWS environment (this process and the CLIs it starts) at ``server``; a fresh
    prefix's URL in its one bucket (SeaweedFS gives each bucket volumes of its own, and runs out of
    them after a few). Index copies go under ``tmp_path``, not the user's cache."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    if not server.client().list_buckets()["Buckets"]:
        server.create_bucket(TEST_BUCKET)
    return f"s3://{TEST_BUCKET}/{uuid.uuid4().hex[:16]}"


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


def as_user(
    *args: str | os.PathLike[str], check: bool = True, cwd: Path = Path("/")
) -> subprocess.CompletedProcess[str]:
    """Run a command as ``ORDINARY_USER`` from ``cwd``; with ``check``, fail with its stderr."""
    command = ["runuser", "-u", ORDINARY_USER, "--", *map(str, args)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=cwd, check=False)
    if check:
        assert result.returncode == 0, f"{' '.join(command)}: {result.stderr}"
    return result


def plant(directory: Path, where: str) -> Path:
    """Code that a careless process would import from ``directory`` (``where``: one of ``PLANTED``):
    importing it writes the returned marker file, which the tests then expect never to appear."""
    marker = directory / "PLANTED-CODE-RAN"
    module = directory / where
    module.parent.mkdir(parents=True, exist_ok=True)
    module.write_text(f"import os\nopen({str(marker)!r}, 'w').write(str(os.getuid()))\n")
    return marker


def _system_state(path: Path) -> tuple[str, str | bytes | None]:
    if path.is_symlink():
        return "link", os.readlink(path)
    if path.is_file():
        return "file", path.read_bytes()
    return ("dir", None) if path.is_dir() else ("absent", None)


def _restore_system_state(path: Path, state: tuple[str, str | bytes | None]) -> None:
    kind, value = state
    if kind == "dir" or (kind == "absent" and not os.path.lexists(path)):
        return
    if path.is_dir() and not path.is_symlink():
        if not any(path.iterdir()):  # the configuration directory, unless someone wrote into it
            path.rmdir()
        return
    path.unlink(missing_ok=True)
    if kind == "link":
        path.symlink_to(str(value))
    elif kind == "file":
        path.write_bytes(value)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def system_links() -> Iterator[Path]:
    """``dlfs install-system`` for real: mount(8) looks for the helper in /sbin only, and the unit runs
    ``/usr/local/bin/dlfs``. Linked to this interpreter's venv for the tests that need it, then put
    back as it was: nothing else installs system links unless asked (``make install-system``)."""
    paths = [Path("/") / p for p in (system_install.COMMAND, system_install.HELPER, system_install.UNIT)]
    paths.append(Path("/") / system_install.CONFIG_DIR)
    saved = {path: _system_state(path) for path in paths}
    try:
        subprocess.run([*DLFS, "-q", "install-system"], check=True, timeout=60)
        yield Path("/")
    finally:
        for path, state in saved.items():
            _restore_system_state(path, state)
