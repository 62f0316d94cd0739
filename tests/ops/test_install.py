"""dlfs on a node that is not a checkout, installed as README's *Operations* says, and used there by
an ordinary user; and in a trainer's venv that has no FUSE at all.

The node's venv is made from Debian's python3 when it is this interpreter's version (as a node
would; an interpreter under /root is out of an ordinary user's reach) from the two wheels that
``make wheels`` builds, with the pyfuse3 wheel that ``make install`` built. There is no network:
pip reads only the node bundle's wheels (``make node-bundle``, which ``make test`` makes first) and
the wheels built here, never the machine's pip configuration.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from commands import TOOLS, assert_one_line_error, dlfs
from mounts import force_unmount, is_mounted
from users import ORDINARY_USER, PLANTED, as_user, plant
from waits import alive, bound, wait_exited

from dlfs import system_install
from dlfs.fuse.mount import FUSE_CONF

ROOT = TOOLS.parent
PYFUSE3_LINE = "pyfuse3 has every dlfs addition"
BUNDLE = ROOT / "dist" / "node"


def offline(*find_links: Path) -> dict[str, str]:
    """An environment in which pip has no index and no configuration, only these wheel folders."""
    links = " ".join(map(str, (*find_links, BUNDLE / "wheels")))
    return {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": links}


def _run(
    *args: str | os.PathLike[str], timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a command from / and without PYTHONPATH (so nothing imports the checkout by accident, and
    pip does not take the checkout for an installed dlfs); fail with its stderr."""
    env = {key: value for key, value in (env or os.environ).items() if key != "PYTHONPATH"}
    result = subprocess.run(
        list(map(str, args)), capture_output=True, text=True, timeout=timeout, cwd="/", check=False, env=env
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
def bundle() -> Path:
    assert (BUNDLE / "install.sh").exists(), f"{BUNDLE} is missing: make node-bundle makes it"
    return BUNDLE


@pytest.fixture(scope="module")
def wheels(shared: Path, bundle: Path) -> Path:
    """What ``make wheels`` makes: the pyfuse3 build's wheel and dlfs's, with its C loops."""
    out = shared / "wheels"
    _run(sys.executable, TOOLS / "build_pyfuse3.py", "--wheel-dir", out)
    for stale in [*ROOT.glob("build/lib.*"), *ROOT.glob("build/bdist.*")]:  # as make wheels clears them
        shutil.rmtree(stale)
    build = ["wheel", "--quiet", "--no-deps", "--no-build-isolation", "--wheel-dir", out, ROOT]
    _run(sys.executable, "-m", "pip", *build, env=offline())
    return out


def _dlfs_wheel(wheels: Path) -> Path:
    return next(wheels.glob("dlfs_data-*.whl"))


@pytest.fixture(scope="module")
def node(shared: Path, wheels: Path) -> Path:
    """A fresh venv with dlfs installed from the wheels alone (README: a node without a compiler)."""
    venv = shared / "node"
    _run(_base_python(), "-m", "venv", venv)
    _run(venv / "bin" / "pip", "install", "--quiet", f"{_dlfs_wheel(wheels)}[mount]", env=offline(wheels))
    return venv


def test_a_node_runs_dlfs_from_the_two_wheels_with_every_addition(node: Path, tmp_path: Path) -> None:
    version = _run(node / "bin" / "dlfs", "--version").stdout
    assert PYFUSE3_LINE in version and "C loops built" in version, version
    where = _run(node / "bin" / "python", "-c", "import dlfs; print(dlfs.__file__)").stdout
    assert where.startswith(str(node)), where
    _run(node / "bin" / "dlfs", "install-system", "--root", tmp_path)  # the unit comes in the wheel
    assert (tmp_path / system_install.UNIT).read_text() == (ROOT / "systemd" / "dlfs@.service").read_text()
    assert (tmp_path / system_install.HELPER).resolve() == (node / "bin" / "mount.fuse.dlfs").resolve()


def test_a_project_directory_installs_with_the_pyfuse3_script_then_pip(shared: Path, wheels: Path) -> None:
    """README's other way: the project's files (no checkout needed) on the node itself."""
    venv = shared / "from-directory"
    _run(_base_python(), "-m", "venv", venv)
    _run(venv / "bin" / "python", ROOT / "tools" / "build_pyfuse3.py", env=offline())
    _run(venv / "bin" / "pip", "install", "--quiet", f"{ROOT}[mount]", env=offline())
    version = _run(venv / "bin" / "dlfs", "--version").stdout
    assert PYFUSE3_LINE in version and "C loops built" in version, version


@pytest.mark.timeout(600)
def test_the_node_bundle_installs_with_no_index_and_mounts(
    bundle: Path, shared: Path, packed: Path, odd_tree: Path
) -> None:
    """``dist/node/install.sh VENV`` on a fresh venv: it compiles pyfuse3 and dlfs from the bundle's
    sources with the bundle's wheels alone (pyfuse3's compile takes a minute or two)."""
    venv = shared / "from-bundle"
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": ""}
    installed = _run(bundle / "install.sh", venv, timeout=540, env=env).stdout
    assert PYFUSE3_LINE in installed and "C loops built" in installed, installed
    mnt = shared / "bundle-mnt"
    mnt.mkdir()
    started = _run(venv / "bin" / "dlfs", "mount", packed, mnt, "--log-file", shared / "bundle-mount.log")
    pid = int(re.search(r"daemon pid (\d+)", started.stdout).group(1))  # type: ignore[union-attr]
    try:
        assert (mnt / "plain.txt").read_bytes() == (odd_tree / "plain.txt").read_bytes()
        _run(venv / "bin" / "dlfs", "umount", mnt)
        wait_exited(pid, "the bundle's daemon after dlfs umount")
    finally:
        force_unmount(mnt)
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


#: Run in the trainer's venv on a mount: sample epoch 0 of the files under it with dlfs.torch, read
#: them, and print as JSON whether pyfuse3 can be imported there and the paths sampled, in order.
TRAINER = """
import importlib.util, json, sys
from pathlib import Path
import dlfs.torch
class Files:  # an ImageFolder-like dataset: a root and (path, class) samples
    def __init__(self, root):
        self.root = root
        self.samples = sorted((str(p), 0) for p in Path(root).glob("*/*"))
dataset = Files(sys.argv[1])
sampler = dlfs.torch.ShuffleSampler(dataset)
sampler.set_epoch(0)
sampled = [dataset.samples[index][0] for index in sampler]
assert all(Path(path).read_bytes() for path in sampled)
print(json.dumps({"pyfuse3": importlib.util.find_spec("pyfuse3") is not None, "sampled": sampled}))
"""


@pytest.fixture(scope="module")
def trainer(shared: Path, wheels: Path) -> Path:
    """A training job's venv: dlfs's wheel without extras, so no pyfuse3, and PyTorch from the image
    (here this interpreter's torch and the modules it imports, linked in as a container would have
    them)."""
    venv = shared / "trainer"
    _run(_base_python(), "-m", "venv", venv)
    _run(venv / "bin" / "pip", "install", "--quiet", _dlfs_wheel(wheels), env=offline(wheels))
    probe = (
        "import sys, torch.distributed, torch.utils.data\n"
        "for name, module in list(sys.modules.items()):\n"
        "    path = getattr(module, '__file__', None) or ''\n"
        "    if '.' not in name and 'site-packages' in path and name != 'numpy':\n"
        "        print(path)\n"
    )  # numpy: pip installed it in the trainer's venv
    image = shared / "trainer-image"
    image.mkdir()
    for line in _run(sys.executable, "-c", probe).stdout.splitlines():
        path = Path(line)
        source = path.parent if path.name == "__init__.py" else path
        (image / source.name).symlink_to(source)
    purelib = _run(venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))")
    (Path(purelib.stdout.strip()) / "image.pth").write_text(f"{image}\n")
    return venv


