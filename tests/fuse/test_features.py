"""What dlfs says of pyfuse3's dlfs additions: the mount's one log message (a full and a stock build)
and `dlfs --version`."""

from __future__ import annotations

import logging
import subprocess

import pytest
from commands import DLFS

from dlfs import __version__
from dlfs.fuse.features import CONSEQUENCES, log_pyfuse3_features

FULL = frozenset(CONSEQUENCES)


def test_full_build_is_one_info_line(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("dlfs.test.features")
    with caplog.at_level(logging.DEBUG, logger=log.name):
        log_pyfuse3_features(log, FULL)
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    message = caplog.records[0].getMessage()
    assert message.startswith("pyfuse3 has every dlfs addition")
    assert all(name in message for name in FULL)


def test_stock_build_names_each_slower_path(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("dlfs.test.features")
    with caplog.at_level(logging.DEBUG, logger=log.name):
        log_pyfuse3_features(log, frozenset())
    messages = [r.getMessage() for r in caplog.records]
    assert all(r.levelno == logging.WARNING for r in caplog.records)
    assert f"lacks {len(FULL)} of {len(FULL)}" in messages[0] and "found: none" in messages[0]
    assert len(messages) == 1 + len(FULL)
    for name, line in zip(CONSEQUENCES, messages[1:], strict=True):
        assert line == f"without {name}: {CONSEQUENCES[name]}"
    assert any("C loop" in m for m in messages) and any("OPEN" in m for m in messages)


def test_partial_build_lists_only_what_is_missing(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("dlfs.test.features")
    with caplog.at_level(logging.DEBUG, logger=log.name):
        log_pyfuse3_features(log, FULL - {"dev_fuse_fd"} | {"something_newer"})
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert f"lacks 1 of {len(FULL)}" in messages[0]
    assert messages[1].startswith("without dev_fuse_fd:")


def test_default_reads_the_installed_pyfuse3(caplog: pytest.LogCaptureFixture) -> None:
    pyfuse3 = pytest.importorskip("pyfuse3")
    log = logging.getLogger("dlfs.test.features")
    with caplog.at_level(logging.DEBUG, logger=log.name):
        log_pyfuse3_features(log)
    missing = FULL - frozenset(getattr(pyfuse3, "dlfs_features", ()))
    assert len(caplog.records) == (1 + len(missing) if missing else 1)


def test_version_says_which_pyfuse3_additions_and_s3_client_dlfs_runs_with() -> None:
    lines = subprocess.run(
        [*DLFS, "--version"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert lines.startswith(f"dlfs {__version__}\n")
    assert "pyfuse3 3.5.0+dlfs" in lines and "custom_io" in lines  # the build make install makes
    assert "obstore" in lines
