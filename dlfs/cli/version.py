"""``dlfs --version``: dlfs's version, and the pyfuse3, C loops and S3 client it would run with,
since a stock pyfuse3, an unbuilt C loop or a missing s3 extra changes what it can do (the mount
says the same in its log)."""

from __future__ import annotations

import argparse

from dlfs import __version__


class Version(argparse.Action):
    """Prints the lines and exits, as argparse's own ``version`` action does."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help=str(kwargs.get("help", "")))

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print("\n".join(lines()))
        parser.exit()


def lines() -> list[str]:
    from importlib import metadata

    from dlfs.fuse.features import describe, installed_features, native_loops

    found = [f"dlfs {__version__}"]
    try:
        features = describe(installed_features())
        found.append(f"pyfuse3 {metadata.version('pyfuse3')}: {features[0]}")
        found += [f"  {line}" for line in features[1:]]
    except ImportError as exc:
        found.append(f"pyfuse3: not importable ({exc}); run make install")
    found.append(native_loops())
    try:
        found.append(
            f"obstore {metadata.version('obstore')}, boto3 {metadata.version('boto3')}: s3:// datasets"
        )
    except metadata.PackageNotFoundError:
        found.append("no s3 extra: s3:// datasets need pip install 'dlfs-data[s3]'")
    return found
