"""Exception families a user can cause; each message says what to do next.

The CLI prints ``str(error)`` on one line and exits non-zero, so messages must stand alone.
Only the FUSE adapter turns these into errno values. ``InternalError`` is the one family that is
not the user's: a bug, reported as one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from os import PathLike


class DlfsError(Exception):
    """Base of every error that is the user's to fix (bad path, bad dataset, busy mountpoint)."""


class PackError(DlfsError):
    """The source tree or the destination prevents packing."""


class DatasetError(DlfsError):
    """A destination is not a usable dlfs dataset: no index, foreign, truncated or too new."""


class ShardError(DatasetError):
    """A shard named by the index is missing, truncated or belongs to another dataset."""


class IntegrityError(DlfsError):
    """A file's stored bytes do not match the checksum recorded at pack time."""


class MountError(DlfsError):
    """The filesystem cannot be mounted or unmounted at the requested place."""


class StoreError(DlfsError):
    """The storage backend failed in a way retrying will not fix."""


class InternalError(Exception):
    """A failure of dlfs's own (a bug), raised from the exception that caused it: the message says
    where it happened and asks for a report, and the CLI logs the cause's traceback (``--debug``
    shows it). Never a ``DlfsError``: nothing the user did, nor a damaged input, is to blame."""


@contextmanager
def writing(path: str | PathLike[str]) -> Iterator[None]:
    """A failed write (a full disk, a read-only one, a quota) as one line for the user, not a
    traceback."""
    try:
        yield
    except OSError as exc:
        raise StoreError(
            f"cannot write {path}: {exc.strerror or exc}; free space there or pack somewhere else"
        ) from exc
