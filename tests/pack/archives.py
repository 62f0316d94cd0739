"""What the archive tests share: archives written by the real tools (GNU tar, bsdtar, Info-ZIP,
Python's ``tarfile`` and ``zipfile``), what ``tar x`` and ``unzip`` extract from them, and a mount's
view of the pack compared with it, metadata and hard links included."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import subprocess
import tarfile
import zipfile
from pathlib import Path

from commands import DLFS, assert_one_line_error, dlfs
from mounts import mounted
from trees import SMALL_SHARD, make_odd_tree, set_times

from dlfs.core import format as fmt

#: How each tar is written from a tree (``{src}``: the tree, ``{out}``: the archive), by the tools
#: users have: GNU tar in each of its formats, bsdtar (libarchive) in three of its.
TAR_WRITERS = {
    "gnu": ["tar", "--format=gnu", "--numeric-owner", "-cf", "{out}", "-C", "{src}", "."],
    "oldgnu": ["tar", "--format=oldgnu", "--numeric-owner", "-cf", "{out}", "-C", "{src}", "."],
    "pax": ["tar", "--format=pax", "--numeric-owner", "-cf", "{out}", "-C", "{src}", "."],
    "ustar": ["tar", "--format=ustar", "--numeric-owner", "-cf", "{out}", "-C", "{src}", "."],
    "v7": ["tar", "--format=v7", "--numeric-owner", "-cf", "{out}", "-C", "{src}", "."],
    "bsdtar-pax": ["bsdtar", "--format", "pax", "--numeric-owner", "-cf", "{out}", "-C", "{src}", "."],
    "bsdtar-gnutar": ["bsdtar", "--format", "gnutar", "--numeric-owner", "-cf", "{out}", "-C", "{src}", "."],
    "bsdtar-ustar": ["bsdtar", "--format", "ustar", "--numeric-owner", "-cf", "{out}", "-C", "{src}", "."],
}
#: The formats that hold only short names and small ids: written from ``narrow_tree``.
NARROW = ("ustar", "v7", "bsdtar-ustar")
#: GNU tar's compressors, by suffix.
COMPRESSORS = {"gz": "--gzip", "zst": "--zstd", "xz": "--xz", "bz2": "--bzip2"}
#: What ``listing`` gives each entry: type, permissions, uid, gid, mtime (ns), a file's (size,
#: sha256) or a symlink's target, and the names (from the root) of every entry sharing its inode.
Entry = tuple[object, ...]


def write_tar(kind: str, src: Path, out: Path, *extra: str) -> Path:
    """``src`` as a tar of ``kind`` (``TAR_WRITERS``, or ``tarfile-pax`` and ``tarfile-gnu``, by
    Python's ``tarfile``), at ``out``; ``extra`` flags for the tool (a compressor)."""
    if kind.startswith("tarfile-"):
        form = tarfile.PAX_FORMAT if kind == "tarfile-pax" else tarfile.GNU_FORMAT
        with tarfile.open(out, "w", format=form) as tar:
            tar.add(src, arcname=".")
        return out
    command = [arg.format(src=src, out=out) for arg in TAR_WRITERS[kind]]
    subprocess.run([*command[:1], *extra, *command[1:]], check=True, timeout=120, capture_output=True)
    return out


def write_zip(kind: str, src: Path, out: Path) -> Path:
    """``src`` as a zip: by Info-ZIP stored (``zip-0``), deflated (``zip-6``) or with zip64 records
    (``zip64``), or by Python's ``zipfile`` (``zipfile``)."""
    if kind == "zipfile":  # which writes no symlinks: it would store their targets' bytes
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in sorted(src.rglob("*")):
                if not path.is_symlink():
                    archive.write(path, path.relative_to(src))
        return out
    flags = {"zip-0": ["-0"], "zip-6": ["-6"], "zip64": ["-fz"]}[kind]
    subprocess.run(["zip", "-q", "-r", "-y", *flags, out, "."], cwd=src, check=True, timeout=120)
    return out


def archive_tree(root: Path) -> Path:
    """The odd tree (``trees.make_odd_tree``: symlinks absolute, dangling and out of the tree
    among them) with what archives add: a hard link, a second one to the same file, a name and a
    symlink target past 100 bytes (GNU long names and links, pax path and linkpath)."""
    make_odd_tree(root)
    os.link(root / "random.bin", root / "many" / "hard-link-to-random.bin")
    os.link(root / "random.bin", root / "classes" / "second-hard-link")
    (root / ("long-" + "n" * 150 + ".txt")).write_bytes(b"long name\n")
    os.symlink("t" * 120 + "/target", root / "long-target-link")
    set_times(root)
    return root


def narrow_tree(root: Path) -> Path:
    """What ustar and v7 hold: names of at most 100 bytes, ids of at most 7 octal digits."""
    (root / "cls" / "sub").mkdir(parents=True)
    for k in range(30):
        (root / "cls" / f"img-{k:03d}.jpg").write_bytes(os.urandom(100 * k))
    (root / "cls" / "sub" / "empty").write_bytes(b"")
    (root / "plain.txt").write_bytes(b"plain\n")
    os.link(root / "plain.txt", root / "cls" / "plain-again.txt")
    os.symlink("../plain.txt", root / "cls" / "up-link")
    os.symlink("/etc/hostname", root / "absolute-link")
    (root / "mode-0700").mkdir(mode=0o700)
    set_times(root)
    return root


def listing(root: Path) -> dict[bytes, Entry]:
    """Every entry under ``root``, as ``Entry``: what ``tar x`` and a mount must agree on."""
    found: dict[bytes, list[object]] = {}
    inodes: dict[tuple[int, int], list[bytes]] = {}
    base = os.fsencode(root)
    for folder, dirs, files in os.walk(base):
        for name in dirs + files:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            what: object = None
            if stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    what = (st.st_size, hashlib.sha256(f.read()).hexdigest())
                inodes.setdefault((st.st_dev, st.st_ino), []).append(os.path.relpath(path, base))
            elif stat.S_ISLNK(st.st_mode):
                what = os.readlink(path)
            key = os.path.relpath(path, base)
            found[key] = [stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid]
            found[key] += [st.st_mtime_ns, what, (key,)]
    for names in inodes.values():  # every name of an inode, and its link count, once all are known
        for name in names:
            found[name][6] = tuple(sorted(names))
            assert os.lstat(os.path.join(base, name)).st_nlink == len(names), name
    return {key: tuple(value) for key, value in found.items()}


def extract(archive: Path, out: Path, tar: str = "tar") -> Path:
    """What ``tar x`` (as root: owners and permissions kept) or ``unzip`` makes of ``archive``.
    ``tar``: the extractor, the writer's own: GNU tar sets a folder's mtime when it leaves the
    folder in the archive, and bsdtar writes a folder's entries before its subfolders' contents,
    so GNU tar leaves those folders with the time of extraction."""
    out.mkdir()
    if zipfile.is_zipfile(archive) and not tarfile.is_tarfile(archive):
        subprocess.run(["unzip", "-q", archive, "-d", out], check=True, timeout=120)
    else:
        command = [tar, "--numeric-owner", "-xpf", archive, "-C", out]
        subprocess.run(command, check=True, timeout=120, capture_output=True)
    return out


def pack_and_mount_listing(
    tmp_path: Path, archive: Path, *flags: str, stdin: bool = False
) -> dict[bytes, Entry]:
    """``dlfs pack`` of ``archive`` (from standard input with ``stdin``), mounted: its listing."""
    dst = tmp_path / "dst"
    if stdin:
        with open(archive, "rb") as f:
            result = subprocess.run(
                [*DLFS, "-q", "pack", "-", dst, *flags], stdin=f, capture_output=True, text=True, timeout=300
            )
        assert result.returncode == 0, result.stderr
    else:
        dlfs("pack", archive, dst, "--shard-size", str(SMALL_SHARD), *flags, timeout=300)
    with mounted(dst, tmp_path / "mnt") as mnt:
        return listing(mnt)


def without_symlink_times(entries: dict[bytes, Entry]) -> dict[bytes, Entry]:
    """``entries`` but for symlinks' mtimes, which ``unzip`` does not restore."""
    return {
        path: (*entry[:4], None, *entry[5:]) if entry[0] == stat.S_IFLNK else entry
        for path, entry in entries.items()
    }


def pack_and_compare(
    tmp_path: Path, archive: Path, *flags: str, stdin: bool = False, tar: str = "tar"
) -> None:
    """Pack and mount ``archive``: what the mount shows is what ``tar x`` (by ``tar``: see
    ``extract``) or ``unzip`` extract."""
    got = pack_and_mount_listing(tmp_path, archive, *flags, stdin=stdin)
    expected = listing(extract(archive, tmp_path / "extracted", tar))
    if zipfile.is_zipfile(archive) and not tarfile.is_tarfile(archive):
        got, expected = without_symlink_times(got), without_symlink_times(expected)
    assert got == expected


# Crafted tars --------------------------------------------------------------------------------

#: A crafted member: a (name, bytes) file, or any ``TarInfo`` (symlinks, hard links, folders).
Member = tuple[str, bytes] | tarfile.TarInfo


def tar_bytes(entries: list[Member], form: int = tarfile.GNU_FORMAT) -> bytes:
    """A tar of ``(name, bytes)`` files and crafted ``TarInfo`` members (symlinks, hard links)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=form) as out:
        for entry in entries:
            if isinstance(entry, tarfile.TarInfo):
                out.addfile(entry)
                continue
            name, data = entry
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 1_600_000_000, 0o644
            out.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def crafted_tar(path: Path, entries: list[Member]) -> Path:
    path.write_bytes(tar_bytes(entries))
    return path


def link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def folder(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, 0o755
    return info


def seal(raw: bytearray, at: int) -> None:
    """Give the tar header at ``at`` the checksum of its bytes as they are."""
    raw[at + 148 : at + 156] = b" " * 8
    raw[at + 148 : at + 156] = f"{sum(raw[at : at + 512]):06o}\0 ".encode()


def assert_refused(tmp_path: Path, archive: Path, *fragments: str, flags: tuple[str, ...] = ()) -> None:
    """One line, and no dataset published, nothing written beside it."""
    before = set(tmp_path.iterdir())
    dst = tmp_path / "dst"
    assert_one_line_error(dlfs("pack", archive, dst, *flags, check=False), *fragments)
    assert not (dst / fmt.INDEX_NAME).exists()
    assert not dst.exists(), "a refused pack leaves no destination behind"
    assert set(tmp_path.iterdir()) == before
