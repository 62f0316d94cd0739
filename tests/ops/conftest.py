"""Fixtures of the operations tests: the system's own places, installed for real."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from commands import DLFS
from system_files import restore, saved

from dlfs import system_install


@pytest.fixture(scope="session")
def system_links() -> Iterator[Path]:
    """``dlfs install-system`` for real: mount(8) looks for the helper in /sbin only, and the unit runs
    ``/usr/local/bin/dlfs``. Linked to this interpreter's venv for the tests that need it, then put
    back as it was: nothing else installs system links unless asked (``make install-system``)."""
    paths = [Path("/") / p for p in (system_install.COMMAND, system_install.HELPER, system_install.UNIT)]
    paths.append(Path("/") / system_install.CONFIG_DIR)
    before = {path: saved(path) for path in paths}
    try:
        subprocess.run([*DLFS, "-q", "install-system"], check=True, timeout=60)
        yield Path("/")
    finally:
        for path, state in before.items():
            restore(path, state)
