"""The tools people use today, built from the same source tree and mounted next to dlfs for ``dlfs bench``.

Each peer turns a source tree into one image and serves it over FUSE: dlfs (pack + mount),
squashfuse_ll (a squashfs image, lz4: gzip saves nothing on JPEGs and packs 5x slower) and
ratarmount (a plain tar). Images are built once per work directory and reused while their stamp
names the same source; a peer whose tools are not installed is left out with a warning.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from dlfs.bench.errors import BenchError
from dlfs.bench.roots import Root
from dlfs.core.interpreter import module_command
from dlfs.fuse.mount import mounted_fstype

log = logging.getLogger(__name__)

MOUNT_TIMEOUT = 120.0
#: A template's first word that stands for ``python -m`` run the way dlfs runs its own processes
#: (``dlfs.core.interpreter``).
PYTHON_MODULE = "{python -m}"


@dataclass(frozen=True)
class Peer:
    name: str
    tools: tuple[str, ...]
    build: tuple[str, ...]
    mount: tuple[str, ...]
    image: str

    def command(self, template: tuple[str, ...], src: Path, image: Path, mnt: Path) -> list[str]:
        """The template filled in, its program resolved the way ``available`` found it (this
        interpreter for ``PYTHON_MODULE``)."""
        # Absolute paths: daemons that detach chdir to /, and dlfs bench finds them by their argv.
        paths = {"src": src, "image": image, "mnt": mnt}
        values = {key: os.path.abspath(path) for key, path in paths.items()}
        program, *rest = template
        args = [part.format(**values) for part in rest]
        if program == PYTHON_MODULE:
            return module_command(*args)
        return [_tool_path(program) or program, *args]


PEERS = (
    Peer(
        "dlfs",
        (),
        (PYTHON_MODULE, "dlfs.cli", "-q", "pack", "{src}", "{image}", "--force"),
        (PYTHON_MODULE, "dlfs.cli", "-q", "mount", "{image}", "{mnt}"),
        "dataset",
    ),
    Peer(
        "squashfuse_ll",
        ("mksquashfs", "squashfuse_ll"),
        ("mksquashfs", "{src}", "{image}", "-comp", "lz4", "-noappend", "-quiet", "-no-progress"),
        ("squashfuse_ll", "{image}", "{mnt}"),
        "tree.sqfs",
    ),
    Peer(
        "ratarmount",
        ("tar", "ratarmount"),
        ("tar", "cf", "{image}", "-C", "{src}", "."),
        ("ratarmount", "{image}", "{mnt}"),
        "tree.tar",
    ),
)


def _tool_path(tool: str) -> str | None:
    """Tools on PATH, or installed next to this interpreter (a venv that is not activated)."""
    return shutil.which(tool) or shutil.which(tool, path=os.path.dirname(sys.executable))


def available(peer: Peer) -> bool:
    return all(_tool_path(tool) for tool in peer.tools)


def build(peer: Peer, src: Path, work: Path, rebuild: bool = False) -> tuple[Path, dict[str, float]]:
    """The peer's image of ``src`` under ``work/<name>``: reused when its stamp names ``src``."""
    folder = work / peer.name
    image = folder / peer.image
    stamp = folder / "stamp.json"
    source = os.path.realpath(src)
    if not rebuild and stamp.exists():
        facts = json.loads(stamp.read_text())
        if facts.get("source") == source:
            return image, facts
    unmount(folder / "mnt")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    command = peer.command(peer.build, src, image, folder / "mnt")
    log.info("building the %s image of %s", peer.name, src)
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BenchError(f"building the {peer.name} image failed: {done.stderr.strip()[-300:]}")
    seconds = time.perf_counter() - started
    size = sum(p.stat().st_size for p in image.rglob("*")) if image.is_dir() else image.stat().st_size
    facts = {"source": source, "build_seconds": seconds, "image_bytes": size}
    stamp.write_text(json.dumps(facts))
    return image, facts


def unmount(mnt: Path) -> None:
    """fusermount3 -u, lazily as a last resort."""
    if not mounted_fstype(mnt):
        return
    subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True, check=False)
    if mounted_fstype(mnt):
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True, check=False)


@contextmanager
def mounted(peer: Peer, image: Path, mnt: Path) -> Iterator[Root]:
    """The peer's image mounted at ``mnt`` for the duration; always unmounted on the way out."""
    unmount(mnt)
    mnt.mkdir(parents=True, exist_ok=True)
    command = peer.command(peer.mount, image.parent, image, mnt)
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=MOUNT_TIMEOUT)
    try:
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while not mounted_fstype(mnt):
            if done.returncode != 0 or time.monotonic() > deadline:
                raise BenchError(f"mounting the {peer.name} image failed: {done.stderr.strip()[-300:]}")
            time.sleep(0.1)
        yield Root(peer.name, str(mnt))
    finally:
        unmount(mnt)


@contextmanager
def peer_roots(src: Path, work: Path, rebuild: bool = False) -> Iterator[tuple[list[Root], dict[str, dict]]]:
    """Build and mount every available peer of ``src``; yield (roots, build facts per peer)."""
    if not src.is_dir():
        raise BenchError(f"{src}: the source tree for --peers is not a directory")
    roots, facts = [], {}
    with ExitStack() as stack:
        for peer in PEERS:
            if not available(peer):
                log.warning("%s left out: %s not installed", peer.name, " and ".join(peer.tools))
                continue
            image, facts[peer.name] = build(peer, src, work, rebuild)
            roots.append(stack.enter_context(mounted(peer, image, work / peer.name / "mnt")))
        yield roots, facts
