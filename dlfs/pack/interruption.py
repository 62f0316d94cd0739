"""How a pack stops on SIGINT or SIGTERM: by undoing what it wrote, however often the signal comes.

While a pack runs, both signals raise ``Interrupted`` in the main thread, the one thread that
knows what the pack wrote, and the packer undoes it on the way out: it aborts the open multipart
uploads and deletes the shards already uploaded. The first signal also holds back the ones that
follow (``timeout`` and a shell's process group send a second SIGINT at once, and an impatient
user presses Ctrl-C again): a second ``Interrupted`` raised while undoing would stop the undoing
half-way and leave objects and unfinished uploads behind. The packer holds them back itself from
the moment nothing remains to undo (the index is being published) or it undoes after a failure.

The pack's own threads block both signals, so that the kernel delivers them to the main thread,
which wakes from its wait at once; a thread that took the signal would leave the main thread
asleep until its wait ended.

Only SIGKILL stops a pack without undoing; the next pack into the same place removes what it left
(``destination.remove_leftovers``).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A signal stopped the pack; a KeyboardInterrupt, so that it stops it as Ctrl-C does."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _Handler:
    """The handler installed while a pack runs: it raises once, then holds every signal back."""

    def __init__(self) -> None:
        self.holding = False
        #: The signals held back, by number.
        self.held: list[int] = []

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.holding:
            self.held.append(signum)
            return
        self.holding = True
        raise Interrupted(signum)


_handler: _Handler | None = None


@contextmanager
def interruptible() -> Iterator[None]:
    """Run a pack under the handler above; the signals' earlier handlers are back afterwards.

    Outside the main thread (a pack run by a library user's thread), signals cannot be handled and
    this does nothing.
    """
    global _handler
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = _Handler()
    previous = {signum: signal.signal(signum, handler) for signum in SIGNALS}
    _handler = handler
    try:
        yield
    finally:
        _handler = None
        for signum, earlier in previous.items():
            signal.signal(signum, earlier)
        if handler.held:
            log.info("ignored %s: the pack was finishing", signal.Signals(handler.held[0]).name)


def hold() -> None:
    """From now until the pack ends, hold the signals back: the pack finishes what it does."""
    if _handler is not None:
        _handler.holding = True


def block_in_thread() -> None:
    """Keep the signals away from the calling thread (one of the pack's own): the kernel then
    delivers them to the main thread."""
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
