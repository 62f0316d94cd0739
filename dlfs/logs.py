"""Where ``dlfs`` logs: stderr, a file (``--log-file``), or the systemd journal.

A daemon started by systemd (``dlfs mount --foreground`` in a unit) has the journal as its stderr,
and the journal stamps each line itself: a line with a time of its own would show two. So there,
lines carry no time but the ``<N>`` syslog priority prefix of sd-daemon(3), which the journal reads
as the line's level (``journalctl -p warning`` then finds dlfs's warnings).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from dlfs.core.errors import DlfsError

#: ``--log-level`` names, as the logging module spells them.
LEVELS = ("debug", "info", "warning", "error")

#: syslog priorities (sd-daemon.h SD_DEBUG … SD_CRIT) of the logging levels.
_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3, logging.CRITICAL: 2}

PLAIN_FORMAT = "%(asctime)s %(name)s %(levelname)s: %(message)s"
JOURNAL_FORMAT = "%(name)s: %(message)s"


def stderr_is_journal() -> bool:
    """Is stderr the journal's stream? systemd sets ``JOURNAL_STREAM`` to its device and inode;
    a child whose stderr was redirected elsewhere inherits the variable, so both must match."""
    device, _, inode = os.environ.get("JOURNAL_STREAM", "").partition(":")
    try:
        st = os.fstat(sys.stderr.fileno())
        return (st.st_dev, st.st_ino) == (int(device), int(inode))
    except (ValueError, OSError):
        return False


class JournalFormatter(logging.Formatter):
    """Every line of a record (a traceback's too) prefixed with the record's priority, no time."""

    def __init__(self) -> None:
        super().__init__(JOURNAL_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{_PRIORITY.get(record.levelno, 6)}>"
        return "\n".join(prefix + line for line in super().format(record).splitlines())


def configure(level: int, log_file: str | None = None) -> None:
    """Send this process's log records of ``level`` and above to ``log_file`` (appended), else to
    stderr, in the journal's form when stderr is the journal."""
    if log_file is not None:
        try:
            Path(log_file).parent.mkdir(parents=True, exist_ok=True)
            handler: logging.Handler = logging.FileHandler(log_file)
        except OSError as exc:
            raise DlfsError(f"cannot write the log file {log_file}: {exc.strerror or exc}") from None
        handler.setFormatter(logging.Formatter(PLAIN_FORMAT))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JournalFormatter() if stderr_is_journal() else logging.Formatter(PLAIN_FORMAT))
    logging.basicConfig(level=level, handlers=[handler], force=True)
