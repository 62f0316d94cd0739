#!/usr/bin/env python3
"""Build and install pyfuse3 3.5.0 with five additions for a read-only dataset: ``3.5.0+dlfs.7``.

This docstring is the one place that says what each patch does and why; README.md and
docs/design.md (which also says which ones could go upstream) point here.

1. ``inode_as_fh_without_open``: requests without an open. When ``open``/``opendir`` answer
   ENOSYS, the kernel stops sending OPEN, OPENDIR, FLUSH, RELEASE and RELEASEDIR (``no_open``,
   ``no_opendir``) and by default keeps file pages (FOPEN_KEEP_CACHE) and directory listings
   (FOPEN_CACHE_DIR) in its page cache: an open costs no round trip, and a second ``find`` or
   ImageFolder scan never reaches the daemon. READ and READDIR then carry file handle 0, and stock
   pyfuse3 passes only the handle to ``read``/``readdir``; here a zero handle is replaced by the
   request's inode number (the handle dlfs would have returned anyway).
2. ``readdir_plus_auto``: plain READDIR beside READDIRPLUS, when the ``Operations`` object sets
   ``readdirplus_auto`` (kernel READDIRPLUS_AUTO). Stock pyfuse3 clears READDIRPLUS_AUTO and
   registers no READDIR handler, so every listing makes the kernel build a dentry and an inode for
   every entry. With AUTO the kernel asks for attributes only for the first request of a listing
   and when a program also stats the entries (``ls -l``); a cold ImageFolder scan of 1.28 M files
   is then level with the native tree instead of 2.7x its time. ``ReaddirToken.plus`` tells the
   handler which of the two it answers, and ``readdir_reply`` encodes the matching record.
3. ``readdir_reply_raw(token, records)``: append directory records the caller encoded itself
   (``dlfs/fuse/dirents.py`` and its C loop ``dlfs/fuse/_dirents.c`` encode a whole run of entries
   at once) instead of one ``readdir_reply`` call and one ``EntryAttributes`` per entry, 5-15 us per
   entry in Python against 0.03-0.08 us; ``ReaddirToken.size`` (the room left in the reply) becomes
   readable so the caller knows how many fit.
4. ``dev_fuse_fd()``: the mounted session's ``/dev/fuse`` descriptor, so that the read-ahead's C
   loop (``dlfs/readahead/_push.c``) writes FUSE_NOTIFY_STORE messages itself, many files per call
   without the GIL (a warm epoch with 8 readers: 19.5k files/s against 13.3k with the loop in
   Python, which pushes through ``pyfuse3.notify_store``).
5. ``custom_io(io, fd)``: libfuse's ``fuse_session_custom_io`` for the mounted session, so that
   the native request server (``dlfs/fuse/_server.c``) reads every request from ``/dev/fuse``
   itself, on several threads, answers the hot ones in C and hands pyfuse3 only the rest: libfuse
   then reads requests and writes replies through ``io``, and the main loop waits on ``fd``.
   ``dev_fuse_fd()`` still gives the device.

The module gets ``pyfuse3.dlfs_features`` (the five names above) so that dlfs can tell this build
from a stock one: on stock pyfuse3 every path still works, slower, and the mount's log names what
is missing (``dlfs/fuse/features.py``). The version to build is read from the ``pyfuse3==`` pin of
pyproject.toml's ``mount`` extra, whose local tag (``+dlfs.N``) no index carries: a plain
``pip install 'dlfs-data[mount]'`` fails instead of running on stock pyfuse3, while ``make install``
runs this script first and then finds the pin satisfied. Change a patch: bump the tag in the pin.
Each edit asserts its anchor, so a changed upstream source fails loudly here instead of building
something else.

Run by the Python it installs into (``VENV/bin/python tools/build_pyfuse3.py``): it builds a wheel
once into ``build/pyfuse3/dist`` and installs that, so a second venv on the machine reuses it.
``--wheel-dir DIR`` only puts the wheel in ``DIR``, beside dlfs's own for nodes that install both
with ``pip install --find-links DIR`` and have no compiler (README, *Operations*). ``--source-dir
DIR`` puts the patched source in ``DIR`` instead, as ``pyfuse3-X.Y.Z+dlfs.N.tar.gz``, for nodes that
compile it themselves (``make node-bundle``). What the build needs and the machine lacks is said in
one line naming the Debian packages, before pip starts.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
#: Where the sdist is patched and the wheel built, beside the project (not the current directory).
WORK = PYPROJECT.parent / "build" / "pyfuse3"


def pinned_version() -> tuple[str, str]:
    """(upstream version, local tag) of the mount extra's ``pyfuse3==X.Y.Z+dlfs.N``: the one place
    the build's version is written, so that the wheel built here is the one the package requires."""
    for requirement in tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]["mount"]:
        match = re.fullmatch(r"pyfuse3\s*==\s*(\d+\.\d+\.\d+)\+(dlfs\.\d+)", requirement.strip())
        if match:
            return match[1], match[2]
    raise SystemExit(f"{PYPROJECT}: no 'pyfuse3==X.Y.Z+dlfs.N' in the mount extra to build")


