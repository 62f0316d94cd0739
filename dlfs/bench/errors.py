"""The one error of ``dlfs bench``; every bench module raises it, so it sits below them all."""

from __future__ import annotations

from dlfs.core.errors import DlfsError


class BenchError(DlfsError):
    """A benchmark cannot run as asked: a root is missing, caches cannot be dropped, no order."""
