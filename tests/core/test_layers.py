"""The layer rules of the package, read from the sources: what each layer may import.

``core`` knows no FUSE, no trio and no torch; ``readahead`` builds on ``core`` alone and reaches the
kernel only through its ``Kernel`` protocol; only ``fuse`` talks to pyfuse3; a training script's
``import dlfs.torch`` loads the control protocol and nothing of the daemon.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dlfs.core import libc, protocol

PACKAGE = Path(__file__).resolve().parents[2] / "dlfs"


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth of the file (function-level imports too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def _layer_imports(layer: str) -> dict[str, set[str]]:
    return {str(p.relative_to(PACKAGE)): _imports(p) for p in sorted((PACKAGE / layer).rglob("*.py"))}


def _offending(imports: dict[str, set[str]], allowed: tuple[str, ...], banned: tuple[str, ...]) -> list[str]:
    bad = []
    for module, names in imports.items():
        for name in names:
            top = name.split(".")[0]
            ours = name.startswith("dlfs.")
            if (ours and not name.startswith(allowed)) or top in banned:
                bad.append(f"{module} imports {name}")
    return bad


@pytest.mark.parametrize(
    ("layer", "allowed", "banned"),
    [
        ("core", ("dlfs.core",), ("trio", "pyfuse3", "torch", "torchvision")),
        ("readahead", ("dlfs.core", "dlfs.readahead"), ("pyfuse3", "torch", "torchvision")),
        ("pack", ("dlfs.core", "dlfs.pack"), ("trio", "pyfuse3", "torch")),
    ],
)
def test_layer_imports_only_what_lies_below_it(
    layer: str, allowed: tuple[str, ...], banned: tuple[str, ...]
) -> None:
    assert _offending(_layer_imports(layer), allowed, banned) == []


def test_only_the_fuse_layer_imports_pyfuse3() -> None:
    users = sorted(
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if "pyfuse3" in {n.split(".")[0] for n in _imports(p)}
    )
    assert users and all(user.startswith("fuse/") for user in users), users


def test_the_torch_module_needs_only_the_control_protocol() -> None:
    """The protocol and, for the file set a sampler announces, numpy (which torch loads anyway)."""
    ours = {name for name in _imports(PACKAGE / "torch.py") if name.startswith("dlfs")}
    assert ours <= {"dlfs.core.protocol", "dlfs.core.errors", "dlfs.core.fileset"}, ours
    assert {name for name in _imports(PACKAGE / "core" / "fileset.py") if name.startswith("dlfs")} == set()
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, dlfs.core.protocol, dlfs.core.errors; print(sorted(sys.modules))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for heavy in ("ctypes", "numpy", "trio", "pyfuse3", "dlfs.core.store", "dlfs.core.libc"):
        assert f"'{heavy}'" not in loaded, f"the protocol loads {heavy}"


def _top_level_imports(path: Path) -> set[str]:
    """What ``path`` imports when it is loaded: its module-level imports, not those inside functions
    or under ``if TYPE_CHECKING``."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_cli_imports_what_a_command_calls_only_when_it_runs() -> None:
    """``dlfs --help`` and ``dlfs umount`` start fast: a command module loads the standard library,
    the other command modules and the few light modules that define its flags; the layers a
    command calls are imported inside its ``run``."""
    light = ("dlfs.cli", "dlfs.logs", "dlfs.__version__", "dlfs.core.errors", "dlfs.core.store.interface")
    light += ("dlfs.core.choices",)
    light += ("dlfs.fuse.mount",)
    heavy = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in sorted((PACKAGE / "cli").glob("*.py"))
        for name in _top_level_imports(path)
        if not (name.startswith(light) or name.split(".")[0] in sys.stdlib_module_names | {"__future__"})
    ]
    assert heavy == []
    loaded = subprocess.run(
        [
            sys.executable,
            "-P",
            "-c",
            "import sys, dlfs.cli; dlfs.cli.build_parser(); print(sorted(sys.modules))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    heavy_modules = ("numpy", "lz4", "xxhash", "obstore", "boto3", "torch", "pyfuse3", "trio", "tqdm")
    for module in (*heavy_modules, "dlfs.pack", "dlfs.bench", "dlfs.core.index", "dlfs.core.format"):
        assert f"'{module}'" not in loaded, f"the CLI loads {module} before a command runs"


def _c_define(source: str, name: str) -> int:
    match = re.search(rf"^#define {name} (\d+)$", (PACKAGE / source).read_text(), re.M)
    assert match, f"{source} defines no {name}"
    return int(match.group(1))


@pytest.mark.parametrize(
    ("source", "name", "value"),
    [
        ("readahead/_push.c", "ALIGN", libc.DIRECT_ALIGN),
        ("core/_pagecache.h", "SYS_CACHESTAT", libc.SYS_CACHESTAT),
        ("fuse/_entry.h", "BLOCK", libc.STAT_BLOCK),
        ("fuse/_handlers.h", "LATENCY_BUCKETS", protocol.LATENCY_BUCKETS),
    ],
)
def test_the_c_loops_use_the_numbers_of_core_libc(source: str, name: str, value: int) -> None:
    assert _c_define(source, name) == value
