"""Other users and their code: the ordinary user the tests run commands as, and code planted where
a careless process running as root would import it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

#: The ordinary user the tests run commands as (the ``ordinary_user`` fixture makes it).
ORDINARY_USER = "dlfs-test"
#: Where code planted in a directory would import from (``plant``).
PLANTED = ("dlfs.py", "dlfs/__init__.py")


def as_user(
    *args: str | os.PathLike[str], check: bool = True, cwd: Path = Path("/")
) -> subprocess.CompletedProcess[str]:
    """Run a command as ``ORDINARY_USER`` from ``cwd``; with ``check``, fail with its stderr."""
    command = ["runuser", "-u", ORDINARY_USER, "--", *map(str, args)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=cwd, check=False)
    if check:
        assert result.returncode == 0, f"{' '.join(command)}: {result.stderr}"
    return result


def plant(directory: Path, where: str) -> Path:
    """Code that a careless process would import from ``directory`` (``where``: one of ``PLANTED``):
    importing it writes the returned marker file, which the tests then expect never to appear."""
    marker = directory / "PLANTED-CODE-RAN"
    module = directory / where
    module.parent.mkdir(parents=True, exist_ok=True)
    module.write_text(f"import os\nopen({str(marker)!r}, 'w').write(str(os.getuid()))\n")
    return marker
