"""``dlfs pack``: a directory tree re-laid into shards plus one index (see ``packer``)."""

from dlfs.pack.options import DEFAULT_THREADS, PackOptions, PackSummary
from dlfs.pack.packer import pack

__all__ = ["DEFAULT_THREADS", "PackOptions", "PackSummary", "pack"]
