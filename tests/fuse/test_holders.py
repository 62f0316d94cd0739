"""``holders``: the processes an unmount refused as busy names, however the mountpoint is written."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dlfs.fuse.mount import holders


@pytest.mark.timeout(30)
def test_holders_are_found_by_relative_and_symlinked_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = tmp_path / "real" / "mnt"
    held.mkdir(parents=True)
    (tmp_path / "via").symlink_to(tmp_path / "real")
    sleeper = subprocess.Popen(["sleep", "60"], cwd=held)
    try:
        expected = f"pid {sleeper.pid} (sleep)"
        monkeypatch.chdir(tmp_path / "real")
        for written in (str(held), "mnt", "./mnt/", str(tmp_path / "via" / "mnt")):
            assert expected in holders(written), written
        assert expected not in holders(str(tmp_path / "real" / "other"))
    finally:
        sleeper.kill()
        sleeper.wait()
