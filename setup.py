"""Build dlfs's C loops into the package, for ``pip install`` and ``pip wheel`` as for ``make install``,
and say which packages the distribution holds.

The loops are plain shared libraries loaded with ctypes (``dlfs/readahead/_push.so``,
``dlfs/fuse/_dirents.so``, ``dlfs/fuse/_server.so``, ``dlfs/pack/archive/_tarscan.so``), not Python
extension modules: they keep those names, whatever the interpreter, and include no Python header.
This file is the one place that says how each is compiled and linked; the Makefile builds them in
place through it.

A missing prerequisite is named in one line with its Debian package, before any compiler runs.

The packages are every ``dlfs.*`` folder, found, plus ``dlfs.systemd``: the project's top-level
``systemd/`` folder, which a wheel carries as ``dlfs/systemd`` so that ``dlfs install-system`` finds
the unit in any install (``dlfs/system_install.py``).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

#: Warnings are errors: the loops speak the kernel's wire format, where a sloppy cast is a bug.
CFLAGS = ["-O2", "-Wall", "-Wextra", "-Werror"]

#: Header -> the Debian package that provides it.
HEADERS = {"fuse3/fuse_opt.h": "libfuse3-dev", "xxhash.h": "libxxhash-dev", "lz4.h": "liblz4-dev"}


def _pkg_config_cflags(package: str) -> list[str]:
    if shutil.which("pkg-config") is None:
        return []
    result = subprocess.run(["pkg-config", "--cflags", package], capture_output=True, text=True, check=False)
    return shlex.split(result.stdout) if result.returncode == 0 else []


def _has_header(compiler: str | None, header: str) -> bool:
    """Does ``#include <header>`` preprocess with this compiler (without one: is it in /usr/include)?"""
    if compiler is None:
        return Path("/usr/include", header).exists()
    result = subprocess.run(
        [compiler, *_pkg_config_cflags("fuse3"), "-E", "-x", "c", "-"],
        input=f"#include <{header}>\n",
        capture_output=True,
        text=True,
        check=False,
    )
    return result.returncode == 0


def missing_packages() -> list[str]:
    """Debian packages the C loops need and this machine lacks."""
    compiler = shutil.which(shlex.split(os.environ.get("CC", "cc"))[0])
    missing = [] if compiler else ["gcc"]
    missing += [] if shutil.which("pkg-config") else ["pkg-config"]
    return missing + [package for header, package in HEADERS.items() if not _has_header(compiler, header)]


class BuildLoops(build_ext):
    """build_ext for ctypes libraries: checks the prerequisites first and keeps the plain ``.so`` name."""

    def run(self) -> None:
        missing = missing_packages()
        if missing:
            raise SystemExit(
                f"dlfs: cannot build its C loops, missing Debian package(s) {' '.join(missing)}: "
                f"apt-get install {' '.join(missing)}"
            )
        super().run()

    def get_ext_filename(self, fullname: str) -> str:
        return os.path.join(*fullname.split(".")) + ".so"


setup(
    packages=[*find_packages(include=["dlfs", "dlfs.*"]), "dlfs.systemd"],
    package_dir={"dlfs.systemd": "systemd"},
    package_data={"dlfs.systemd": ["*.service"]},
    ext_modules=[
        Extension(
            "dlfs.readahead._push",
            ["dlfs/readahead/_push.c"],
            depends=["dlfs/core/_pagecache.h"],
            libraries=["xxhash", "pthread"],
            extra_compile_args=CFLAGS,
        ),
        Extension(
            "dlfs.pack.archive._tarscan",
            ["dlfs/pack/archive/_tarscan.c"],
            libraries=["xxhash"],
            extra_compile_args=CFLAGS,
        ),
        Extension(
            "dlfs.fuse._dirents",
            ["dlfs/fuse/_dirents.c"],
            depends=["dlfs/fuse/_dirents.h", "dlfs/fuse/_entry.h"],
            extra_compile_args=CFLAGS,
        ),
        # The server's thread loop and its handlers, which encode listings with the same loop, linked in.
        Extension(
            "dlfs.fuse._server",
            ["dlfs/fuse/_server.c", "dlfs/fuse/_handlers.c", "dlfs/fuse/_dirents.c"],
            depends=[
                "dlfs/fuse/_handlers.h",
                "dlfs/fuse/_buffer.h",
                "dlfs/fuse/_dirents.h",
                "dlfs/fuse/_entry.h",
                "dlfs/core/_pagecache.h",
            ],
            libraries=["xxhash", "lz4", "pthread"],
            extra_compile_args=[*CFLAGS, *_pkg_config_cflags("fuse3")],
        ),
    ],
    cmdclass={"build_ext": BuildLoops},
)
