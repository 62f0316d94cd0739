#!/usr/bin/env python3
"""Build and install pyfuse3 3.5.0 with one small addition: requests without an open.

When ``open``/``opendir``/``flush`` answer ENOSYS, the kernel stops sending them (``no_open``,
``no_opendir``, ``no_flush``) and, by default, keeps file pages (FOPEN_KEEP_CACHE) and directory
listings (FOPEN_CACHE_DIR) in its page cache. That is exactly right for a read-only dataset: an
open costs no round trip to the daemon, and a second ``find`` or ImageFolder scan never reaches it.
Later READ and READDIR requests then carry file handle 0, and stock pyfuse3 passes only the handle
to ``read``/``readdir``; here a zero handle is replaced by the request's inode number.

The module gets ``pyfuse3.dlfs_features`` so dlfs can tell this build from a stock one and fall back
to answering opens when it runs on stock pyfuse3. Each edit asserts its anchor, so a changed
upstream source fails loudly here instead of building something else.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

VERSION = "3.5.0"
LOCAL = "dlfs.2"
FEATURES = ("inode_as_fh_without_open",)

EDITS: list[tuple[str, str, str]] = [
    (
        "src/pyfuse3/__init__.pyx",
        "__version__ = _pyfuse3.__version__\n",
        f"__version__ = _pyfuse3.__version__\ndlfs_features = frozenset({FEATURES!r})\n",
    ),
]

#: READ and READDIRPLUS: substitute the inode for a zero handle (the kernel skipped open).
ZERO_FH_HANDLERS = ("cdef void fuse_read (", "cdef void fuse_readdirplus (")


def _patch(root: Path) -> None:
    for relative, anchor, replacement in EDITS:
        path = root / relative
        text = path.read_text()
        if text.count(anchor) != 1:
            raise SystemExit(f"pyfuse3 {VERSION} source changed: anchor not found once in {relative}")
        path.write_text(text.replace(anchor, replacement))
    handlers = root / "src/pyfuse3/handlers.pxi"
    text = handlers.read_text()
    for header in ZERO_FH_HANDLERS:
        start = text.index(header)
        line = text.index("    c.fh = fi.fh\n", start)
        text = (
            text[:line]
            + "    c.fh = fi.fh if fi.fh != 0 else ino\n"
            + text[line + len("    c.fh = fi.fh\n") :]
        )
    handlers.write_text(text)


def installed_version() -> str:
    probe = "import pyfuse3; print(pyfuse3.__version__)"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False)
    return result.stdout.strip() if result.returncode == 0 else ""


def main() -> None:
    if installed_version() == f"{VERSION}+{LOCAL}":
        return
    work = Path("build/pyfuse3")
    work.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    sdist = work / f"pyfuse3-{VERSION}.tar.gz"
    if not sdist.exists():
        subprocess.run(
            [*pip, "download", f"pyfuse3=={VERSION}", "--no-binary", ":all:", "--no-deps", "-d", str(work)],
            check=True,
        )
    source = work / f"pyfuse3-{VERSION}"
    if source.exists():
        subprocess.run(["rm", "-rf", str(source)], check=True)
    with tarfile.open(sdist) as archive:
        archive.extractall(work, filter="data")
    _patch(source)
    env = {**os.environ, "SETUPTOOLS_SCM_PRETEND_VERSION": f"{VERSION}+{LOCAL}"}
    print(f"building pyfuse3 {VERSION}+{LOCAL} (requests without an open)", flush=True)
    subprocess.run([*pip, "install", "--force-reinstall", "--no-deps", str(source)], check=True, env=env)
    if installed_version() != f"{VERSION}+{LOCAL}":
        raise SystemExit("the patched pyfuse3 did not install; see the pip output above")


if __name__ == "__main__":
    main()
