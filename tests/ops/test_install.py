"""dlfs on a node that is not a checkout, installed as README's *Operations* says, and used there by
an ordinary user.

The node's venv is made from Debian's python3 when it is this interpreter's version (as a node
would; an interpreter under /root is out of an ordinary user's reach) from the two wheels that
``make wheels`` builds: the first run builds pyfuse3 (about 25 s), later runs reuse its wheel.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import (
    ORDINARY_USER,
    PLANTED,
    TOOLS,
    as_user,
    assert_one_line_error,
    force_unmount,
    is_mounted,
    pid_alive,
    plant,
    wait_until,
)

from dlfs import system_install
from dlfs.fuse.mount import FUSE_CONF

ROOT = TOOLS.parent
PYFUSE3_LINE = "pyfuse3 has every dlfs addition"


def _run(
    *args: str | os.PathLike[str], timeout: float = 300, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    """Run a command from / (so nothing imports the checkout by accident); fail with its stderr."""
    result = subprocess.run(
        list(map(str, args)), capture_output=True, text=True, timeout=timeout, cwd="/", check=False, **kwargs
    )
    assert result.returncode == 0, f"{' '.join(map(str, args))}: {result.stderr}"
    return result


def _base_python() -> str:
    debian = "/usr/bin/python3"
    probe = "import sys; print(sys.version_info[:2])"
    if os.path.exists(debian) and _run(debian, "-c", probe).stdout.strip() == str(sys.version_info[:2]):
        return debian
    return sys.executable


@pytest.fixture(scope="module")
def shared() -> Iterator[Path]:
    """A directory every user can read, on disk."""
    path = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="dlfs-node-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


@pytest.fixture(scope="module")
def wheels(shared: Path) -> Path:
    """What ``make wheels`` makes: the pyfuse3 build's wheel and dlfs's, with its C loops."""
    out = shared / "wheels"
    _run(sys.executable, TOOLS / "build_pyfuse3.py", "--wheel-dir", out)
    _run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", out, ROOT)
    return out


@pytest.fixture(scope="module")
def node(shared: Path, wheels: Path) -> Path:
    """A fresh venv with dlfs installed from the wheels alone (README: a node without a compiler)."""
    venv = shared / "node"
    _run(_base_python(), "-m", "venv", venv)
    _run(venv / "bin" / "pip", "install", "--quiet", "--find-links", wheels, *wheels.glob("dlfs-*.whl"))
    return venv


def test_a_node_runs_dlfs_from_the_two_wheels_with_every_addition(node: Path, tmp_path: Path) -> None:
    version = _run(node / "bin" / "dlfs", "--version").stdout
    assert PYFUSE3_LINE in version and "C loops built" in version, version
    where = _run(node / "bin" / "python", "-c", "import dlfs; print(dlfs.__file__)").stdout
    assert where.startswith(str(node)), where
    _run(node / "bin" / "dlfs", "install-system", "--root", tmp_path)  # the unit comes in the wheel
    assert (tmp_path / system_install.UNIT).read_text() == system_install.unit_text()
    assert (tmp_path / system_install.HELPER).resolve() == (node / "bin" / "mount.fuse.dlfs").resolve()


def test_a_project_directory_installs_with_the_pyfuse3_script_then_pip(shared: Path, wheels: Path) -> None:
    """README's other way: the project's files (no checkout needed) on the node itself."""
    venv = shared / "from-directory"
    _run(_base_python(), "-m", "venv", venv)
    _run(venv / "bin" / "python", ROOT / "tools" / "build_pyfuse3.py")
    _run(venv / "bin" / "pip", "install", "--quiet", ROOT)
    version = _run(venv / "bin" / "dlfs", "--version").stdout
    assert PYFUSE3_LINE in version and "C loops built" in version, version


def test_building_without_a_compiler_names_the_debian_packages_in_one_line(tmp_path: Path) -> None:
    """Nothing on PATH: no compiler, no pkg-config. Both builds say so before any compiler runs."""
    env = {**os.environ, "PATH": str(tmp_path)}
    env.pop("CC", None)
    build = f"import sys, pathlib; sys.path.insert(0, {str(TOOLS)!r}); import build_pyfuse3 as b; "
    build += f"b.build_wheel(pathlib.Path({str(tmp_path)!r}))"
    result = subprocess.run(
        [sys.executable, "-c", build], capture_output=True, text=True, timeout=60, env=env, check=False
    )
    assert_one_line_error(result, "missing Debian package(s) gcc pkg-config libfuse3-dev", "apt-get install")
    result = subprocess.run(
        [sys.executable, "setup.py", "--quiet", "build_ext", "--build-temp", tmp_path / "temp"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=ROOT,
        check=False,
    )
    assert_one_line_error(result, "missing Debian package(s) gcc pkg-config", "apt-get install")


@pytest.fixture
def user_dir(shared: Path, ordinary_user: str, tmp_path: Path) -> Iterator[Path]:
    """A directory of the user's with a small tree ``src`` in it."""
    path = shared / f"user-{tmp_path.name}"
    (path / "src" / "class-a").mkdir(parents=True)
    for k in range(20):
        (path / "src" / "class-a" / f"{k}.bin").write_bytes(os.urandom(1000 + k))
    _run("chown", "-R", ordinary_user, path)
    return path


