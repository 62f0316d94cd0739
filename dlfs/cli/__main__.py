"""``python -m dlfs.cli``: what the background mount and the tests start."""

import sys

from dlfs.cli import main

sys.exit(main())
