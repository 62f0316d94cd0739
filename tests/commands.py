"""The commands tests run as a user would: the real ``dlfs`` CLI and the checkout's ``tools/``, each
in a subprocess, and what a user error must look like."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

#: The CLI as this interpreter runs it, never from the current directory (``-P``).
DLFS = [sys.executable, "-P", "-m", "dlfs.cli"]
#: The command a user types: the entry point pip installed beside this interpreter.
DLFS_COMMAND = Path(sys.executable).with_name("dlfs")
TOOLS = Path(__file__).resolve().parent.parent / "tools"


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


def tool(
    *args: str | Path, timeout: float = 300, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run one of ``tools/`` (a path under ``TOOLS``) with this interpreter, in ``cwd`` (a benchmark
    runs outside the checkout); fail on a non-zero exit."""
    return subprocess.run(
        [sys.executable, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
        cwd=cwd,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    """A user error: non-zero exit, one line on stderr, no traceback, and the words that help."""
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
