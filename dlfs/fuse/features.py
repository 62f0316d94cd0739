"""Which additions of dlfs's pyfuse3 build this process runs on, said once in the mount's log.

dlfs runs on a stock pyfuse3 too, but each missing addition silently moves one path onto a slower
route (``tools/build_pyfuse3.py`` says what each one patches). A mount that is slow for that reason
should say so at start, in one place, instead of leaving it to be found in a profile.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

#: Each addition of the build, and what a mount does without it (docs/design.md has the figures
#: that decided each addition).
CONSEQUENCES: dict[str, str] = {
    "inode_as_fh_without_open": (
        "open/opendir are answered with a handle, so the kernel sends OPEN, FLUSH and RELEASE for "
        "every file and OPENDIR/RELEASEDIR for every folder, and keeps no directory listing cached "
        "(a second scan reaches the daemon again)"
    ),
    "readdir_plus_auto": (
        "every listing is READDIRPLUS, whatever --readdirplus says: a scan or find makes the kernel "
        "build an inode per file (a cold ImageFolder scan takes several times native's time)"
    ),
    "readdir_reply_raw": (
        "directory replies are built one readdir_reply call and one EntryAttributes per entry "
        "(Python's cost per entry, hundreds of times the C encoder's)"
    ),
    "custom_io": (
        "every request is answered by pyfuse3's one Python thread instead of the native request "
        "server's C threads (an unmodified loader with shuffle=True: a LOOKUP, an IOCTL and a READ "
        "per image, each a trip through the Python loop)"
    ),
    "dev_fuse_fd": (
        "the read-ahead reads, checks and pushes every file in Python instead of its C loop "
        "(fewer files/s, more daemon CPU per file)"
    ),
}


#: What a mount loses when one of its C paths cannot run: the second half of the line ``dlfs mount``
#: prints (docs/design.md has the measured cost of each).
SLOWER_WITHOUT = {
    "request server": "Python answers every request on one thread instead of the C threads, several "
    "times slower for shuffled reads",
    "read-ahead loop": "the read-ahead reads, checks and pushes every file in Python, with more daemon "
    "CPU per file",
}


def readahead_loop_missing() -> str | None:
    """Why the read-ahead's C loop cannot run in this process, or None when it can."""
    from dlfs.readahead import native

    if not native.LIBRARY.exists():
        return f"{native.LIBRARY.name} is not built (make install builds it)"
    if "dev_fuse_fd" not in installed_features():
        return "pyfuse3 lacks dev_fuse_fd (tools/build_pyfuse3.py builds it)"
    return None


def unavailable(path: str, reason: str) -> str:
    """The line a mount prints on the terminal when its C ``path`` (a key of ``SLOWER_WITHOUT``) is
    unavailable: what, why, and what it costs."""
    return f"the native {path} is unavailable ({reason}): {SLOWER_WITHOUT[path]}"


def installed_features() -> frozenset[str]:
    """``pyfuse3.dlfs_features`` of the imported pyfuse3: empty on a stock build."""
    import pyfuse3

    return frozenset(getattr(pyfuse3, "dlfs_features", ()))


def describe(features: Iterable[str]) -> list[str]:
    """The log lines for ``features``: one summary line, then one line per missing addition."""
    found = frozenset(features)
    missing = [name for name in CONSEQUENCES if name not in found]
    present = sorted(found & CONSEQUENCES.keys())
    if not missing:
        return [f"pyfuse3 has every dlfs addition: {', '.join(present)}"]
    lines = [
        f"pyfuse3 lacks {len(missing)} of {len(CONSEQUENCES)} dlfs additions "
        f"(found: {', '.join(present) or 'none'}); run tools/build_pyfuse3.py (make install) for them"
    ]
    lines += [f"without {name}: {CONSEQUENCES[name]}" for name in missing]
    return lines


def log_pyfuse3_features(log: logging.Logger, features: Iterable[str] | None = None) -> None:
    """Log, once at mount, what ``features`` (default: the imported pyfuse3's) hold: INFO when all
    are there, a WARNING per missing one naming the path it slows, since that mount works, slower."""
    lines = describe(installed_features() if features is None else features)
    if len(lines) == 1 and lines[0].startswith("pyfuse3 has every"):
        log.info(lines[0])
        return
    for line in lines:
        log.warning(line)


def native_loops() -> str:
    """One line on the C loops, which pip or make builds beside the Python modules: each one that
    is missing leaves its work to Python, slower, with nothing else to tell it apart."""
    try:  # the FUSE side's modules need pyfuse3, whose absence ``dlfs --version`` names before this
        from dlfs.fuse import dirents, server
        from dlfs.readahead import native
    except ImportError as exc:
        return f"C loops: not checked ({exc})"

    loops = {"read-ahead": native.LIBRARY, "listings": dirents.LIBRARY, "request server": server.LIBRARY}
    missing = [f"{name} ({path.name})" for name, path in loops.items() if not path.exists()]
    if missing:
        return f"C loops not built: {', '.join(missing)}; Python does their work, slower (pip builds them)"
    return f"C loops built: {', '.join(loops)}"
