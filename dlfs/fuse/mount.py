"""Mount life cycle seen from the command line: check the mountpoint, start the daemon, unmount.

``dlfs mount`` runs the daemon (``dlfs.fuse.daemon``) as a child process (``--foreground --ready-fd``)
and returns only once the child reports the kernel mount is live, or relays the child's one-line
error. Spawning a fresh interpreter instead of forking keeps threads, trio and libfuse out of a
forked process, and this module imports none of them, so the command itself starts fast.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import re
import select
import shutil
import subprocess
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

from dlfs.core.errors import MountError
from dlfs.core.interpreter import module_command
from dlfs.core.store.interface import StoreOptions

log = logging.getLogger(__name__)

#: How long ``dlfs mount`` waits for its daemon by default. The daemon reads and checks the whole
#: index before it mounts (90 MiB for ImageNet's 1.28 M files): well under a second from a local
#: disk, minutes from a volume throttled to a few MB/s or a few hundred IOPS.
READY_TIMEOUT = 300.0
#: How long ``unmount`` keeps asking while the mount is busy.
BUSY_RETRY_SECONDS = 3.0
FSTYPE = "fuse.dlfs"
STALE = "Transport endpoint is not connected"
#: fusermount3's configuration: a user other than root may pass allow_other only when it says so.
FUSE_CONF = Path("/etc/fuse.conf")
FUSE_DEVICE = Path("/dev/fuse")


@dataclass(frozen=True)
class MountOptions:
    ram_cache_size: int = 256 << 20
    #: Bound on the daemon's resident memory, the budgets fitted to it (``dlfs.core.memory``);
    #: None: only the machine's and the cgroup's memory bound them.
    memory_limit: int | None = None
    allow_other: bool = False
    threads: int = 16
    log_file: str | None = None
    fuse_debug: bool = False
    seed: int = 0
    order: str = "full"
    block: int = 64
    window: int = 4096
    readahead_budget: int = 512 << 20
    #: 16 rather than 8: with both cores busy pushing, more reads queued keep a cold disk busy
    #: (docs/design.md, "The read-ahead"); each batch in flight holds an 8 MiB read buffer.
    readahead_inflight: int = 16
    #: Seconds without a read from its reader after which a sequence's read-ahead, its lead full,
    #: pauses (``dlfs.readahead.engine``). Readers are seen at sentinels, at least eight per lead,
    #: so one that drains its lead within eight times this is never paused while it reads. A
    #: validation pass or a checkpoint shorter than this changes nothing; a longer one only leaves
    #: the files the kernel forgets meanwhile to be fetched when the reader is back.
    readahead_pause: float = 30.0
    readdirplus: str = "auto"
    #: Threads answering the hot requests in C (``dlfs.fuse.server``); 0: pyfuse3 answers all.
    native_threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    #: Bytes of shard the C threads have the kernel read around a file not in memory; None: the
    #: daemon decides (``dlfs.fuse.server.region_for``).
    region_ahead: int | None = None
    #: How to reach an ``s3://`` dataset and the disk tier in front of it.
    store: StoreOptions = field(default_factory=StoreOptions)
    #: Serve the mount's counters to Prometheus on this TCP port (``dlfs.metrics``); None: off.
    metrics_port: int | None = None
    metrics_addr: str = "127.0.0.1"

    @classmethod
    def from_args(cls, args: argparse.Namespace, store: StoreOptions) -> MountOptions:
        """The options ``dlfs mount``'s parsed flags give, each flag named after its field (the
        command's parser takes its defaults from here, so the two never disagree)."""
        return cls(store=store, **{f.name: getattr(args, f.name) for f in fields(cls) if f.name != "store"})


def _mounts() -> list[tuple[int, bytes, str]]:
    """(mount id, mount point, filesystem type) of every mount, from /proc/self/mountinfo."""
    found = []
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            left, _, right = line.partition(b" - ")
            fields = left.split()
            point = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), fields[4])
            found.append((int(fields[0]), point, right.split()[0].decode()))
    return found


def _mounted_at(point: bytes) -> tuple[int, str] | None:
    """(mount id, filesystem type) of the mount exactly at the resolved path ``point`` (the last,
    where several are)."""
    found = None
    for mount, mounted, fstype in _mounts():
        if mounted == point:
            found = (mount, fstype)
    return found


def mounted_fstype(path: str | os.PathLike[str]) -> str | None:
    """The filesystem type mounted exactly at ``path`` (None if none)."""
    found = _mounted_at(os.fsencode(os.path.realpath(path)))
    return found[1] if found else None


def mount_id(resolved: Path) -> int | None:
    """The id of the mount exactly at ``resolved`` (another mount there later has another). The
    path must be resolved already: resolving it would ask the mount itself, which a daemon that
    does not serve yet cannot answer."""
    found = _mounted_at(os.fsencode(resolved))
    return found[0] if found else None


