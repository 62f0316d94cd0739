"""What a new user types wrong, each command answers in one line that says what to do: a dataset
that does not exist, a tar or a zip where a dataset goes (with the ``dlfs pack`` that makes one),
a file that is neither, and a mountpoint that is already a mount, whose own log stays untouched."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest
from commands import assert_one_line_error, dlfs
from mounts import mounted

#: Each command that takes a dataset, with what follows it.
COMMANDS = {"info": [], "ls": [], "verify": [], "mount": ["{mnt}"]}


def _run(command: str, dataset: Path, tmp_path: Path) -> object:
    (tmp_path / "mnt").mkdir(exist_ok=True)
    extra = [arg.format(mnt=tmp_path / "mnt") for arg in COMMANDS[command]]
    return dlfs(command, dataset, *extra, check=False)


def _tar(path: Path) -> Path:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as out:
        info = tarfile.TarInfo("a.jpg")
        info.size = 3
        out.addfile(info, io.BytesIO(b"jpg"))
    path.write_bytes(buffer.getvalue())
    return path


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_dataset_that_does_not_exist_is_one_line(command: str, tmp_path: Path) -> None:
    assert_one_line_error(_run(command, tmp_path / "nosuch", tmp_path), "nosuch does not exist")  # type: ignore[arg-type]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_tar_where_a_dataset_goes_says_how_to_serve_it_in_place(command: str, tmp_path: Path) -> None:
    """Mounting the raw tar is the natural first mistake: the answer is the command meant."""
    tar = _tar(tmp_path / "train.tar")
    result = _run(command, tar, tmp_path)
    assert_one_line_error(result, f"{tar} is a tar", f"dlfs pack --in-place {tar} {tmp_path / 'train.dlfs'}")  # type: ignore[arg-type]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_zip_where_a_dataset_goes_says_how_to_pack_it(command: str, tmp_path: Path) -> None:
    archive = tmp_path / "data.zip"
    with zipfile.ZipFile(archive, "w") as out:
        out.writestr("a.jpg", b"jpg")
    assert_one_line_error(_run(command, archive, tmp_path), "is a zip archive", f"dlfs pack {archive}")  # type: ignore[arg-type]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_plain_file_where_a_dataset_goes_is_one_line(command: str, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("notes\n")
    assert_one_line_error(_run(command, tmp_path / "notes.txt", tmp_path), "is a file, not a dlfs dataset")  # type: ignore[arg-type]


def test_a_second_mount_on_a_live_mountpoint_is_refused_and_leaves_the_live_log_alone(
    packed: Path, tmp_path: Path
) -> None:
    log = tmp_path / "live.log"
    with mounted(packed, tmp_path / "mnt", log_file=log) as mnt:
        before = log.read_bytes()
        result = dlfs("mount", packed, mnt, check=False)
        assert_one_line_error(result, "already a mount point", f"dlfs umount {mnt}")
        assert log.read_bytes() == before
        second = dlfs("mount", packed, mnt, "--log-file", log, check=False)
        assert_one_line_error(second, "already a mount point")
        assert log.read_bytes() == before, "not even when the same log file is named"