VERSION, LOCAL = pinned_version()
FEATURES = ("inode_as_fh_without_open", "readdir_plus_auto", "readdir_reply_raw", "dev_fuse_fd", "custom_io")

EDITS: list[tuple[str, str, str]] = [
    (
        "src/pyfuse3/__init__.pyx",
        "__version__ = _pyfuse3.__version__\n",
        f"__version__ = _pyfuse3.__version__\ndlfs_features = frozenset({FEATURES!r})\n",
    ),
    (
        "src/pyfuse3/handlers.pxi",
        "    c.fh = fi.fh\n    save_retval(fuse_read_async(c))\n",
        "    c.fh = fi.fh if fi.fh != 0 else ino\n    save_retval(fuse_read_async(c))\n",
    ),
    (
        "src/pyfuse3/handlers.pxi",
        "    conn.want &= ~(<unsigned> FUSE_CAP_READDIRPLUS_AUTO)\n",
        "    if getattr(operations, 'readdirplus_auto', False):\n"
        "        conn.want |= FUSE_CAP_READDIRPLUS_AUTO\n"
        "    else:\n"
        "        conn.want &= ~(<unsigned> FUSE_CAP_READDIRPLUS_AUTO)\n",
    ),
    (
        "src/pyfuse3/handlers.pxi",
        "cdef class ReaddirToken:\n    cdef fuse_req_t req\n",
        "cdef class ReaddirToken:\n    cdef fuse_req_t req\n    cdef readonly bint plus\n",
    ),
    (
        "src/pyfuse3/handlers.pxi",
        "    c.fh = fi.fh\n    save_retval(fuse_readdirplus_async(c))\n",
        "    c.fh = fi.fh if fi.fh != 0 else ino\n    c.flags = 1\n"
        "    save_retval(fuse_readdirplus_async(c))\n\n"
        "cdef void fuse_readdir (fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,\n"
        "                        fuse_file_info *fi):\n"
        "    global py_retval\n    cdef _Container c = _Container()\n    c.req = req\n    c.size = size\n"
        "    c.off = off\n    c.fh = fi.fh if fi.fh != 0 else ino\n    c.flags = 0\n"
        "    save_retval(fuse_readdirplus_async(c))\n",
    ),
    (
        "src/pyfuse3/handlers.pxi",
        "    token.req = c.req\n\n    try:\n        await operations.readdir(",
        "    token.req = c.req\n    token.plus = c.flags\n\n    try:\n        await operations.readdir(",
    ),
    (
        "src/pyfuse3/handlers.pxi",
        "    cdef char *buf\n    cdef size_t size\n",
        "    cdef char *buf\n    cdef readonly size_t size\n",
    ),
    (
        "src/pyfuse3/__init__.pyx",
        "def readdir_reply(ReaddirToken token, name, EntryAttributes attr, off_t next_id):\n",
        "def readdir_reply_raw(ReaddirToken token, records):\n"
        "    # Append encoded fuse_dirent/fuse_direntplus records (any contiguous buffer); False\n"
        "    # (nothing added) if they do not fit in the room left, token.size.\n"
        "    cdef Py_buffer pybuf\n"
        "    PyObject_GetBuffer(records, &pybuf, PyBUF_CONTIG_RO)\n"
        "    cdef size_t n = <size_t> pybuf.len\n"
        "    try:\n"
        "        if n > token.size:\n            return False\n"
        "        if token.buf_start == NULL:\n"
        "            token.buf_start = <char*> calloc_or_raise(token.size, sizeof(char))\n"
        "            token.buf = token.buf_start\n"
        "        string.memcpy(token.buf, pybuf.buf, n)\n"
        "        token.size -= n\n        token.buf = &token.buf[n]\n        return True\n"
        "    finally:\n        PyBuffer_Release(&pybuf)\n\n"
        "def readdir_reply(ReaddirToken token, name, EntryAttributes attr, off_t next_id):\n",
    ),
    (
        "src/pyfuse3/__init__.pyx",
        "def notify_store(inode, offset, data):\n",
        "cdef int device_fd = -1\n\n"
        "def dev_fuse_fd():\n"
        "    # The mounted session's /dev/fuse descriptor, for notifications sent without libfuse.\n"
        "    return device_fd if device_fd >= 0 else session_fd\n\n"
        "cdef extern from '<fuse_lowlevel.h>' nogil:\n"
        "    int fuse_session_custom_io(fuse_session *se, const void *io, int fd)\n\n"
        "def custom_io(size_t io, int fd):\n"
        "    # Requests are read and replies written through io (a struct fuse_custom_io); the\n"
        "    # main loop waits for fd to become readable. Call after init, before main.\n"
        "    global session_fd, device_fd\n"
        "    if fuse_session_custom_io(session, <const void*> io, fd) != 0:\n"
        "        raise RuntimeError('fuse_session_custom_io failed')\n"
        "    device_fd = session_fd\n"
        "    session_fd = fd\n\n"
        "def notify_store(inode, offset, data):\n",
    ),
    (
        "src/pyfuse3/internal.pxi",
        "    fuse_ops.readdirplus = fuse_readdirplus\n",
        "    fuse_ops.readdirplus = fuse_readdirplus\n    fuse_ops.readdir = fuse_readdir\n",
    ),
    (
        "src/pyfuse3/__init__.pyx",
        "    len_ = fuse_add_direntry_plus(token.req, token.buf, token.size,\n"
        "                                  cname, &attr.fuse_param, next_id)\n",
        "    if token.plus:\n        len_ = fuse_add_direntry_plus(token.req, token.buf, token.size,\n"
        "                                      cname, &attr.fuse_param, next_id)\n    else:\n"
        "        len_ = fuse_add_direntry(token.req, token.buf, token.size, cname, attr.attr, next_id)\n",
    ),
]


