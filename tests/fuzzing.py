"""How the fuzz tests run: how many examples, and the hypothesis settings they share."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings


def fuzz_examples(default: int) -> int:
    """Examples per fuzz test: ``DLFS_FUZZ_EXAMPLES``, else ``default`` (what ``make test`` runs)."""
    return int(os.environ.get("DLFS_FUZZ_EXAMPLES", default))


def fuzz_settings(examples: int) -> settings:
    """Hypothesis settings of the fuzz tests: no deadline (each test bounds an example's time
    itself), no example database, and large inputs allowed."""
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.function_scoped_fixture,
        ],
    )
