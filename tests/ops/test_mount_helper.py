"""``mount -t fuse.dlfs`` and /etc/fstab lines, through the real mount(8), and the system install
that puts the helper where mount(8) looks for it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from commands import DLFS, assert_one_line_error
from mounts import force_unmount, is_mounted, unmount_and_reap
from users import PLANTED, plant
from waits import wait_exited

from dlfs import system_install
from dlfs.fuse.mount import mounted_fstype
from dlfs.mount_helper import OptionError, to_flags


@pytest.fixture(scope="module")
def installed(system_links: Path) -> Path:
    """The mount helper where mount(8) looks for it, linked to this interpreter's venv."""
    helper = system_links / system_install.HELPER
    assert helper.resolve() == (Path(sys.executable).parent / "mount.fuse.dlfs").resolve()
    return helper


@contextmanager
def mounted_by_mount8(mnt: Path, *mount_args: str, cwd: Path | None = None) -> Iterator[int]:
    """Run mount(8) as given (from ``cwd``, if any); yield the daemon's pid; always unmount and reap
    the daemon."""
    mnt.mkdir(exist_ok=True)
    result = subprocess.run(
        ["mount", *mount_args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False
    )
    assert result.returncode == 0, result.stderr
    found = re.search(r"daemon pid (\d+)", result.stdout)
    stuck = None
    try:
        assert found, result.stdout
        yield int(found.group(1))
    finally:
        if found:
            stuck = unmount_and_reap(mnt, int(found.group(1)))
        else:
            force_unmount(mnt)
    assert stuck is None, f"the daemon outlived the unmount: {stuck}"


def test_options_map_onto_dlfs_mount_flags() -> None:
    flags = to_flags("rw,allow_other,seed=1,order=block,readahead_budget=1G,nofail,_netdev,x-systemd.after=a")
    assert flags == ["--allow-other", "--seed", "1", "--order", "block", "--readahead-budget", "1G"]


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ("colour=blue", ["unknown option 'colour'", "seed="]),
        ("seed", ["'seed' needs a value"]),
        ("allow_other=1", ["'allow_other' takes no value"]),
        ("foreground", ["unknown option 'foreground'"]),
        ("seed=abc", ["seed='abc'", "needs a whole number"]),
        ("readahead_budget=lots", ["readahead_budget='lots'", "not a size"]),
        ("order=shuffled", ["order='shuffled'", "choose one of full, block"]),
    ],
)
def test_an_option_dlfs_does_not_take_is_refused_by_name(options: str, words: list[str]) -> None:
    with pytest.raises(OptionError) as info:
        to_flags(options)
    for word in words:
        assert word in str(info.value)


def test_sloppy_mount_skips_unknown_options() -> None:
    assert to_flags("colour=blue,seed=2", sloppy=True) == ["--seed", "2"]


def test_fstab_habits_are_ignored_and_noexec_is_said_not_applied(capsys: pytest.CaptureFixture[str]) -> None:
    assert to_flags("noauto,user,users,owner,exec,suid,dev,sync,async,noexec,seed=4") == ["--seed", "4"]
    assert "noexec is not applied" in capsys.readouterr().err


def test_check_only_mount_refuses_a_bad_value_in_one_line() -> None:
    """``mount -f``: nothing is mounted, and a value dlfs mount would refuse is refused here."""
    command = [sys.executable, "-m", "dlfs.mount_helper", "ds", "mnt", "-f", "-o"]
    bad = subprocess.run([*command, "seed=abc"], capture_output=True, text=True, timeout=60, check=False)
    assert_one_line_error(bad, "seed='abc'")
    assert bad.returncode == 1
    good = subprocess.run([*command, "seed=3,order=block"], capture_output=True, text=True, timeout=60)
    assert good.returncode == 0 and not good.stderr


def test_mount_t_fuse_dlfs_mounts_with_options_and_umount_ends_it(
    installed: Path, packed: Path, odd_tree: Path, tmp_path: Path
) -> None:
    mnt = tmp_path / "mnt"
    log = tmp_path / "daemon.log"
    options = f"allow_other,seed=7,order=block,block=16,readahead_budget=64M,log_file={log}"
    with mounted_by_mount8(mnt, "-t", "fuse.dlfs", str(packed), str(mnt), "-o", options) as pid:
        assert mounted_fstype(mnt) == "fuse.dlfs"
        config = json.loads((mnt / ".dlfs" / "config").read_bytes())
        assert (config["seed"], config["mode"], config["block"]) == (7, "block", 16)
        assert (mnt / "plain.txt").read_bytes() == (odd_tree / "plain.txt").read_bytes()
        with open("/proc/self/mountinfo") as table:
            assert any(f" {mnt} " in line and "allow_other" in line for line in table)
        subprocess.run(["umount", str(mnt)], check=True, timeout=30)
        wait_exited(pid, "the daemon mount(8) started, after umount")
        assert not is_mounted(mnt)
    assert "Traceback" not in log.read_text()