def still_mounted(mount: int, wait: float) -> bool:
    """Is mount ``mount`` still in the mount table? Asked when the table changes (the kernel wakes a
    poll of /proc/self/mounts then) or after ``wait`` seconds."""
    with open("/proc/self/mounts", "rb") as table:
        poller = select.poll()
        poller.register(table, select.POLLPRI | select.POLLERR)
        poller.poll(wait * 1000)
    return any(found == mount for found, _, _ in _mounts())


def is_stale(mnt: str | os.PathLike[str]) -> bool:
    """A FUSE mount whose daemon is gone: the kernel answers every request on it with ENOTCONN.

    Asked with STATFS, which the kernel always sends: a stat is answered from the root's cached
    attributes, so a mount whose readers had walked it looked alive after its daemon was killed."""
    try:
        os.statvfs(mnt)
    except OSError as exc:
        return exc.errno == errno.ENOTCONN
    return False


def check_fuse_device(device: Path = FUSE_DEVICE) -> None:
    """Can this process open the FUSE device? libfuse opens it before mounting, for every user,
    and reports a refusal only in the daemon's log; here it is one line on the terminal."""
    try:
        os.close(os.open(device, os.O_RDWR | os.O_CLOEXEC))
    except FileNotFoundError:
        raise MountError(
            f"{device} is missing; load the fuse module (modprobe fuse) or run where FUSE works"
        ) from None
    except OSError as exc:
        raise MountError(
            f"cannot open {device}: {exc.strerror}; a user other than root needs read and write access "
            f"to it: ask an administrator to allow it (chmod 0666 {device}, as Debian sets it), or mount "
            "as root"
        ) from None


def check_mountpoint(mnt: Path) -> None:
    check_fuse_device()
    check_not_mounted(mnt)
    try:
        if not mnt.exists():
            raise MountError(f"mountpoint {mnt} does not exist; create it with mkdir")
        if not mnt.is_dir():
            raise MountError(f"mountpoint {mnt} is not a directory")
        with os.scandir(mnt) as entries:
            if any(True for _ in entries):
                raise MountError(f"mountpoint {mnt} is not empty; mount on an empty directory")
    except OSError as exc:
        raise MountError(f"cannot use mountpoint {mnt}: {exc.strerror}") from exc


def check_not_mounted(mnt: Path) -> None:
    """Refuse a mountpoint that is a mount; take over a dlfs mount whose daemon died."""
    # First, from /proc: a FUSE mount whose daemon died answers anything else with ENOTCONN.
    fstype = mounted_fstype(mnt)
    if fstype == FSTYPE and is_stale(mnt):  # nothing is lost by taking it over: its daemon is gone
        log.warning("%s is a dlfs mount whose daemon died (%s); unmounting it first", mnt, STALE)
        unmount(str(mnt), lazy=True)
    elif fstype and is_stale(mnt):
        raise MountError(
            f"{mnt} is a {fstype} mount whose daemon died ({STALE}); unmount it first (fusermount3 -u {mnt})"
        )
    elif os.path.ismount(mnt) or fstype:
        raise MountError(f"{mnt} is already a mount point; unmount it first (dlfs umount {mnt})")


def check_allow_other(allow_other: bool, conf: Path = FUSE_CONF) -> None:
    """Say what ``--allow-other`` needs when a user other than root mounts: fusermount3 refuses it
    unless ``conf`` has a ``user_allow_other`` line, and pyfuse3 then reports only a failed mount."""
    if not allow_other or os.geteuid() == 0:
        return
    try:
        lines = conf.read_text().splitlines()
    except OSError:
        lines = []
    if "user_allow_other" not in (line.strip() for line in lines):
        raise MountError(
            f"--allow-other needs a line 'user_allow_other' in {conf} when a user other than root "
            "mounts; add it (as root) or mount without --allow-other"
        )


def default_log_file(mnt: str) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dlfs"
    name = os.path.abspath(mnt).strip("/").replace("/", "_") or "root"
    return base / f"mount-{name}.log"


