"""How dlfs starts Python processes of its own: with this interpreter, never from the current directory.

``python -m MODULE`` puts the current directory first on ``sys.path``, so a ``dlfs.py`` or
``dlfs/__init__.py`` lying where root runs ``dlfs mount`` (``/tmp``, a shared project folder, the
dataset's folder, or mount(8)'s working directory for fstab) would be imported by the daemon and
run as root; from inside an unbuilt source checkout the daemon would import that copy and answer
every request in Python.

Every process dlfs spawns runs with ``-P`` (Python 3.11+), which leaves out exactly that implicit
entry and nothing else; those that the standard library starts for dlfs (a ``spawn`` pool runs
``python -c``) get the same through ``PYTHONSAFEPATH`` (``safe_path_children``). ``-I`` would also
drop ``PYTHONPATH`` and the user's site-packages, places a user installs dlfs into on purpose (``pip
install --user``; a module tree named by the administrator), so the daemon could then import another
dlfs than the command that started it, or none.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

#: This interpreter, told to put no directory of its own choosing on ``sys.path``.
PYTHON: tuple[str, ...] = (sys.executable, "-P")


@contextmanager
def safe_path_children() -> Iterator[None]:
    """Python processes started meanwhile by another's command line (``multiprocessing``'s spawn
    runs ``python -c``) put no directory of their own choosing on ``sys.path`` either."""
    before = os.environ.get("PYTHONSAFEPATH")
    os.environ["PYTHONSAFEPATH"] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ["PYTHONSAFEPATH"]
        else:
            os.environ["PYTHONSAFEPATH"] = before


def module_command(module: str, *args: str) -> list[str]:
    """The command line that runs ``python -m module args`` the safe way (see the module's text)."""
    return [*PYTHON, "-m", module, *args]
