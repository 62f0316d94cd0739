"""What dlfs's processes trust: their own installed package, never a module lying in the directory
a command was started from (``dlfs.core.interpreter``); and a mount whose C paths cannot run says so on
the terminal, where the user sees it."""

from __future__ import annotations

import json
import shutil
import socket
import sys
from pathlib import Path

import pytest
from commands import TOOLS, dlfs, tool
from mounts import mount_pid, mounted, unmount_and_reap
from netshape import DelayProxy
from users import PLANTED, plant

import dlfs as package
from dlfs.bench.peers import PEERS

PACKAGE = Path(package.__file__).parent


@pytest.mark.parametrize("where", PLANTED)
def test_a_mount_never_imports_code_from_its_current_directory(
    packed: Path, tmp_path: Path, where: str
) -> None:
    here = tmp_path / "here"
    marker = plant(here, where)
    with mounted(packed, tmp_path / "mnt", cwd=here) as mnt:
        assert (mnt / "plain.txt").read_bytes()
    assert not marker.exists(), f"the daemon ran {here / where} as uid {marker.read_text()}"


def _unbuilt_copy(directory: Path) -> Path:
    """A copy of dlfs's sources with no C loop built, as a fresh clone has them."""
    shutil.copytree(PACKAGE, directory / "dlfs", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    return directory


def test_a_mount_started_in_an_unbuilt_source_tree_serves_with_the_installed_c_threads(
    packed: Path, tmp_path: Path
) -> None:
    checkout = _unbuilt_copy(tmp_path / "checkout")
    with mounted(packed, tmp_path / "mnt", cwd=checkout) as mnt:
        assert (mnt / "plain.txt").read_bytes()
        stats = json.loads((mnt / ".dlfs" / "stats").read_text())
    assert stats["native"] is not None, "Python answered every request: the daemon imported the copy"


def test_a_mount_without_its_c_loops_says_so_on_the_terminal(
    packed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The installed package itself lacks them here: the copy is put first on PYTHONPATH."""
    monkeypatch.setenv("PYTHONPATH", str(_unbuilt_copy(tmp_path / "unbuilt")))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = dlfs("mount", packed, mnt, "--log-file", tmp_path / "log")
    stuck = unmount_and_reap(mnt, mount_pid(result))
    assert stuck is None, stuck
    warnings = [line for line in result.stderr.splitlines() if line.startswith("dlfs: warning: ")]
    for said in ("request server is unavailable (_server.so", "read-ahead loop is unavailable (_push.so"):
        assert any(said in line and "is not built" in line for line in warnings), warnings
    assert all(len(line) < 300 for line in warnings), warnings


@pytest.mark.parametrize("where", PLANTED)
def test_the_delay_proxy_never_imports_code_from_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    marker = plant(tmp_path, where)
    monkeypatch.chdir(tmp_path)
    with socket.socket() as target:
        target.bind(("127.0.0.1", 0))
        with DelayProxy("127.0.0.1", target.getsockname()[1], delay_ms=1) as proxy:
            assert proxy.port
    assert not marker.exists()


def test_dlfs_bench_starts_its_dlfs_peer_with_safe_path() -> None:
    dlfs_peer = next(peer for peer in PEERS if peer.name == "dlfs")
    for template in (dlfs_peer.build, dlfs_peer.mount):
        command = dlfs_peer.command(template, Path("src"), Path("image"), Path("mnt"))
        assert command[:4] == [sys.executable, "-P", "-m", "dlfs.cli"], command


def test_transform_workers_never_import_code_from_the_current_directory(tmp_path: Path) -> None:
    """``--transform``'s worker processes are started by multiprocessing's spawn, as ``python -c``,
    which puts the current directory first: a planted ``multiprocessing.py`` would run there."""
    src = tmp_path / "src"
    tool(TOOLS / "make_imagenet_like.py", src, "--files", "4", "--classes", "1", "--payload", "jpeg")
    here = tmp_path / "here"
    marker = plant(here, "multiprocessing.py")
    dlfs("pack", src, tmp_path / "dst", "--transform", "resize:64", cwd=here)
    assert not marker.exists()