def _patch(root: Path) -> None:
    for relative, anchor, replacement in EDITS:
        path = root / relative
        text = path.read_text()
        if text.count(anchor) != 1:
            raise SystemExit(f"pyfuse3 {VERSION} source changed: anchor not found once in {relative}")
        path.write_text(text.replace(anchor, replacement))


def installed_version() -> str:
    probe = "import pyfuse3; print(pyfuse3.__version__)"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False)
    return result.stdout.strip() if result.returncode == 0 else ""


def missing_packages() -> list[str]:
    """Debian packages that building pyfuse3 needs and this machine lacks: a compiler, libfuse3's
    headers (found through pkg-config) and the headers of the Python that runs this script."""
    missing = [] if shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") else ["gcc"]
    if shutil.which("pkg-config") is None:
        missing += ["pkg-config", "libfuse3-dev"]
    elif subprocess.run(["pkg-config", "--exists", "fuse3"], check=False).returncode != 0:
        missing.append("libfuse3-dev")
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        missing.append("python3-dev")
    return missing


def patched_source() -> Path:
    """Download pyfuse3's source (once) and unpack it, patched, into ``WORK``; its directory."""
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    sdist = WORK / f"pyfuse3-{VERSION}.tar.gz"
    if not sdist.exists():
        subprocess.run(
            [*pip, "download", f"pyfuse3=={VERSION}", "--no-binary", ":all:", "--no-deps", "-d", str(WORK)],
            check=True,
        )
    source = WORK / f"pyfuse3-{VERSION}"
    if source.exists():
        shutil.rmtree(source)
    with tarfile.open(sdist) as archive:
        archive.extractall(WORK, filter="data")
    _patch(source)
    return source


