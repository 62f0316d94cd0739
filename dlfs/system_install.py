"""``dlfs install-system``: put this install's command, mount helper and systemd unit where the
system looks for them.

pip installs ``dlfs`` and ``mount.fuse.dlfs`` into a venv's ``bin``, which neither mount(8) (it
runs ``/sbin/mount.fuse.dlfs`` for ``-t fuse.dlfs``) nor a systemd unit (it needs one fixed path)
knows. Links from the fixed places to the venv make fstab lines, ``dlfs@.service`` and a plain
``dlfs`` on PATH work the same whichever way dlfs was installed: ``make install``, a venv from
wheels, pipx. Running it again replaces the links (a newer venv) and changes nothing otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

from dlfs.core.errors import DlfsError

#: Where each piece goes, relative to the root, and what it is.
COMMAND = Path("usr/local/bin/dlfs")
HELPER = Path("sbin/mount.fuse.dlfs")
UNIT = Path("etc/systemd/system/dlfs@.service")
#: One ``<instance>.conf`` per mount of ``dlfs@<instance>``.
CONFIG_DIR = Path("etc/dlfs")


def unit_text() -> str:
    """The systemd template unit shipped in the package (``dlfs/systemd/dlfs@.service``)."""
    return resources.files("dlfs").joinpath("systemd", "dlfs@.service").read_text()


def _link(path: Path, target: Path) -> str | None:
    """Make ``path`` a symlink to ``target``; what changed, or None. A file that is not a link is
    someone else's: left alone, with an error."""
    if path.is_symlink():
        if Path(os.readlink(path)) == target:
            return None
        path.unlink()
    elif path.exists():
        raise DlfsError(f"{path} exists and is not a link; remove it to let dlfs install-system link it")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)
    return f"linked {path} -> {target}"


def install(root: Path = Path("/"), bin_dir: Path | None = None) -> list[str]:
    """Link the command and the mount helper of ``bin_dir`` (default: this interpreter's venv) under
    ``root``, write the unit and create the configuration directory; a line for each change."""
    bin_dir = bin_dir or Path(sys.executable).parent
    for program in ("dlfs", "mount.fuse.dlfs"):
        if not (bin_dir / program).exists():
            raise DlfsError(f"{bin_dir / program} is missing; run this from an installed dlfs (pip install)")
    existing = next(path for path in (root, *root.parents) if path.exists())
    if not os.access(existing, os.W_OK):
        raise DlfsError(f"cannot write under {existing}: dlfs install-system needs root")
    try:
        return _install(root, bin_dir.absolute())
    except PermissionError as exc:
        raise DlfsError(f"cannot write {exc.filename}: dlfs install-system needs root") from exc


def _install(root: Path, bin_dir: Path) -> list[str]:
    changes = [_link(root / COMMAND, bin_dir / "dlfs"), _link(root / HELPER, bin_dir / "mount.fuse.dlfs")]
    unit = root / UNIT
    if not unit.exists() or unit.read_text() != unit_text():
        unit.parent.mkdir(parents=True, exist_ok=True)
        unit.write_text(unit_text())
        changes.append(f"wrote {unit}")
        if root == Path("/") and Path("/run/systemd/system").is_dir():  # systemd is running
            subprocess.run(["systemctl", "daemon-reload"], check=False)
    config = root / CONFIG_DIR
    if not config.is_dir():
        config.mkdir(parents=True)
        changes.append(f"created {config} (one <instance>.conf per dlfs@<instance>)")
    return [change for change in changes if change]