def spawn(
    argv: list[str], mnt: str, options: MountOptions, ready_timeout: float = READY_TIMEOUT
) -> tuple[int, Path, list[str]]:
    """Start the daemon in the background; return (pid, log file, the daemon's warnings for the
    user) once the mount is live.

    ``argv`` is this command's own argument list: the child re-runs it in the foreground, so every
    flag reaches the daemon without being spelled out twice. A daemon not ready after
    ``ready_timeout`` seconds is stopped, and so is the mount it may have made meanwhile.
    """
    # Here first, so that a mountpoint in use is refused before a daemon would write the refusal
    # into the log of the mount there (the daemon checks it all again: it may change meanwhile).
    check_not_mounted(Path(mnt))
    log_file = Path(options.log_file) if options.log_file else default_log_file(mnt)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    read_end, write_end = os.pipe()
    command = module_command("dlfs.cli", *argv, "--foreground", "--ready-fd", str(write_end))
    try:
        with open(log_file, "ab") as log_out:
            child = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log_out,
                stderr=log_out,
                pass_fds=(write_end,),
                start_new_session=True,
            )
    finally:
        os.close(write_end)
    try:
        message = _read_until_eof(read_end, ready_timeout)
    except KeyboardInterrupt:  # the user gave up on the mount: so does the daemon
        _stop(child, mnt)
        raise
    finally:
        os.close(read_end)
    if message is None:
        _stop(child, mnt)
        raise MountError(
            f"the mount was not ready after {ready_timeout:g} s and was stopped (daemon log: {log_file}); "
            "if the dataset is on slow storage, pass --ready-timeout with more seconds"
        )
    if message.startswith("ok"):
        return child.pid, log_file, message.splitlines()[1:]
    if not message:
        try:
            code = child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            child.kill()
            code = child.wait()
        message = f"the mount daemon exited with status {code} before it was ready; see {log_file}"
    raise MountError(message.removeprefix("error: ").strip())


def _read_until_eof(fd: int, timeout: float) -> str | None:
    """What the daemon wrote before closing its end; None if it had not closed it by ``timeout``."""
    deadline = time.monotonic() + timeout
    chunks = []
    while (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([fd], [], [], left)
        if not readable:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            return b"".join(chunks).decode(errors="replace")
        chunks.append(chunk)
    return None


def _stop(child: subprocess.Popen[bytes], mnt: str) -> None:
    """Kill a daemon this command gave up on (too slow, or interrupted), and remove the mount it may
    have made just before: without its daemon that mount would answer every request with ENOTCONN."""
    child.kill()
    child.wait()
    if mounted_fstype(mnt) == FSTYPE:
        with contextlib.suppress(MountError):
            unmount(mnt, lazy=True)


def holders(mnt: str) -> list[str]:
    """The processes that keep ``mnt`` busy, as ``pid 123 (python3)``: an open file, a working or
    root directory under it, as ``fuser -m`` finds them. Only links are read, never followed, so
    a mount that stopped answering cannot hang the search; processes of other users are out of
    sight without root and simply not named."""
    # The links name absolute, resolved paths; resolve the mountpoint's folder, never the mountpoint
    # itself (a lookup on a mount that stopped answering would hang).
    absolute = os.path.abspath(mnt)
    where = os.path.join(os.path.realpath(os.path.dirname(absolute)), os.path.basename(absolute))
    inside = (where + "/", where)
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if pid == str(os.getpid()):
            continue
        links = [f"/proc/{pid}/cwd", f"/proc/{pid}/root"]
        with contextlib.suppress(OSError):
            links += [f"/proc/{pid}/fd/{fd}" for fd in os.listdir(f"/proc/{pid}/fd")]
        for link in links:
            try:
                target = os.readlink(link)
            except OSError:  # gone, or not ours to see
                continue
            if target == inside[1] or target.startswith(inside[0]):
                with contextlib.suppress(OSError):
                    found.append(f"pid {pid} ({Path(f'/proc/{pid}/comm').read_text().strip()})")
                break
    return found


def unmount(mnt: str, lazy: bool = False) -> None:
    fstype = mounted_fstype(mnt)
    if fstype is None:
        raise MountError(f"{mnt} is not mounted")
    if fstype != FSTYPE:
        raise MountError(f"{mnt} is a {fstype} mount, not a dlfs mount; use umount")
    if is_stale(mnt):
        log.warning("%s was left by a dlfs daemon that died (%s); unmounting it", mnt, STALE)
    tool = shutil.which("fusermount3") or shutil.which("fusermount")
    command = (
        [tool, "-u", *(["-z"] if lazy else []), mnt] if tool else ["umount", *(["-l"] if lazy else []), mnt]
    )
    # The read-ahead lists directories and opens files through the mount for a few milliseconds
    # at a time, and an unmount in that moment is refused as busy: ask again for a while.
    deadline = time.monotonic() + BUSY_RETRY_SECONDS
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    while result.returncode != 0 and "busy" in result.stderr.lower() and time.monotonic() < deadline:
        time.sleep(0.05)
        result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        detail = (
            result.stderr.strip().splitlines()[-1] if result.stderr.strip() else f"exit {result.returncode}"
        )
        users = holders(mnt) if "busy" in detail.lower() else []
        if users:
            more = f" and {len(users) - 5} more" if len(users) > 5 else ""
            detail += ", used by " + ", ".join(users[:5]) + more
        raise MountError(f"cannot unmount {mnt}: {detail}; close files that use it or pass --lazy")
