"""Exception families a user can cause; each message says what to do next.

The CLI prints ``str(error)`` on one line and exits non-zero, so messages must stand alone.
Only the FUSE adapter turns these into errno values.
"""


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