def test_an_fstab_line_mounts(installed: Path, packed: Path, tmp_path: Path) -> None:
    """mount(8) reads the line as from /etc/fstab (``-T`` names the table), options and all."""
    mnt = tmp_path / "mnt"
    fstab = tmp_path / "fstab"
    options = f"defaults,nofail,_netdev,seed=3,readdirplus=always,log_file={tmp_path / 'daemon.log'}"
    fstab.write_text(f"# a dataset\n{packed} {mnt} fuse.dlfs {options} 0 0\n")
    with mounted_by_mount8(mnt, "-T", str(fstab), str(mnt)):
        assert json.loads((mnt / ".dlfs" / "config").read_bytes())["seed"] == 3
        assert (mnt / "plain.txt").read_bytes() == b"hello dlfs\n"


@pytest.mark.parametrize("where", PLANTED)
def test_mount_t_fuse_dlfs_never_imports_code_from_the_current_directory(
    installed: Path, packed: Path, tmp_path: Path, where: str
) -> None:
    """mount(8) runs the helper in the administrator's current directory, as fstab's mounts do."""
    here = tmp_path / "here"
    marker = plant(here, where)
    mnt = tmp_path / "mnt"
    with mounted_by_mount8(mnt, "-t", "fuse.dlfs", str(packed), str(mnt), cwd=here):
        assert (mnt / "plain.txt").read_bytes() == b"hello dlfs\n"
    assert not marker.exists()


def test_mount_with_an_unknown_option_says_which_in_one_line(
    installed: Path, packed: Path, tmp_path: Path
) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = subprocess.run(
        ["mount", "-t", "fuse.dlfs", str(packed), str(mnt), "-o", "seed=1,colour=blue"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert_one_line_error(result, "colour", "fuse.dlfs")
    assert not is_mounted(mnt)


def test_a_failed_mount_is_one_line_and_mount8s_failure_status(installed: Path, tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = subprocess.run(
        ["mount", "-t", "fuse.dlfs", str(tmp_path), str(mnt)], capture_output=True, text=True, timeout=60
    )
    assert_one_line_error(result, "not a dlfs dataset")
    assert result.returncode == 32


def test_install_system_links_the_venv_and_changes_nothing_the_second_time(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    command = [*DLFS, "install-system", "--root", str(root)]
    first = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
    bin_dir = Path(sys.executable).parent
    assert os.readlink(root / system_install.COMMAND) == str(bin_dir.absolute() / "dlfs")
    assert os.readlink(root / system_install.HELPER) == str(bin_dir.absolute() / "mount.fuse.dlfs")
    assert (root / system_install.UNIT).read_text() == system_install.unit_text()
    assert (root / system_install.CONFIG_DIR).is_dir()
    assert len(first.stdout.splitlines()) == 4
    again = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
    assert "already" in again.stdout


def test_install_system_leaves_a_file_that_is_not_its_link_alone(tmp_path: Path) -> None:
    command = tmp_path / system_install.COMMAND
    command.parent.mkdir(parents=True)
    command.write_text("#!/bin/sh\n")
    result = subprocess.run(
        [*DLFS, "install-system", "--root", tmp_path], capture_output=True, text=True, timeout=60
    )
    assert_one_line_error(result, str(command), "not a link")
    assert command.read_text() == "#!/bin/sh\n"


def _install_system(root: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DLFS, "install-system", "--root", root, *flags], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("kind", ["symlink", "foreign"])
def test_install_system_never_writes_a_unit_it_did_not_write(tmp_path: Path, kind: str) -> None:
    """An administrator's file, or a link that would carry the write outside the root, is refused."""
    unit, outside = tmp_path / "root" / system_install.UNIT, tmp_path / "outside.service"
    outside.write_text("[Unit]\nDescription=mine\n")
    unit.parent.mkdir(parents=True)
    if kind == "symlink":
        unit.symlink_to(outside)
    else:
        unit.write_text(outside.read_text())
    assert_one_line_error(_install_system(tmp_path / "root"), str(unit), "remove it")
    assert outside.read_text() == "[Unit]\nDescription=mine\n"
    assert kind == "symlink" or unit.read_text() == outside.read_text()


def test_install_system_replaces_its_own_older_unit(tmp_path: Path) -> None:
    unit = tmp_path / system_install.UNIT
    unit.parent.mkdir(parents=True)
    unit.write_text(system_install.unit_text().partition("\n")[0] + "\nan older version\n")
    assert f"wrote {unit}" in _install_system(tmp_path).stdout
    assert unit.read_text() == system_install.unit_text()


def test_keep_links_leaves_another_install_in_place(tmp_path: Path) -> None:
    """``make install-system`` in a checkout does not take /usr/local/bin/dlfs from a production venv."""
    other = tmp_path / "opt" / "dlfs"
    other.parent.mkdir()
    other.write_text("#!/bin/sh\n")
    command = tmp_path / "root" / system_install.COMMAND
    command.parent.mkdir(parents=True)
    command.symlink_to(other)
    kept = _install_system(tmp_path / "root", "--keep-links")
    assert kept.returncode == 0 and f"left {command} -> {other}" in kept.stdout
    assert os.readlink(command) == str(other)
    assert _install_system(tmp_path / "root").returncode == 0
    assert os.readlink(command) == str(Path(sys.executable).parent.absolute() / "dlfs")
