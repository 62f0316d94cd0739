"""``dlfs pack``: a directory tree re-laid into shards plus one index (see ``packer``)."""

from dlfs.pack.options import DEFAULT_JOBS, PackOptions, PackSummary
from dlfs.pack.packer import pack

__all__ = ["DEFAULT_JOBS", "PackOptions", "PackSummary", "pack"]
