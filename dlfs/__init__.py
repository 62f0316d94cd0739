"""dlfs: a read-only FUSE filesystem that serves a small-file training set from packed shards."""

__version__ = "0.1.0"