def write_source(out: Path) -> Path:
    """The patched source as an sdist-like archive in ``out``, named after the build's version: a node
    builds it with ``SETUPTOOLS_SCM_PRETEND_VERSION`` set to that version."""
    out.mkdir(parents=True, exist_ok=True)
    name = f"pyfuse3-{VERSION}+{LOCAL}"
    with tarfile.open(out / f"{name}.tar.gz", "w:gz") as archive:
        archive.add(patched_source(), arcname=name)
    return out / f"{name}.tar.gz"


def build_wheel(dist: Path) -> None:
    """Patch pyfuse3's source and build its wheel into ``dist``."""
    missing = missing_packages()
    if missing:
        raise SystemExit(
            f"cannot build pyfuse3 {VERSION}+{LOCAL}: missing Debian package(s) {' '.join(missing)} "
            f"(apt-get install {' '.join(missing)})"
        )
    source = patched_source()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    env = {**os.environ, "SETUPTOOLS_SCM_PRETEND_VERSION": f"{VERSION}+{LOCAL}"}
    print(f"building pyfuse3 {VERSION}+{LOCAL} ({', '.join(FEATURES)})", flush=True)
    subprocess.run([*pip, "wheel", "--no-deps", "--wheel-dir", str(dist), str(source)], check=True, env=env)


def install_from(dist: Path, quiet: bool = True) -> bool:
    """Install the pinned build from the wheels in ``dist`` (its dependencies from the index as
    usual); False when none there fits this Python (pip's own words on stderr unless ``quiet``)."""
    command = [
        sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet", "install",
        "--find-links", str(dist), f"pyfuse3=={VERSION}+{LOCAL}",
    ]  # fmt: skip
    return subprocess.run(command, capture_output=quiet, check=False).returncode == 0


def wheel_in(dist: Path) -> Path | None:
    """The pinned build's wheel for this Python in ``dist``, if one is there."""
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    found = sorted(dist.glob(f"pyfuse3-{VERSION}+{LOCAL}-{tag}-*.whl"))
    return found[-1] if found else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build and install dlfs's pyfuse3 build.")
    parser.add_argument("--wheel-dir", type=Path, help="only build the wheel, into this directory")
    parser.add_argument("--source-dir", type=Path, help="only write the patched source, into this directory")
    args = parser.parse_args(argv)
    dist = WORK / "dist"
    if args.source_dir is not None:
        write_source(args.source_dir)
        return
    if args.wheel_dir is not None:
        if wheel_in(dist) is None:
            build_wheel(dist)
        args.wheel_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(wheel_in(dist), args.wheel_dir)  # type: ignore[arg-type]
        return
    if installed_version() == f"{VERSION}+{LOCAL}":
        return
    if not install_from(dist):
        build_wheel(dist)
        if not install_from(dist, quiet=False):
            raise SystemExit("the patched pyfuse3 built but does not install; see the pip output above")
    if installed_version() != f"{VERSION}+{LOCAL}":
        raise SystemExit("the patched pyfuse3 did not install; see the pip output above")


if __name__ == "__main__":
    main()
