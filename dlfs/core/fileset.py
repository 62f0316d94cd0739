"""A dataset's file set: which of the mount's files a dataset holds, told to the mount by lookups.

A mount cannot know which files a dataset keeps: ``ImageFolder`` rooted at ``train/`` leaves out
``val/`` beside it, and its extension filter skips a stray ``Thumbs.db``. The order must be made over
exactly the dataset's files, or ranks get unequal shares. So the sampler, which holds the dataset,
describes its files to the mount, and the mount computes the order over them.

The description: the dataset's positions in ``.dlfs/files`` (the mount's files in the order the
order's positions index), sorted, as runs of consecutive positions: ``start, length, gap, length,
…`` as little-endian uint64, zlib-compressed. A dataset rooted at a folder is one run, plus one per
file it skips, so ImageNet's ``train/`` takes a few dozen bytes; its name is a digest of the runs.

The channel: a mount is read-only and its readers unprivileged, so nothing can be written to it,
but every lookup of a name reaches the daemon (control entries are never cached). The sampler looks
up ``.dlfs/set/DIGEST.K-of-N.CHUNK`` for each chunk of the description (base64url, at most
``CHUNK`` characters a name: one lookup for a dataset rooted at a folder); the lookup that completes
the set resolves, the others are not found. Once complete, ``.dlfs/set/DIGEST`` resolves (its
content: the file count) and order files named ``….set-DIGEST`` follow the set.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
import zlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

#: Base64 characters of the description in one announcing name: with the digest and two chunk
#: numbers of up to 9 digits, a name stays within the kernel's 255 bytes.
CHUNK = 190
#: Complete sets, and sets still being announced, kept at once; the oldest is forgotten (the
#: sampler announces its set again when an order file names one the mount no longer knows).
KEEP_SETS = 16
DIGEST_CHARS = 32
_CHUNK_NAME = re.compile(
    rb"([0-9a-f]{%d})\.(\d{1,9})-of-(\d{1,9})\.([A-Za-z0-9_-]{1,%d})" % (DIGEST_CHARS, CHUNK)
)
_DIGEST = re.compile(rb"[0-9a-f]{%d}" % DIGEST_CHARS)


def _digest(runs: bytes) -> str:
    return hashlib.blake2b(runs, digest_size=DIGEST_CHARS // 2).hexdigest()


class BadFileSetError(ValueError):
    """A description that does not decode to sorted distinct positions of the mount's files."""


@dataclass(frozen=True)
class FileSet:
    """The sorted, distinct positions of a dataset's files in ``.dlfs/files``."""

    positions: np.ndarray

    @functools.cached_property
    def runs(self) -> bytes:
        """``start, length, gap, length, …`` as little-endian uint64: the description, uncompressed."""
        positions = self.positions
        if not positions.size:
            return b""
        breaks = np.flatnonzero(np.diff(positions) != 1) + 1
        starts = positions[np.r_[0, breaks]]
        ends = positions[np.r_[breaks - 1, positions.size - 1]] + 1
        values = np.empty(2 * starts.size, dtype="<u8")
        values[0] = starts[0]
        values[2::2] = starts[1:] - ends[:-1]
        values[1::2] = ends - starts
        return values.tobytes()

    @functools.cached_property
    def digest(self) -> str:
        return _digest(self.runs)

    def announcements(self) -> list[str]:
        """The names to look up in ``.dlfs/set`` that hand this set to the mount, in order."""
        text = base64.urlsafe_b64encode(zlib.compress(self.runs, 9)).rstrip(b"=").decode()
        chunks = [text[k : k + CHUNK] for k in range(0, len(text), CHUNK)]
        digest = self.digest
        return [f"{digest}.{k}-of-{len(chunks)}.{chunk}" for k, chunk in enumerate(chunks)]

    @classmethod
    def from_runs(cls, runs: bytes, count: int) -> FileSet:
        """Decode a description, checking that it names distinct positions below ``count``."""
        if len(runs) % 16:
            raise BadFileSetError("the runs are not pairs of uint64")
        values = np.frombuffer(runs, dtype="<u8")
        if np.any(values > count) or np.any(values[1:] < 1):
            raise BadFileSetError("runs and gaps after the first start must be positive")
        values = values.astype(np.int64)
        if int(values.sum()) > count:
            raise BadFileSetError(f"the set reaches past the mount's {count} files")
        lengths = values[1::2]
        starts = np.cumsum(values[0::2]) + np.r_[0, np.cumsum(lengths)[:-1]]
        run_of = np.repeat(np.arange(lengths.size), lengths)
        firsts = np.r_[0, np.cumsum(lengths)[:-1]]
        return cls(starts[run_of] + np.arange(run_of.size) - firsts[run_of])

    @classmethod
    def decode(cls, text: bytes, count: int, digest: str) -> FileSet:
        """The set a complete announcement's base64 text describes, checked against its
        ``digest``, the mount holding ``count`` files; inflating stops past what any set of them
        can take."""
        try:
            packed = base64.urlsafe_b64decode(text + b"=" * (-len(text) % 4))
            inflater = zlib.decompressobj()
            runs = inflater.decompress(packed, 16 * count + 16)
        except (ValueError, zlib.error) as exc:
            raise BadFileSetError(f"undecodable description: {exc}") from exc
        if inflater.unconsumed_tail or not inflater.eof:
            raise BadFileSetError("the description is longer than any set of the mount's files")
        if _digest(runs) != digest:
            raise BadFileSetError("the description does not match its digest")
        return cls.from_runs(runs, count)


class Announced:
    """The sets announced to one mount, assembled from their chunks' names (plain Python, no FUSE).

    Bounded: at most ``KEEP_SETS`` complete sets and as many partial ones, each no longer than a
    set of all ``count`` files can be, whatever a reader looks up.
    """

    def __init__(self, count: int) -> None:
        self.count = count
        self._complete: OrderedDict[str, FileSet] = OrderedDict()
        self._partial: OrderedDict[str, dict[int, bytes]] = OrderedDict()
        self._max_chunks = (16 * count + 64) * 4 // 3 // CHUNK + 2

    def receive(self, name: bytes) -> str | None:
        """Take one announcing name; the set's digest once this name completed it, else None."""
        match = _CHUNK_NAME.fullmatch(name)
        if match is None:
            return None
        digest, k, n, chunk = (
            match.group(1).decode(),
            int(match.group(2)),
            int(match.group(3)),
            match.group(4),
        )
        if not k < n <= self._max_chunks:
            return None
        if digest in self._complete:
            self._complete.move_to_end(digest)
            return digest
        chunks = self._partial.setdefault(digest, {})
        self._partial.move_to_end(digest)
        while len(self._partial) > KEEP_SETS:
            self._partial.popitem(last=False)
        chunks[k] = chunk
        if len(chunks) < n or any(j not in chunks for j in range(n)):
            return None
        del self._partial[digest]
        try:
            found = FileSet.decode(b"".join(chunks[j] for j in range(n)), self.count, digest)
        except BadFileSetError:
            return None
        self._complete[digest] = found
        while len(self._complete) > KEEP_SETS:
            self._complete.popitem(last=False)
        return digest

    def get(self, name: bytes | str) -> FileSet | None:
        """A complete set by its digest, None when unknown (never announced, or forgotten)."""
        digest = name.decode(errors="replace") if isinstance(name, bytes) else name
        if not _DIGEST.fullmatch(digest.encode()):
            return None
        found = self._complete.get(digest)
        if found is not None:
            self._complete.move_to_end(digest)
        return found
