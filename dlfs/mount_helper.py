"""``mount.fuse.dlfs``: ``mount -t fuse.dlfs DATASET MNT -o OPTIONS`` and /etc/fstab lines.

mount(8) runs ``/sbin/mount.fuse.dlfs DATASET MNT [-sfnv] [-o OPTIONS]`` for the type ``fuse.dlfs``
(``dlfs install-system`` puts this program there), with ``rw`` added and ``defaults`` and ``x-*``
removed. Each ``-o`` option is a ``dlfs mount`` flag with ``_`` for ``-``: ``seed=1`` is ``--seed 1``,
``allow_other`` is ``--allow-other``. The flags are read from ``dlfs mount``'s own parser, so a new
flag is an option here too. The mount is background ``dlfs mount``: mount(8) returns once it is live.

fuse3's own ``mount.fuse3`` would run a program named after the subtype as ``dlfs DATASET MNT -o
OPTIONS``, which is not dlfs's command line; a helper of our own maps the options and says in one
line which one it does not know.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from dlfs import cli

#: Options mount(8) and fstab add that mean nothing more to a read-only FUSE mount: dlfs is read-only
#: whatever rw says, FUSE mounts are nosuid and nodev already, the daemon serves no atimes and
#: writes nothing (sync, async), and who may mount (user, users, owner, group) is mount(8)'s to
#: decide before it runs this helper. fuse3's mount.fuse3 drops the same ones.
IGNORED = frozenset(
    ("rw", "ro", "defaults", "auto", "noauto", "nofail", "_netdev", "nosuid", "nodev", "noatime", "relatime",
     "nodiratime", "user", "users", "nouser", "owner", "group", "exec", "suid", "dev", "sync", "async",
     "loud", "silent")
)  # fmt: skip
#: Options that would restrict the mount but that this helper cannot apply: said, then mounted.
NOT_APPLIED = {"noexec": "files keep the modes they were packed with"}
#: ``dlfs mount`` flags that are no mount options: the helper itself decides them.
NOT_OPTIONS = frozenset(("help", "foreground", "systemd", "ready_fd"))
#: mount(8)'s exit status for a mount that failed (1 is a usage error).
MOUNT_FAILED = 32
#: mount(8) runs helpers with PATH and HOME removed; the daemon finds fusermount3 through PATH.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class OptionError(Exception):
    """An ``-o`` option dlfs does not take, or one written wrongly."""


def mount_flags() -> dict[str, argparse.Action]:
    """``dlfs mount``'s long flags as option names (``readahead_budget``) -> their argparse actions."""
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    flags = {}
    for action in commands.choices["mount"]._actions:
        for flag in action.option_strings:
            name = flag.removeprefix("--").replace("-", "_")
            if flag.startswith("--") and name not in NOT_OPTIONS:
                flags[name] = action
    return flags


def to_flags(options: str, sloppy: bool = False) -> list[str]:
    """``-o`` text -> ``dlfs mount`` arguments; unknown options raise, or are skipped if ``sloppy``
    (mount -s) with a warning."""
    flags = mount_flags()
    arguments = []
    for option in filter(None, options.split(",")):
        name, has_value, value = option.partition("=")
        if name in IGNORED or name.startswith("x-") or name == "comment":
            continue
        if name in NOT_APPLIED:
            print(f"mount.fuse.dlfs: {name} is not applied: {NOT_APPLIED[name]}", file=sys.stderr)
            continue
        action = flags.get(name)
        if action is None:
            if sloppy:
                print(f"mount.fuse.dlfs: ignoring unknown option {name!r}", file=sys.stderr)
                continue
            known = ", ".join(n if a.nargs == 0 else f"{n}=" for n, a in sorted(flags.items()))
            raise OptionError(f"unknown option {name!r} for fuse.dlfs; dlfs takes {known}")
        takes_value = action.nargs != 0
        if takes_value and not has_value:
            raise OptionError(f"option {name!r} needs a value: {name}=...")
        if not takes_value and has_value:
            raise OptionError(f"option {name!r} takes no value: write {name} alone")
        if takes_value:
            _check_value(name, value, action)
        arguments += [action.option_strings[-1], value] if takes_value else [action.option_strings[-1]]
    return arguments


def _check_value(name: str, value: str, action: argparse.Action) -> None:
    """The value as ``dlfs mount`` would take it, so that a bad one is one line here (and with
    ``-f``) rather than argparse's usage text and exit 2 from the mount."""
    try:
        converted = action.type(value) if callable(action.type) else value
    except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
        reason = "needs a whole number" if action.type is int else str(exc) or "not a valid value"
        raise OptionError(f"option {name}={value!r}: {reason}") from None
    if action.choices is not None and converted not in action.choices:
        choices = ", ".join(map(str, action.choices))
        raise OptionError(f"option {name}={value!r}: choose one of {choices}")


def main(argv: Sequence[str] | None = None) -> int:
    """mount(8)'s helper convention: DATASET MNT [-s] [-f] [-n] [-v] [-o OPTIONS] [-t TYPE]."""
    parser = argparse.ArgumentParser(prog="mount.fuse.dlfs", description=__doc__.split("\n")[0])
    parser.add_argument("dataset")
    parser.add_argument("mountpoint")
    parser.add_argument("-o", dest="options", default="", help="comma-separated dlfs mount options")
    parser.add_argument("-s", dest="sloppy", action="store_true", help="ignore options dlfs does not know")
    parser.add_argument("-f", dest="fake", action="store_true", help="check the options, mount nothing")
    parser.add_argument("-n", action="store_true", help="(no mtab: dlfs writes none)")
    parser.add_argument("-v", dest="verbose", action="store_true", help="log what the mount does")
    parser.add_argument("-t", dest="type", help="fuse.dlfs")
    parser.add_argument("-N", dest="namespace", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.namespace is not None:
        print("mount.fuse.dlfs: error: mounting in another namespace (-N) is not supported", file=sys.stderr)
        return 1
    try:
        flags = to_flags(args.options, args.sloppy)
    except OptionError as exc:
        print(f"mount.fuse.dlfs: error: {exc}", file=sys.stderr)
        return 1
    if args.fake:
        return 0
    os.environ.setdefault("PATH", DEFAULT_PATH)
    verbosity = ["-v"] if args.verbose else []
    status = cli.main([*verbosity, "mount", args.dataset, args.mountpoint, *flags])
    return MOUNT_FAILED if status else 0


if __name__ == "__main__":
    sys.exit(main())
