"""Pack-time transforms: ``--transform NAME:VALUE[,KEY=VALUE...]`` stores a function's output in
place of each file's bytes, under the file's own name.

A transform is one entry in ``KINDS``: a function from a file's bytes (and integer parameters) to
the bytes to store, or a ``Kept`` reason to store the file unchanged. The pack runs it in worker
processes (``pipeline``), records its spec and codec in the index (``describe``), and flags every
file it changed, so ``dlfs info``, ``dlfs ls -l`` and ``MNT/.dlfs/config`` can say so. Sizes and
checksums in the index are of the stored bytes, so the mount and ``dlfs verify`` need nothing new.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dlfs.core.errors import PackError
from dlfs.pack import images
from dlfs.pack.images import Kept


@dataclass(frozen=True)
class Param:
    """One integer parameter: the first of a kind is given bare (``resize:256``), the rest by name."""

    name: str
    low: int
    high: int
    default: int | None = None


@dataclass(frozen=True)
class Kind:
    function: Callable[..., bytes | Kept]
    params: tuple[Param, ...]


KINDS: dict[str, Kind] = {
    "resize": Kind(
        images.resize,
        (Param("short", 1, 1 << 16), Param("quality", 1, 100, 90)),
    ),
}


@dataclass(frozen=True)
class Transform:
    """A parsed ``--transform``: picklable, so worker processes get it whole."""

    name: str
    params: tuple[tuple[str, int], ...]

    @property
    def spec(self) -> str:
        """The canonical spelling, every parameter named: ``resize:256,quality=90``."""
        (_, first), *rest = self.params
        return f"{self.name}:{first}" + "".join(f",{key}={value}" for key, value in rest)

    def apply(self, data: bytes) -> bytes | Kept:
        return KINDS[self.name].function(data, **dict(self.params))

    def describe(self, codec: str) -> dict[str, object]:
        """What the index records: enough to tell which bytes a dataset holds and how they came."""
        return {"spec": self.spec, "name": self.name, "params": dict(self.params), "codec": codec}


def parse(spec: str) -> Transform:
    """``resize:256`` or ``resize:256,quality=85``; a one-line PackError for anything else."""
    name, _, rest = spec.partition(":")
    kind = KINDS.get(name)
    if kind is None:
        raise PackError(f"unknown transform {name!r}; choose one of {', '.join(KINDS)}")
    first, *named = rest.split(",") if rest else [""]
    usage = f"--transform {name}:{kind.params[0].name.upper()}" + "".join(
        f"[,{p.name}=N]" for p in kind.params[1:]
    )
    values: dict[str, str] = {kind.params[0].name: first}
    for item in named:
        key, eq, value = item.partition("=")
        if not eq or key not in {p.name for p in kind.params[1:]} or key in values:
            raise PackError(f"bad transform parameter {item!r}; use {usage}")
        values[key] = value
    params = tuple((param.name, _value(name, param, values.get(param.name), usage)) for param in kind.params)
    return Transform(name, params)


def _value(name: str, param: Param, text: str | None, usage: str) -> int:
    if text is None and param.default is not None:
        return param.default
    try:
        value = int(text or "")
    except ValueError:
        raise PackError(f"transform {name} needs a whole number for {param.name}; use {usage}") from None
    if not param.low <= value <= param.high:
        raise PackError(f"transform {name}: {param.name} must be {param.low}..{param.high}, not {value}")
    return value
