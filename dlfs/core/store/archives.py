"""An in-place dataset's bytes: its shards, which lie in the tar files it was indexed from
(``dlfs pack --in-place``).

Each shard of such a dataset lies in an archive, ``base`` bytes into it (``dlfs.core.format``),
so a read of shard ``k`` at ``offset`` is a ``pread`` of its archive at ``base + offset``. The C
readers take the archive's descriptor and add the base themselves (``Index.shard_base``).

What a mount trusts. The index is input too, and it names files the daemon will open. So every path
must be absolute and normalised (``archive_meta.is_archive_path``, checked at load), and here each is
opened once, at mount, and refused unless it is a regular file with the size and mtime recorded when
it was indexed. A path is first opened with ``O_PATH``, which opens nothing behind it (a device
node's open is an action), and read only once it is known to be a regular file; every later
descriptor is a reopening of that same file (through ``/proc/self/fd``), so a path replaced after
the check changes nothing that is read. Every file is checked against the checksum recorded while
indexing, so a byte changed later reads as EIO. Checksums are no secret, though: an index that
names a file with one-byte rows and every possible checksum would learn the file byte by byte
from which rows read. So an archive is served only if the owner of the index could read it
anyway: it belongs to that owner, or every user may read it.
"""

from __future__ import annotations

import os
import resource
import stat
import time
from typing import Any

from dlfs.core.errors import ShardError, StoreError
from dlfs.core.store.archive_shards import ArchiveShards
from dlfs.core.store.interface import InPlaceWriter
from dlfs.core.store.local import LocalStore

AGAIN = "re-run dlfs pack --in-place"


def identity(path: str) -> dict[str, Any]:
    """What an in-place index records of an archive (``archive_meta.ARCHIVE_KEYS``), as it is now."""
    st = os.stat(path)
    return {"path": path, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def open_archive(archive: dict[str, Any], owner: int) -> int:
    """A descriptor of the archive an index names, or ``ShardError`` in one line when it is
    missing, not a regular file, not the file that was indexed, or one that ``owner`` (the index
    file's owner) could not read."""
    path = archive["path"]
    try:
        found = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ShardError(f"archive {path} is missing; restore it or {AGAIN}") from None
    except OSError as exc:
        raise ShardError(f"cannot open archive {path}: {exc.strerror}") from None
    try:
        st = os.fstat(found)
        if not stat.S_ISREG(st.st_mode):
            raise ShardError(
                f"{path} is not a regular file; an in-place dataset reads only the tar files it indexed"
            )
        if st.st_uid != owner and not st.st_mode & stat.S_IROTH:
            raise ShardError(
                f"archive {path} belongs to uid {st.st_uid} and is not readable by others, but the index "
                f"belongs to uid {owner}; {AGAIN} as the archive's owner, or make it readable"
            )
        try:
            fd = os.open(f"/proc/self/fd/{found}", os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
        except OSError as exc:
            raise ShardError(f"cannot open archive {path}: {exc.strerror}") from None
    finally:
        os.close(found)
    st = os.fstat(fd)
    problem = ""
    if st.st_size != archive["size"] or st.st_mtime_ns != archive["mtime_ns"]:
        problem = (
            f"archive {path} has changed since it was indexed (now {st.st_size:,} bytes, modified "
            f"{_when(st.st_mtime_ns)}; indexed: {archive['size']:,} bytes, modified "
            f"{_when(archive['mtime_ns'])}); {AGAIN}"
        )
    if problem:
        os.close(fd)
        raise ShardError(problem)
    return fd


def allow_descriptors(more: int) -> None:
    """Let this process open ``more`` files beyond those it has: the soft limit is raised to the
    hard one where it is too low (1,024 is a common default, and a folder of WebDataset shards can
    hold thousands of tars), or ``ShardError`` says what to raise."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = len(os.listdir("/proc/self/fd")) + more
    if wanted <= soft:
        return
    if hard != resource.RLIM_INFINITY and wanted > hard:
        raise ShardError(
            f"this in-place dataset needs {wanted:,} open files, more than this process may open ({hard:,}); "
            "raise the limit (ulimit -n) or pack the tars without --in-place"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted if hard == resource.RLIM_INFINITY else hard, hard))


class ArchiveStore(ArchiveShards, LocalStore):
    """The shards of an in-place dataset, read like a directory's shards (``LocalStore``) at each
    shard's base in its archive. Read-only."""

    def __init__(
        self,
        archives: list[dict[str, Any]],
        places: list[tuple[str, int, int, int]],
        owner: int,
        random_access: bool = False,
    ) -> None:
        """``places``: (shard name, archive number, base, size) of each shard; ``owner``: the uid
        of the index file. Every archive is opened and checked here (``open_archive``)."""
        super().__init__("/", random_access, durable=False)
        self.url = ", ".join(archive["path"] for archive in archives)
        self._paths = [archive["path"] for archive in archives]
        self._checked: list[int] = []
        # Each archive's checked descriptor, and each shard's through the page cache and direct.
        allow_descriptors(len(archives) + 2 * len(places))
        try:
            for archive in archives:
                self._checked.append(open_archive(archive, owner))
        except BaseException:
            self.close()
            raise
        self._places = {name: (number, base, size) for name, number, base, size in places}

    def _open(self, name: str, flags: int) -> int:
        """A new open file of the checked archive: its own read-ahead advice, or O_DIRECT."""
        number, _, _ = self._places[name]
        return os.open(f"/proc/self/fd/{self._checked[number]}", flags)

    def _base(self, name: str) -> int:
        return self._places[name][1]

    def read(self, name: str, offset: int, length: int) -> bytes:
        return super().read(name, self._base(name) + offset, length)

    read_buffer = read

    def read_into(self, name: str, offset: int, buffer: memoryview, wait: bool = True) -> int | None:
        return super().read_into(name, self._base(name) + offset, buffer, wait)

    def will_read(self, name: str, offset: int, length: int) -> None:
        super().will_read(name, self._base(name) + offset, length)

    def _read_error(self, name: str, offset: int, exc: OSError) -> StoreError:
        return StoreError(f"reading {self._paths[self._places[name][0]]} at {offset}: {exc.strerror}")

    def create_in_place(self, name: str) -> InPlaceWriter:
        raise StoreError("an in-place dataset's archives are read-only")

    def close(self) -> None:
        super().close()
        for fd in self._checked:
            os.close(fd)
        self._checked.clear()


def _when(mtime_ns: int) -> str:
    """A modification time as a person reads it, to the nanosecond: two that differ only in the
    nanoseconds (a copy that kept the seconds) must read as different."""
    seconds, ns = divmod(mtime_ns, 1_000_000_000)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds)) + f".{ns:09d}"