def test_a_trainer_venv_without_pyfuse3_samples_from_a_mount(
    trainer: Path, tmp_path: Path, mount: Callable[..., object]
) -> None:
    """The mount is served by this venv's dlfs, as a node serves it to a training container."""
    for k in range(40):
        (tmp_path / "src" / f"class-{k % 4}").mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / f"class-{k % 4}" / f"{k}.bin").write_bytes(os.urandom(100 + k))
    dlfs("pack", tmp_path / "src", tmp_path / "dataset")
    with mount(tmp_path / "dataset") as mnt:
        result = json.loads(_run(trainer / "bin" / "python", "-c", TRAINER, mnt).stdout)
        assert not result["pyfuse3"], "pyfuse3 is importable in the trainer's venv"
        sampled = [str(Path(path).relative_to(mnt)) for path in result["sampled"]]
        assert sorted(sampled) == sorted(
            str(p.relative_to(tmp_path / "src")) for p in (tmp_path / "src").glob("*/*")
        )


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


#: Run as the user on their mount (argv[1]): read the published epoch once the read-ahead has fetched
#: it, or after argv[2] seconds; print how many files it pushed into the page cache and how many the
#: epoch has.
READ_AHEAD = """
import json, sys, time
from pathlib import Path
from dlfs.core.protocol import parse_order
mnt = Path(sys.argv[1])
for path in mnt.rglob("*"):
    path.stat()  # the kernel must know an inode before pages can be pushed to it
paths = parse_order((mnt / ".dlfs" / "order" / "epoch-0.rank-0-of-1").read_bytes())
def readahead():
    return json.loads((mnt / ".dlfs" / "stats").read_text())["readahead"]
deadline = time.monotonic() + float(sys.argv[2])
while readahead()["readings"]["epoch-0.rank-0-of-1"]["fetched"] < len(paths) and time.monotonic() < deadline:
    time.sleep(0.05)
for path in paths:
    (mnt / path).read_bytes()
print(readahead()["pushed_files"], len(paths))
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
        said = as_user(node / "bin" / "python", "-c", READ_AHEAD, mnt, str(bound(30))).stdout
        pushed, files = map(int, said.split())
        assert files == 20 and pushed >= files - 1, (pushed, files)  # but the sentinel
        as_user("diff", "-r", user_dir / "src", mnt)
        as_user(dlfs, "umount", mnt)
        wait_exited(pid, "the user's daemon after dlfs umount")
        assert not is_mounted(mnt)
    finally:
        force_unmount(mnt)
        if pid and alive(pid):
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
