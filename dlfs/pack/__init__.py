"""``dlfs pack``: a directory tree re-laid into shards plus one index (see ``packer``)."""

from dlfs.pack.options import DEFAULT_READERS, PackOptions, PackSummary
from dlfs.pack.packer import pack

__all__ = ["DEFAULT_READERS", "PackOptions", "PackSummary", "pack"]
