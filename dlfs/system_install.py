"""``dlfs install-system``: put this install's command, mount helper and systemd unit where the
system looks for them.

pip installs ``dlfs`` and ``mount.fuse.dlfs`` into a venv's ``bin``, which neither mount(8) (it
runs ``/sbin/mount.fuse.dlfs`` for ``-t fuse.dlfs``) nor a systemd unit (it needs one fixed path)
knows. Links from the fixed places to the venv make fstab lines, ``dlfs@.service`` and a plain
``dlfs`` on PATH work the same whichever way dlfs was installed: a checkout's venv, a venv from
wheels or from the node bundle, pipx. Nothing runs it unasked. Running it again replaces the links
(a newer venv) and changes nothing otherwise; with ``keep_links`` (``make install-system``) a link to
another install that still exists is left as it is, so testing a checkout on a node does not take
its dlfs away from a production venv.

The unit goes where packages put theirs (``/usr/local/lib/systemd/system``), so an administrator's
copy or drop-in under ``/etc/systemd/system`` overrides it, and only a unit dlfs wrote (its first
line) is ever replaced: a symlink or a file of someone else's there is refused.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from dlfs.core.errors import DlfsError

#: Where each piece goes, relative to the root, and what it is.
COMMAND = Path("usr/local/bin/dlfs")
HELPER = Path("sbin/mount.fuse.dlfs")
UNIT = Path("usr/local/lib/systemd/system/dlfs@.service")
#: One ``<instance>.conf`` per mount of ``dlfs@<instance>``.
CONFIG_DIR = Path("etc/dlfs")


def unit_text() -> str:
    """The systemd template unit, written once in the project's ``systemd/`` folder: a wheel carries
    it as ``dlfs/systemd`` (setup.py), a checkout (``pip install -e``) reads the folder itself."""
    package = Path(__file__).parent
    for folder in (package / "systemd", package.parent / "systemd"):
        if (folder / UNIT.name).is_file():
            return (folder / UNIT.name).read_text()
    raise DlfsError(f"{UNIT.name} is missing from this install of dlfs ({package}); reinstall dlfs")


def _link(path: Path, target: Path, keep_links: bool) -> str | None:
    """Make ``path`` a symlink to ``target``; what changed, or None. A file that is not a link is
    someone else's: left alone, with an error."""
    if path.is_symlink():
        current = Path(os.readlink(path))
        if current == target:
            return None
        if keep_links and path.exists():
            return f"left {path} -> {current} (another install; dlfs install-system points it here)"
        path.unlink()
    elif path.exists():
        raise DlfsError(f"{path} exists and is not a link; remove it to let dlfs install-system link it")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)
    return f"linked {path} -> {target}"


def install(root: Path = Path("/"), bin_dir: Path | None = None, keep_links: bool = False) -> list[str]:
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
        return _install(root, bin_dir.absolute(), keep_links)
    except PermissionError as exc:
        raise DlfsError(f"cannot write {exc.filename}: dlfs install-system needs root") from exc
    except OSError as exc:
        raise DlfsError(f"cannot install under {root}: {exc.strerror} ({exc.filename})") from exc


def _write_unit(unit: Path) -> str | None:
    """Write the unit if it differs; refuse to touch one dlfs did not write."""
    text = unit_text()
    if unit.is_symlink():
        raise DlfsError(f"{unit} is a symlink; remove it to let dlfs install-system write the unit")
    if unit.exists():
        current = unit.read_text(errors="replace")
        if current == text:
            return None
        if current.partition("\n")[0] != text.partition("\n")[0]:
            raise DlfsError(f"{unit} was not written by dlfs; remove it to let dlfs install-system write it")
    unit.parent.mkdir(parents=True, exist_ok=True)
    partial = unit.with_name(f".{unit.name}.{os.getpid()}")
    partial.write_text(text)
    partial.replace(unit)
    return f"wrote {unit}"


def _install(root: Path, bin_dir: Path, keep_links: bool) -> list[str]:
    changes = [
        _link(root / COMMAND, bin_dir / "dlfs", keep_links),
        _link(root / HELPER, bin_dir / "mount.fuse.dlfs", keep_links),
    ]
    unit = root / UNIT
    wrote = _write_unit(unit)
    if wrote:
        changes.append(wrote)
        systemctl = shutil.which("systemctl")
        if root == Path("/") and systemctl and Path("/run/systemd/system").is_dir():  # systemd is running
            subprocess.run([systemctl, "daemon-reload"], check=False)
    config = root / CONFIG_DIR
    if not config.is_dir():
        config.mkdir(parents=True)
        changes.append(f"created {config} (one <instance>.conf per dlfs@<instance>)")
    return [change for change in changes if change]