#: Run as the user on their mount: read the published epoch once the read-ahead has fetched it; print
#: how many files it pushed into the page cache and how many the epoch has.
READ_AHEAD = """
import json, sys, time
from pathlib import Path
from dlfs.core.protocol import parse_order
mnt = Path(sys.argv[1])
for path in mnt.rglob("*"):
    path.stat()  # the kernel must know an inode before pages can be pushed to it
paths = parse_order((mnt / ".dlfs" / "order" / "epoch-0.rank-0-of-1").read_bytes())
def prefetch():
    return json.loads((mnt / ".dlfs" / "stats").read_text())["prefetch"]
deadline = time.monotonic() + 30
while prefetch()["readings"]["epoch-0.rank-0-of-1"]["fetched"] < len(paths) and time.monotonic() < deadline:
    time.sleep(0.05)
for path in paths:
    (mnt / path).read_bytes()
print(prefetch()["pushed_files"], len(paths))
"""


@pytest.mark.parametrize("where", PLANTED)
def test_an_ordinary_user_packs_mounts_reads_and_unmounts(node: Path, user_dir: Path, where: str) -> None:
    """Also the read-ahead, which an unprivileged daemon runs without a detached view of its mount
    (``open_tree`` needs CAP_SYS_ADMIN); and the mount is started where code lies that its daemon
    must never import."""
    dlfs = node / "bin" / "dlfs"
    dataset, mnt, log = user_dir / "dataset", user_dir / "mnt", user_dir / "mount.log"
    as_user(dlfs, "-q", "pack", user_dir / "src", dataset)
    as_user("mkdir", mnt)
    here = user_dir / "here"
    marker = plant(here, where)
    _run("chown", "-R", ORDINARY_USER, here)
    started = as_user(dlfs, "mount", dataset, mnt, "--log-file", log, cwd=here)
    pid = 0
    try:
        pid = int(re.search(r"daemon pid (\d+)", started.stdout).group(1))  # type: ignore[union-attr]
        assert os.stat(f"/proc/{pid}").st_uid != 0
        pushed, files = map(int, as_user(node / "bin" / "python", "-c", READ_AHEAD, mnt).stdout.split())
        assert files == 20 and pushed >= files - 1, (pushed, files)  # but the sentinel
        as_user("diff", "-r", user_dir / "src", mnt)
        as_user(dlfs, "umount", mnt)
        assert wait_until(lambda: not pid_alive(pid), 15)
        assert not is_mounted(mnt)
    finally:
        force_unmount(mnt)
        if pid and pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
    text = log.read_text()
    assert "not root: the daemon runs at normal priority" in text and "Traceback" not in text, text
    assert not marker.exists()


def test_a_user_who_cannot_open_dev_fuse_is_told_why_and_what_to_do(node: Path, user_dir: Path) -> None:
    """libfuse's own reason reaches only the daemon's log; the terminal gets it in one line."""
    dlfs = node / "bin" / "dlfs"
    dataset, mnt = user_dir / "dataset", user_dir / "mnt"
    as_user(dlfs, "-q", "pack", user_dir / "src", dataset)
    as_user("mkdir", mnt)
    mode = os.stat("/dev/fuse").st_mode
    os.chmod("/dev/fuse", 0o600)
    try:
        result = as_user(dlfs, "mount", dataset, mnt, "--log-file", user_dir / "log", check=False)
    finally:
        os.chmod("/dev/fuse", mode)
        force_unmount(mnt)
    assert_one_line_error(result, "cannot open /dev/fuse: Permission denied", "chmod 0666 /dev/fuse")


def test_allow_other_as_an_ordinary_user_names_user_allow_other(node: Path, user_dir: Path) -> None:
    lines = FUSE_CONF.read_text().splitlines() if FUSE_CONF.exists() else []
    if "user_allow_other" in (line.strip() for line in lines):
        pytest.skip(f"{FUSE_CONF} allows allow_other to every user here")
    dlfs = node / "bin" / "dlfs"
    dataset, mnt = user_dir / "dataset", user_dir / "mnt"
    as_user(dlfs, "-q", "pack", user_dir / "src", dataset)
    as_user("mkdir", mnt)
    try:
        result = as_user(
            dlfs, "mount", dataset, mnt, "--allow-other", "--log-file", user_dir / "log", check=False
        )
        assert_one_line_error(result, "user_allow_other", str(FUSE_CONF))
        assert not is_mounted(mnt)
    finally:
        force_unmount(mnt)


def test_a_cold_benchmark_as_an_ordinary_user_says_it_needs_root(node: Path, user_dir: Path) -> None:
    result = as_user(
        node / "bin" / "dlfs",
        "bench",
        user_dir / "src",
        "--cold",
        "--job",
        "stat",
        "--repeat",
        "1",
        check=False,
    )
    assert_one_line_error(result, "drop_caches", "root")


def test_install_system_as_an_ordinary_user_says_it_needs_root(node: Path, ordinary_user: str) -> None:
    assert_one_line_error(as_user(node / "bin" / "dlfs", "install-system", check=False), "needs root")
