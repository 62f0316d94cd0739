"""The command line itself: its sizes, its flags' defaults and words, its help, and what it loads."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from dlfs import cli
from dlfs.cli import common
from dlfs.core.store.interface import StoreOptions
from dlfs.fuse.mount import MountOptions

KIB, MIB, GIB, TIB = 1 << 10, 1 << 20, 1 << 30, 1 << 40


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4096", 4096),
        ("4096B", 4096),
        ("64k", 64 * KIB),
        ("64K", 64 * KIB),
        ("64Ki", 64 * KIB),
        ("64KiB", 64 * KIB),
        ("64KB", 64 * KIB),
        ("512M", 512 * MIB),
        ("512Mi", 512 * MIB),
        ("512MiB", 512 * MIB),
        ("1G", GIB),
        ("1Gi", GIB),
        ("1GiB", GIB),
        ("1gib", GIB),
        ("1GB", GIB),
        (" 1.5G ", 3 * GIB // 2),
        ("2Ti", 2 * TIB),
    ],
)
def test_a_size_takes_a_binary_unit_with_or_without_i_and_b(text: str, size: int) -> None:
    assert common.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "G", "1X", "1GiBB", "1iB", "-1G", "1 G B", "1Gb2"])
def test_what_is_no_size_is_refused_with_examples(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"not a size.*1GiB"):
        common.parse_size(text)


def test_the_mount_flags_give_the_mount_options_and_their_defaults() -> None:
    parse = cli.build_parser().parse_args
    assert MountOptions.from_args(parse(["mount", "ds", "mnt"]), StoreOptions()) == MountOptions()
    args = parse(["mount", "ds", "mnt", "--ram-cache-size", "1Gi", "--order", "block", "--region-ahead", "0"])
    store = StoreOptions(timeout=5.0)
    options = MountOptions.from_args(args, store)
    assert (options.ram_cache_size, options.order, options.region_ahead) == (GIB, "block", 0)
    assert options.store is store


@pytest.mark.parametrize(
    ("command", "old", "new"),
    [
        (["mount", "ds", "mnt"], ["--cache-size", "1G"], ["--ram-cache-size", "1G"]),
        (
            ["mount", "ds", "mnt"],
            ["--cache-dir", "/t", "--cache-dir-size", "2G"],
            ["--disk-tier", "/t", "--disk-tier-size", "2G"],
        ),
        (["pack", "src", "dst"], ["--readers", "3"], ["--threads", "3"]),
        (["pack", "src", "dst"], ["-j", "3"], ["--threads", "3"]),
        (["pack", "src", "dst"], ["--placement", "source"], ["--placement", "tree"]),
        (["verify", "ds"], ["--readers", "2"], ["--threads", "2"]),
    ],
)
def test_an_old_spelling_of_a_flag_means_what_its_one_name_means(
    command: list[str], old: list[str], new: list[str]
) -> None:
    """Scripts written with a flag's earlier spelling still run; ``--help`` names only the one."""
    parse = cli.build_parser().parse_args
    given, named = vars(parse([*command, *old])), vars(parse([*command, *new]))
    given.pop("func"), named.pop("func")
    assert given == named
    shown = [action for action in _commands()[command[0]]._actions if action.help != argparse.SUPPRESS]
    assert old[0] == "--placement" or old[0] not in {
        flag for action in shown for flag in action.option_strings
    }
    assert all(old[-1] not in (action.choices or ()) for action in shown)


def test_no_two_flags_are_one_word_singular_and_plural() -> None:
    """One word for one concept: no ``--job`` in one command beside a ``--jobs`` in another."""
    flags = {
        flag
        for parser in _commands().values()
        for action in parser._actions
        for flag in action.option_strings
        if flag.startswith("--")
    }
    assert not {flag for flag in flags if flag + "s" in flags}
    assert "--placement" in _commands()["pack"].format_usage()


@pytest.mark.parametrize("command", ["", *_commands()])
def test_every_help_prints_and_says_what_sizes_take(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        cli.build_parser().parse_args([command, "--help"] if command else ["--help"])
    assert exit.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: dlfs {command}".rstrip())
    takes_sizes = any(
        action.type in (common.parse_size, common.parse_size_or_auto)
        for action in (_commands()[command] if command else cli.build_parser())._actions
    )
    assert (" ".join(common.SIZES.split()) in " ".join(text.split())) == takes_sizes


def test_python_dash_m_runs_the_cli() -> None:
    command = [sys.executable, "-m", "dlfs.cli", "--version"]
    result = subprocess.run(command, capture_output=True, text=True, check=True, timeout=60)
    assert result.stdout.startswith("dlfs ") and "C loops" in result.stdout
