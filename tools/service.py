"""Something a benchmark or test starts and must never leave behind: a server, a proxy, a network."""

from __future__ import annotations

import subprocess
from types import TracebackType
from typing import Self


class Service:
    """Started on entry (or by ``start``), stopped on exit; a start that fails halfway stops what
    it had started, so a failure leaves nothing running. ``stop`` may be called at any point."""

    def _start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def start(self) -> Self:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class ProcessService(Service):
    """A service that is one process, ``_process`` once started."""

    _process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        """The running process (benchmarks read its CPU time)."""
        if self._process is None:
            raise RuntimeError("not started")
        return self._process.pid
