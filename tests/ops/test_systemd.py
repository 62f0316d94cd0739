"""The systemd template unit ``dlfs@.service``: valid for systemd, and its commands mount, notify
and unmount when run the way systemd runs them (there is no systemd to start it under in a test)."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
from pathlib import Path

import pytest
from mounts import force_unmount, is_mounted
from waits import HANG, bound

from dlfs import system_install


@pytest.fixture(scope="module")
def unit(system_links: Path) -> Path:
    """The unit where ``dlfs install-system`` writes it, with the ``/usr/local/bin/dlfs`` its commands
    run."""
    return system_links / system_install.UNIT


def test_the_unit_passes_systemd_analyze_verify(unit: Path) -> None:
    result = subprocess.run(
        ["systemd-analyze", "verify", str(unit.with_name("dlfs@imagenet.service"))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0 and "dlfs@" not in result.stderr, result.stderr


def _setting(text: str, key: str) -> str:
    return re.search(rf"^{key}=(.*)$", text, re.MULTILINE).group(1)  # type: ignore[union-attr]


def _command(line: str, env: dict[str, str], instance: str) -> list[str]:
    """An Exec line as systemd runs it: ``-`` dropped, ``${X}`` one word, ``$X`` split at spaces."""
    words = []
    for word in shlex.split(line.removeprefix("-").replace("%i", instance)):
        if re.fullmatch(r"\$[A-Z_]+", word):
            words += env.get(word[1:], "").split()
        else:
            words.append(re.sub(r"\$\{([A-Z_]+)\}", lambda m: env.get(m.group(1), ""), word))
    return words


def _read_conf(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def test_the_units_commands_mount_say_ready_once_live_and_unmount(
    unit: Path, packed: Path, odd_tree: Path, tmp_path: Path
) -> None:
    text = unit.read_text()
    assert _setting(text, "Type") == "notify"
    mnt = tmp_path / "data" / "imagenet"  # ExecStartPre creates it
    conf = tmp_path / "imagenet.conf"
    conf.write_text(f"DATASET={packed}\nMOUNTPOINT={mnt}\nOPTIONS=--seed 5 --readahead-budget 32M\n")
    assert _setting(text, "EnvironmentFile") == "/etc/dlfs/%i.conf"
    env = _read_conf(conf)
    subprocess.run(_command(_setting(text, "ExecStartPre"), env, "imagenet"), check=True, timeout=30)
    notify = tmp_path / "notify"
    log = tmp_path / "daemon.stderr"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener, open(log, "w") as stderr:
        listener.bind(str(notify))
        listener.settimeout(60)
        daemon = subprocess.Popen(
            _command(_setting(text, "ExecStart"), env, "imagenet"),
            env={**os.environ, "NOTIFY_SOCKET": str(notify)},
            stdout=subprocess.DEVNULL,
            stderr=stderr,  # a file: a pipe read only at the end could fill and block the daemon
        )
        try:
            assert listener.recv(64) == b"READY=1"
            assert is_mounted(mnt)
            assert (mnt / "plain.txt").read_bytes() == (odd_tree / "plain.txt").read_bytes()
            assert json.loads((mnt / ".dlfs" / "config").read_bytes())["seed"] == 5
            subprocess.run(_command(_setting(text, "ExecStop"), env, "imagenet"), check=True, timeout=30)
            assert daemon.wait(timeout=30) == 0
            assert not is_mounted(mnt)
            assert "Traceback" not in log.read_text()
        finally:
            force_unmount(mnt)
            try:
                daemon.wait(timeout=bound(HANG))
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
