#!/usr/bin/env python3
"""``make node-bundle``: everything a bare x86-64 Debian node needs to install dlfs with no network.

An air-gapped cluster node (or a lent GPU machine) has a compiler and a Python, often with PyTorch
already, and nothing else dlfs needs. The bundle, ``dist/node/``, holds:

- ``debs/``: the Debian packages dlfs builds and runs with (FUSE 3 and its headers, pkg-config,
  xxhash's and lz4's headers, squashfuse for the comparisons) and those they depend on, less what
  every Debian system has (priority required or important), fetched with ``apt-get download``.
  They are this machine's release's packages.
- ``wheels/``: binary wheels, for each Python of ``PYTHONS``, of what dlfs needs at run time with
  its ``mount`` extra and of what its build and pyfuse3's build need (setuptools, setuptools_scm,
  Cython). The ``s3``, ``torch`` and ``bench`` extras are left out: PyTorch is on a training node
  already, and the rest would pass the size limit.
- ``src/``: dlfs's sdist and the patched pyfuse3 source (``tools/build_pyfuse3.py``), which the
  node compiles with its own compiler.
- ``install.sh VENV`` (``tools/node-install.sh``), run there as root.

The downloads are kept while the requirements they were made for stay the same (``.requirements``),
so only ``src/`` is made again each run; ``make test`` runs the bundle's install with no network.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import build_pyfuse3  # noqa: E402

#: The Debian packages named; what they depend on comes with them.
DEBS = ("fuse3", "libfuse3-dev", "pkg-config", "libxxhash-dev", "liblz4-dev", "squashfuse")
PYTHONS = ("3.11", "3.12")
LIMIT_MIB = 60


def requirements() -> list[str]:
    """dlfs's run-time requirements with the mount extra (the patched pyfuse3 is built on the node)
    and the build requirements of dlfs and of pyfuse3."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    runtime = project["project"]["dependencies"] + project["project"]["optional-dependencies"]["mount"]
    source = build_pyfuse3.patched_source()
    pyfuse3_build = tomllib.loads((source / "pyproject.toml").read_text())["build-system"]["requires"]
    wanted = [r for r in runtime if not r.startswith("pyfuse3")]
    return sorted({*wanted, *project["build-system"]["requires"], *pyfuse3_build})


def _closure(packages: list[str]) -> set[str]:
    """``packages`` and every package they depend on, each alternative included."""
    kinds = ("recommends", "suggests", "conflicts", "breaks", "replaces", "enhances")
    flags = [f"--no-{kind}" for kind in kinds]
    listing = subprocess.run(
        ["apt-cache", "depends", "--recurse", *flags, *packages], capture_output=True, text=True, check=True
    ).stdout
    names = {line.split(":", 1)[-1].strip() for line in listing.splitlines()}
    return {name for name in names if name and not name.startswith("<")}


def deb_closure() -> list[str]:
    """``DEBS`` and what they depend on, less the base system every Debian node has: the packages of
    priority required or important, the essential ones, and what those depend on."""
    installed = subprocess.run(
        ["dpkg-query", "--show", "--showformat", "${Package} ${Priority} ${Essential}\n"],
        capture_output=True, text=True, check=True,
    ).stdout.split("\n")  # fmt: skip
    base = [f[0] for f in map(str.split, installed) if len(f) > 1 and ("required" in f or "important" in f)]
    base += [f[0] for f in map(str.split, installed) if f[-1:] == ["yes"]]
    return sorted(_closure(list(DEBS)) - _closure(base))


def download(out: Path, wanted: list[str], debs: list[str]) -> None:
    for folder in ("wheels", "debs"):
        shutil.rmtree(out / folder, ignore_errors=True)
        (out / folder).mkdir(parents=True)
    subprocess.run(["apt-get", "download", "-q", *debs], cwd=out / "debs", check=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet", "download"]
    for python in PYTHONS:
        subprocess.run(
            [*pip, "--only-binary", ":all:", "--python-version", python, "--dest", out / "wheels", *wanted],
            check=True,
        )


def sources(out: Path) -> None:
    src = out / "src"
    shutil.rmtree(src, ignore_errors=True)
    build_pyfuse3.write_source(src)
    sdist = "import sys; from setuptools import build_meta; build_meta.build_sdist(sys.argv[1])"
    subprocess.run([sys.executable, "-c", sdist, src], cwd=ROOT, check=True, capture_output=True)
    shutil.copy2(ROOT / "tools" / "node-install.sh", out / "install.sh")


def size_mib(out: Path) -> float:
    return sum(path.stat().st_size for path in out.rglob("*") if path.is_file()) / 2**20


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Make the offline install bundle for bare Debian nodes.")
    parser.add_argument("--out", type=Path, default=ROOT / "dist" / "node")
    args = parser.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["apt-cache", "show", *DEBS], capture_output=True, check=False).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], check=True)  # a machine whose package lists were cleaned
    wanted, debs = requirements(), deb_closure()
    stamp = "\n".join([*wanted, *debs, *PYTHONS]) + "\n"
    if (out / ".requirements").exists() and (out / ".requirements").read_text() == stamp:
        print(f"{out}: wheels and debs kept (same requirements)")
    else:
        (out / ".requirements").unlink(missing_ok=True)
        download(out, wanted, debs)
        (out / ".requirements").write_text(stamp)
    sources(out)
    size = size_mib(out)
    print(f"{out}: {size:.1f} MiB (limit {LIMIT_MIB} MiB); install on a node: {out.name}/install.sh VENV")
    if size > LIMIT_MIB:
        raise SystemExit(f"{out} is {size:.1f} MiB, over the {LIMIT_MIB} MiB a node bundle may take")


if __name__ == "__main__":
    main()
