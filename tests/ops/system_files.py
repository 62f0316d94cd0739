"""The system's own files that ``dlfs install-system`` writes (the command's link, the mount helper,
the unit, the configuration folder): saved before a test installs them and put back after, so that
a test run leaves the machine's system links as it found them."""

from __future__ import annotations

import os
from pathlib import Path

#: What stood at a path: ("link", target), ("file", bytes), ("dir", None) or ("absent", None).
State = tuple[str, str | bytes | None]


def saved(path: Path) -> State:
    """What stands at ``path`` now."""
    if path.is_symlink():
        return "link", os.readlink(path)
    if path.is_file():
        return "file", path.read_bytes()
    return ("dir", None) if path.is_dir() else ("absent", None)


def restore(path: Path, state: State) -> None:
    """Put back at ``path`` what ``saved`` found there; a configuration folder the install made is
    removed only while empty (someone may have written into it)."""
    kind, value = state
    if kind == "dir" or (kind == "absent" and not os.path.lexists(path)):
        return
    if path.is_dir() and not path.is_symlink():
        if not any(path.iterdir()):
            path.rmdir()
        return
    path.unlink(missing_ok=True)
    if kind == "link":
        path.symlink_to(str(value))
    elif kind == "file":
        path.write_bytes(value)  # type: ignore[arg-type]
