"""Something a benchmark or test starts and must never leave behind: a server, a proxy, a network."""

from __future__ import annotations

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
