"""dlfs on a node that is not a checkout, installed as README's *Operations* says, and used there by
an ordinary user; and in a trainer's venv that has no FUSE at all.

The node's venv is made from Debian's python3 when it is this interpreter's version (as a node
would; an interpreter under /root is out of an ordinary user's reach) from the two wheels that
``make wheels`` builds, with the pyfuse3 wheel that ``make install`` built. There is no network:
pip reads only the node bundle's wheels (``make node-bundle``, which ``make test`` makes first) and
the wheels built here, never the machine's pip configuration.
"""

from __future__ import annotations

import importlib.util
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
from conftest import (
    TOOLS,
    dlfs,
    force_unmount,
    pid_alive,
    wait_until,
)

from dlfs import system_install

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
        assert wait_until(lambda: not pid_alive(pid), 15)
    finally:
        force_unmount(mnt)
        if pid_alive(pid):
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
        "import sys, torch.distributed, torch.utils.data; "
        "print('\\n'.join({m.split('.')[0] for m in sys.modules}))"
    )
    image = shared / "trainer-image"
    image.mkdir()
    for name in _run(sys.executable, "-c", probe).stdout.split():
        found = importlib.util.find_spec(name)
        origin = Path(found.origin) if found and found.origin else None
        if origin is None or "site-packages" not in origin.parts or name in ("numpy", "dlfs"):
            continue  # the standard library, or what pip installed in the trainer's venv
        source = origin.parent if origin.name == "__init__.py" else origin
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
