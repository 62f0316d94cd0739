"""``dlfs pack``: re-lay a directory tree into shards plus one index.

The walk is breadth-first with each directory's entries sorted by name bytes, which is exactly the
row order the index wants. File bytes are read by a thread pool (reads release the GIL), checksummed
and optionally compressed there, and appended to shards in placement order by one writer. The index
is published last with an atomic rename, and shard names carry the new dataset id, so an interrupted
or failed pack never disturbs a dataset that already mounts and never leaves one that does.
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import xxhash
from tqdm import tqdm

from dlfs import __version__
from dlfs import format as fmt
from dlfs.errors import DatasetError, PackError
from dlfs.index import Index
from dlfs.store import LocalStore, ShardWriter, Store

log = logging.getLogger(__name__)

STREAM_CHUNK = 8 << 20
#: Bytes the read-ahead pool may hold at once; keeps pack's memory flat on any tree.
MAX_INFLIGHT_BYTES = 256 << 20
ORDERS = ("source", "random")
#: A pool task reads up to this many files or bytes, so tiny files do not drown in task overhead.
BATCH_FILES = 64
BATCH_BYTES = 4 << 20
#: Bytes a reader gathers from neighbouring slots before writing them in one call (``_SlotRun``).
GATHER_BYTES = 256 << 10
#: Files between refreshes of the files/s figure on the progress bar.
PROGRESS_EVERY = 256


#: Readers: two per core, at most 8. Each writes what it has read at once, so more readers than
#: that only evict each other's bytes from the caches: 20k JPEGs packed warm in 2.0-2.2 s with 4
#: on 2 cores, 2.9-3.1 s with 8; from a cold disk 2, 4 or 8 made no difference (4.0-4.7 s).
DEFAULT_JOBS = min(8, 2 * (os.cpu_count() or 1))


@dataclass(frozen=True)
class PackOptions:
    shard_size: int = 1 << 30
    jobs: int = DEFAULT_JOBS
    compress: bool = False
    order: str = "source"
    seed: int = 0
    force: bool = False
    skip_errors: bool = False
    progress: bool = True
    #: Wait for the disk before publishing the index; off, pack is as safe as tar or cp: a power
    #: loss soon after may leave shards shorter than the index says, which the mount refuses.
    sync: bool = True


@dataclass
class PackSummary:
    dataset_id: str = ""
    files: int = 0
    directories: int = 0
    symlinks: int = 0
    bytes: int = 0
    stored_bytes: int = 0
    compressed_files: int = 0
    shards: int = 0
    index_bytes: int = 0
    seconds: float = 0.0
    skipped_special: int = 0
    skipped_errors: int = 0
    skipped_paths: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class _Tree:
    """Column lists filled by the walk; pack may hold per-file objects, mount may not."""

    parent: list[int] = field(default_factory=list)
    names: list[bytes] = field(default_factory=list)
    mode: list[int] = field(default_factory=list)
    uid: list[int] = field(default_factory=list)
    gid: list[int] = field(default_factory=list)
    size: list[int] = field(default_factory=list)
    mtime: list[int] = field(default_factory=list)
    links: dict[int, bytes] = field(default_factory=dict)
    dir_paths: dict[int, bytes] = field(default_factory=dict)

    def add(self, parent: int, name: bytes, st: os.stat_result) -> int:
        self.parent.append(parent)
        self.names.append(name)
        self.mode.append(st.st_mode)
        self.uid.append(st.st_uid)
        self.gid.append(st.st_gid)
        self.size.append(st.st_size)
        self.mtime.append(st.st_mtime_ns)
        return len(self.parent) - 1

    def path(self, row: int) -> bytes:
        return self.dir_paths[self.parent[row]] + b"/" + self.names[row]


def _fail_or_skip(message: str, options: PackOptions, summary: PackSummary, path: bytes) -> None:
    if not options.skip_errors:
        raise PackError(f"{message}; fix it or pass --skip-errors")
    log.warning("skipping: %s", message)
    summary.skipped_errors += 1
    summary.skipped_paths.append(os.fsdecode(path))


def _list_dir(path: bytes) -> list[tuple[bytes, os.stat_result]] | OSError:
    """One directory's entries, sorted by name bytes, with lstat results (a pool task)."""
    try:
        with os.scandir(path) as it:
            entries = sorted(it, key=lambda e: e.name)
        return [(e.name, e.stat(follow_symlinks=False)) for e in entries]
    except OSError as exc:
        return exc


def _walk(src: bytes, options: PackOptions, summary: PackSummary, pool: ThreadPoolExecutor) -> _Tree:
    """Breadth-first, one level at a time, the level's directories listed in parallel.

    Results are consumed in row order, so rows come out exactly as a sequential BFS would number
    them; the pool only overlaps the ``lstat`` calls, which dominate on a cold tree.
    """
    tree = _Tree()
    tree.add(fmt.ROOT_ROW, b"", os.lstat(src))
    tree.dir_paths[fmt.ROOT_ROW] = src
    level = [fmt.ROOT_ROW]
    while level:
        next_level = []
        listings = pool.map(_list_dir, [tree.dir_paths[row] for row in level])
        for row, listing in zip(level, listings, strict=True):
            path = tree.dir_paths[row]
            if isinstance(listing, OSError):
                _fail_or_skip(f"cannot list {os.fsdecode(path)}: {listing.strerror}", options, summary, path)
                continue
            for name, st in listing:
                kind = stat.S_IFMT(st.st_mode)
                child_path = path + b"/" + name
                if kind not in (stat.S_IFREG, stat.S_IFDIR, stat.S_IFLNK):
                    log.warning("skipping special file %s", os.fsdecode(child_path))
                    summary.skipped_special += 1
                    continue
                child = tree.add(row, name, st)
                if kind == stat.S_IFDIR:
                    tree.dir_paths[child] = child_path
                    next_level.append(child)
                elif kind == stat.S_IFLNK:
                    tree.links[child] = os.readlink(child_path)
        level = next_level
    return tree


def _depth_first(parent: np.ndarray, is_dir: np.ndarray) -> np.ndarray:
    """Rows in sorted tree (pre-)order, the natural 'source' placement: a folder's files stay together."""
    first = np.searchsorted(parent[1:], np.arange(parent.size), side="left") + 1
    last = np.searchsorted(parent[1:], np.arange(parent.size), side="right") + 1
    out: list[int] = []
    stack = [fmt.ROOT_ROW]
    while stack:
        row = stack.pop()
        out.append(row)
        if is_dir[row]:
            stack.extend(range(int(last[row]) - 1, int(first[row]) - 1, -1))
    return np.asarray(out, dtype=np.int64)


#: Keeps the placement's random stream apart from every epoch order's: ``default_rng(seed)`` equals
#: ``default_rng([seed, 0])``, so with a plain seed, epoch 0 of the uniform order read the shards
#: front to back -- a sequential read passed off as a shuffle.
PLACEMENT_STREAM = 0x7061636B


def placement_order(tree_parent: np.ndarray, mode: np.ndarray, order: str, seed: int) -> np.ndarray:
    """File rows in the order their bytes are laid into shards."""
    kinds = mode & fmt.TYPE_MASK
    rows = _depth_first(tree_parent, kinds == stat.S_IFDIR)
    files = rows[kinds[rows] == stat.S_IFREG]
    if order == "random":
        files = np.random.default_rng([seed, PLACEMENT_STREAM]).permutation(files)
    return files


def _read_whole(path: bytes, size_hint: int) -> bytes:
    """The file's bytes; one read call when the size seen by the walk is still right."""
    # O_NOFOLLOW: the walk saw a regular file; never follow a symlink swapped in since.
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        data = os.read(fd, size_hint + 1)
        if len(data) <= size_hint:
            return data
        chunks = [data]
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


@dataclass
class _Payload:
    stored: bytes
    flags: int
    size: int
    checksum: int
    #: Already written into the slot laid out for it (``stored`` is then empty).
    in_place: bool = False


def _prepare(path: bytes, size_hint: int, compress: bool) -> _Payload:
    data = _read_whole(path, size_hint)
    stored, flags = fmt.encode_payload(data, compress)
    return _Payload(stored, flags, len(data), fmt.checksum(data))


class _ShardSink:
    """Numbered shards of about ``target`` bytes; a file never spans two.

    Filled in one of two ways. In order: ``place`` then ``write`` each payload, shard after
    shard, for payloads whose stored size is known only once read (lz4). In place: ``lay_out``
    gives every file its slot from the walk's sizes and opens every shard at once, and the
    thread that read a file writes it into its slot (``write_at``) while its bytes are still in
    that core's cache. Handed to one writer instead, the bytes are copied out of memory they
    were read into long before, which here cost more than all of tar's work: without fsyncs,
    2.2 GB of JPEGs packed in 1.2-1.35x tar cf's time in order, 0.79x (warm) and 0.58x (cold)
    in place.
    """

    def __init__(self, store: Store, dataset_id: str, target: int) -> None:
        self.store = store
        self.dataset_id = dataset_id
        self.target = target
        self.done: list[tuple[str, int]] = []
        self.created: list[str] = []
        self._writer: ShardWriter | None = None
        self._pos = 0
        #: In place: every shard's writer and how far its slots (and appends) reach.
        self.laid_out: list[ShardWriter] = []
        self._ends: list[int] = []

    def _full(self, end: int, length: int) -> bool:
        """Does a shard that reaches ``end`` take no file of ``length`` more? A file never spans
        shards, and one larger than the target gets a shard of its own."""
        return end > fmt.HEADER_SIZE and end + length > self.target

    def lay_out(self, sizes: list[int]) -> tuple[list[int], list[int]]:
        """Shard number and offset for each file, in placement order, with every shard created."""
        shards, offsets = [], []
        for size in sizes:
            if not self._ends or self._full(self._ends[-1], size):
                self._new_laid_out_shard()
            shards.append(len(self._ends) - 1)
            offsets.append(self._ends[-1])
            self._ends[-1] += size
        return shards, offsets

    def _new_laid_out_shard(self) -> None:
        number = len(self.created)
        self.created.append(fmt.shard_name(self.dataset_id, number))
        self.laid_out.append(self.store.create(self.created[-1]))
        self.laid_out[-1].write_at(0, fmt.shard_header(self.dataset_id, number))
        self._ends.append(fmt.HEADER_SIZE)

    def end(self) -> tuple[int, int]:
        """In place: where the next ``append`` goes, past every laid-out slot."""
        return len(self._ends) - 1, self._ends[-1]

    def append(self, length: int) -> tuple[int, int]:
        """In place: a slot past every laid-out one, for a file that outgrew its own since the
        walk (the last shard grows past the target)."""
        shard, offset = self.end()
        self._ends[-1] += length
        return shard, offset

    def _roll(self) -> None:
        self._close()
        name = fmt.shard_name(self.dataset_id, len(self.done))
        self.created.append(name)
        self._writer = self.store.create(name)
        self._writer.write(fmt.shard_header(self.dataset_id, len(self.done)))
        self._pos = fmt.HEADER_SIZE

    def _close(self) -> None:
        if self._writer is not None:
            self._writer.commit()
            self.done.append((self.created[-1], self._pos))
            self._writer = None

    def place(self, length: int) -> tuple[int, int]:
        """(shard number, offset) for the next ``length`` bytes; a file never spans shards."""
        if self._writer is None or self._full(self._pos, length):
            self._roll()
        return len(self.done), self._pos

    def write(self, data: bytes) -> None:
        assert self._writer is not None
        self._writer.write(data)
        self._pos += len(data)

    def finish(self) -> list[tuple[str, int]]:
        self._close()
        for number, writer in enumerate(self.laid_out):  # in place: every shard is laid out
            writer.commit(self._ends[number])
            self.done.append((self.created[number], self._ends[number]))
        self.laid_out = []
        return self.done

    def abort(self) -> None:
        for writer in [*([self._writer] if self._writer is not None else []), *self.laid_out]:
            writer.abort()
        self._writer, self.laid_out = None, []
        for name in self.created:
            self.store.delete(name)


def _prepare_batch(files: list[tuple[bytes, int]], compress: bool) -> list[_Payload | OSError]:
    """Read a run of files in one pool task: per-task overhead would dominate tiny files."""
    out: list[_Payload | OSError] = []
    for path, size_hint in files:
        try:
            out.append(_prepare(path, size_hint, compress))
        except OSError as exc:
            out.append(exc)
    return out


#: In place: a file's shard number and offset (its row -> its slot).
_Slots = Callable[[int], tuple[int, int]]


class _SlotRun:
    """Payloads bound for neighbouring slots of one shard, written in one call once they reach
    GATHER_BYTES: a JPEG or two stay in cache until written, and tiny files do not cost a write
    call each. 1.28 M files of ~32 B, with fsyncs: 75.7 / 81.5 s, against 116.4 / 114.0 s with a
    write per file (and 95-104 s for the in-order writer)."""

    def __init__(self) -> None:
        self.writer: ShardWriter | None = None
        self.start = self.end = 0
        self.payloads: list[bytes] = []

    def add(self, writer: ShardWriter, offset: int, data: bytes) -> None:
        if self.payloads and (
            writer is not self.writer or offset != self.end or self.end - self.start >= GATHER_BYTES
        ):
            self.flush()
        if not self.payloads:
            self.writer, self.start, self.end = writer, offset, offset
        self.payloads.append(data)
        self.end += len(data)

    def flush(self) -> None:
        if self.payloads:
            assert self.writer is not None
            self.writer.write_at(self.start, *self.payloads)
            self.payloads = []


def _copy_batch(
    files: list[tuple[bytes, int, int, int]], writers: list[ShardWriter]
) -> list[_Payload | OSError]:
    """Read a run of files and write each into its slot as soon as possible, while its bytes are
    in cache. A file that grew since the walk no longer fits: its bytes come back, to be
    appended."""
    out: list[_Payload | OSError] = []
    run = _SlotRun()
    for path, size_hint, shard, offset in files:
        try:
            data = _read_whole(path, size_hint)
        except OSError as exc:
            out.append(exc)
            continue
        fits = len(data) <= size_hint
        if fits:
            run.add(writers[shard], offset, data)
        out.append(_Payload(b"" if fits else data, 0, len(data), fmt.checksum(data), in_place=fits))
    run.flush()
    return out


def _batches(tree: _Tree, rows: np.ndarray) -> Iterator[list[int]]:
    """Consecutive rows grouped up to BATCH_FILES / BATCH_BYTES; a file to stream stands alone."""
    batch: list[int] = []
    size = 0
    for row in rows.tolist():
        big = tree.size[row] > fmt.WHOLE_PAYLOAD_LIMIT
        if batch and (big or len(batch) >= BATCH_FILES or size >= BATCH_BYTES):
            yield batch
            batch, size = [], 0
        if big:
            yield [row]
            continue
        batch.append(row)
        size += tree.size[row]
    if batch:
        yield batch


def _read_ahead(
    pool: ThreadPoolExecutor,
    tree: _Tree,
    rows: np.ndarray,
    options: PackOptions,
    slots: _Slots | None,
    writers: list[ShardWriter],
) -> Iterator[tuple[int, _Payload | OSError | None]]:
    """Yield (row, payload or read error) in placement order, reads running ahead in the pool;
    with ``slots`` (row -> shard, offset), each file is written in place by its reader, into
    ``writers[shard]``.

    At most MAX_INFLIGHT_BYTES and a few batches per worker are held. Files above
    WHOLE_PAYLOAD_LIMIT yield None: the writer streams them itself.
    """
    window: deque[tuple[list[int], Future[list[_Payload | OSError]] | None, int]] = deque()
    inflight = 0

    def drain_one() -> Iterator[tuple[int, _Payload | OSError | None]]:
        nonlocal inflight
        batch, future, charged = window.popleft()
        inflight -= charged
        if future is None:
            yield batch[0], None
        else:
            yield from zip(batch, future.result(), strict=True)

    for batch in _batches(tree, rows):
        if tree.size[batch[0]] > fmt.WHOLE_PAYLOAD_LIMIT:
            window.append((batch, None, 0))
        else:
            charged = sum(tree.size[row] for row in batch)
            if slots is None:
                files = [(tree.path(row), tree.size[row]) for row in batch]
                future = pool.submit(_prepare_batch, files, options.compress)
            else:
                placed = [(tree.path(row), tree.size[row], *slots(row)) for row in batch]
                future = pool.submit(_copy_batch, placed, writers)
            window.append((batch, future, charged))
            inflight += charged
        while window and (len(window) > 2 * options.jobs or inflight > MAX_INFLIGHT_BYTES):
            yield from drain_one()
    while window:
        yield from drain_one()


def _stream_into(
    write: Callable[[int, bytes], None], path: bytes, limit: int | None = None
) -> _Payload | None:
    """Copy a large file chunk by chunk (``write(position in the file, chunk)``), hashing as it
    goes; never compressed, never held whole. None: it has grown past ``limit`` bytes since the
    walk, and nothing past the limit was written."""
    hasher = xxhash.xxh3_64()
    total = 0
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        while chunk := os.read(fd, STREAM_CHUNK):
            if limit is not None and total + len(chunk) > limit:
                return None
            hasher.update(chunk)
            write(total, chunk)
            total += len(chunk)
    finally:
        os.close(fd)
    return _Payload(b"", 0, total, hasher.intdigest())


def _check_destination(src: Path, dst: Path, store: LocalStore, options: PackOptions) -> str | None:
    """Return the id of the dataset being replaced (None if none); refuse unsafe destinations."""
    if dst.exists() and not dst.is_dir():
        raise PackError(f"destination {dst} exists and is not a directory")
    real_src, real_dst = src.resolve(), dst.resolve()
    if real_dst == real_src or real_src in real_dst.parents:
        raise PackError(f"destination {dst} is inside the source {src}; choose a destination outside it")
    dst.mkdir(parents=True, exist_ok=True)
    names = store.names()
    foreign = [n for n in names if n != fmt.INDEX_NAME and not n.endswith(fmt.SHARD_SUFFIX)]
    foreign = [n for n in foreign if not n.startswith(f".{fmt.INDEX_NAME}.tmp")]
    if foreign:
        raise PackError(f"destination {dst} is not empty and is not a dlfs dataset; use an empty directory")
    if fmt.INDEX_NAME not in names:
        return None
    if not options.force:
        raise PackError(f"destination {dst} already holds a dlfs dataset; pass --force to replace it")
    try:
        return Index.load(store).dataset_id
    except DatasetError:  # an unreadable old index protects nothing; it is replaced like any leftover
        return None


def _remove_leftovers(store: Store, keep_id: str | None) -> None:
    """Delete shards and temp files from interrupted runs; keep the live dataset's shards."""
    for name in store.names():
        if name.endswith(fmt.SHARD_SUFFIX) and not (keep_id and name.startswith(keep_id + ".")):
            log.info("removing leftover %s from an interrupted pack", name)
            store.delete(name)
        elif name.startswith(f".{fmt.INDEX_NAME}.tmp"):
            store.delete(name)


def _build_arrays(tree: _Tree, columns: dict[str, np.ndarray], keep: np.ndarray) -> dict[str, np.ndarray]:
    """Index columns for the rows kept; renumbers parents where unreadable files were dropped."""
    renumber = np.cumsum(keep) - 1
    parent = renumber[np.asarray(tree.parent, dtype=np.int64)[keep]]
    kept_rows = np.flatnonzero(keep).tolist()
    names = [tree.names[r] for r in kept_rows]
    name_off = np.zeros(len(names) + 1, dtype=np.uint64)
    np.cumsum([len(n) for n in names], out=name_off[1:])
    arrays = {name: column[keep] for name, column in columns.items()}
    links = bytearray()
    for new_row, old_row in enumerate(kept_rows):
        target = tree.links.get(old_row)
        if target is not None:
            arrays["offset"][new_row] = len(links)
            arrays["stored"][new_row] = len(target)
            links.extend(target)
    arrays.update(
        parent=parent,
        name_off=name_off,
        names=np.frombuffer(b"".join(names), dtype=np.uint8),
        links=np.frombuffer(bytes(links), dtype=np.uint8),
    )
    return arrays


def pack(src: str | os.PathLike[str], dst: str | os.PathLike[str], options: PackOptions) -> PackSummary:
    """Pack ``src`` into the dataset directory ``dst``; see the module docstring for guarantees."""
    if options.order not in ORDERS:
        raise PackError(f"unknown order {options.order!r}; choose one of {', '.join(ORDERS)}")
    if options.shard_size < 4096:
        raise PackError("shard size must be at least 4 KiB")
    src_path, dst_path = Path(src), Path(dst)
    if not src_path.exists():
        raise PackError(f"source {src} does not exist")
    if not src_path.is_dir():
        raise PackError(f"source {src} is not a directory")
    store = LocalStore(dst_path, durable=options.sync)
    started = time.monotonic()
    old_id = _check_destination(src_path, dst_path, store, options)
    lock_fd = os.open(dst_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise PackError(f"another dlfs pack is writing {dst}; wait for it to finish") from exc
        _remove_leftovers(store, old_id)
        summary = _pack_locked(os.fsencode(src_path), store, options)
        if old_id:
            _remove_leftovers(store, summary.dataset_id)
    finally:
        os.close(lock_fd)
        store.close()
    summary.seconds = time.monotonic() - started
    return summary


@dataclass
class _Placed:
    """Where the write loop put each file; lists while packing, columns once at the end."""

    rows: list[int] = field(default_factory=list)
    size: list[int] = field(default_factory=list)
    shard: list[int] = field(default_factory=list)
    offset: list[int] = field(default_factory=list)
    stored: list[int] = field(default_factory=list)
    checksum: list[int] = field(default_factory=list)
    flags: list[int] = field(default_factory=list)

    def add(self, row: int, payload: _Payload, shard: int, offset: int, stored: int) -> None:
        self.rows.append(row)
        self.size.append(payload.size)
        self.shard.append(shard)
        self.offset.append(offset)
        self.stored.append(stored)
        self.checksum.append(payload.checksum)
        self.flags.append(payload.flags)


def _write_payloads(
    pool: ThreadPoolExecutor,
    tree: _Tree,
    rows: np.ndarray,
    sink: _ShardSink,
    options: PackOptions,
    summary: PackSummary,
) -> _Placed:
    """Write every file into the shards in placement order: in place where the store can (see
    ``_ShardSink``) and payloads need no compressing, else in order. Skipped files are simply
    not placed (in place, their slots stay holes)."""
    placed = _Placed()
    started = time.monotonic()
    sizes = [tree.size[row] for row in rows.tolist()]
    total = sum(sizes)
    slots = None
    if sink.store.writes_in_place and not options.compress:
        shard_at = np.zeros(len(tree.parent), dtype=np.int64)
        offset_at = np.zeros(len(tree.parent), dtype=np.int64)
        shard_at[rows], offset_at[rows] = sink.lay_out(sizes)

        def slots(row: int) -> tuple[int, int]:
            return shard_at.item(row), offset_at.item(row)

    with tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        disable=not options.progress,
        desc="pack",
        dynamic_ncols=True,
    ) as bar:
        for row, outcome in _read_ahead(pool, tree, rows, options, slots, sink.laid_out):
            path = tree.path(row)
            try:
                if isinstance(outcome, OSError):
                    raise outcome
                if slots is None:
                    payload, shard, offset = _write_in_order(sink, path, tree.size[row], outcome)
                else:
                    slot = slots(row)
                    payload, shard, offset = _write_in_place(sink, path, tree.size[row], outcome, slot)
                    sink.laid_out[slot[0]].written_through(slot[1] + tree.size[row])
            except OSError as exc:
                _fail_or_skip(f"cannot read {os.fsdecode(path)}: {exc.strerror}", options, summary, path)
                continue
            # Stored bytes: the payload's, or the file's own where it went straight to its place.
            placed.add(row, payload, shard, offset, len(payload.stored) if payload.stored else payload.size)
            summary.compressed_files += bool(payload.flags & fmt.FLAG_LZ4)
            if len(placed.rows) % PROGRESS_EVERY == 0:
                rate = len(placed.rows) / max(time.monotonic() - started, 1e-9)
                bar.set_postfix_str(f"{len(placed.rows):,} files, {rate:,.0f} files/s", refresh=False)
            bar.update(tree.size[row])
    return placed


def _write_in_order(
    sink: _ShardSink, path: bytes, size_hint: int, outcome: _Payload | None
) -> tuple[_Payload, int, int]:
    """Append a read payload, or stream a large file (``outcome`` None); (payload, shard, offset)."""
    if outcome is None:
        shard, offset = sink.place(size_hint)
        payload = _stream_into(lambda _at, chunk: sink.write(chunk), path)
        assert payload is not None  # no limit
        return payload, shard, offset
    shard, offset = sink.place(len(outcome.stored))
    sink.write(outcome.stored)
    return outcome, shard, offset


def _write_in_place(
    sink: _ShardSink, path: bytes, size_hint: int, outcome: _Payload | None, slot: tuple[int, int]
) -> tuple[_Payload, int, int]:
    """A payload its reader wrote in its slot; else stream a large file into it, and append a
    file that outgrew its slot since the walk. (payload, shard, offset)."""
    shard, offset = slot
    if outcome is not None and outcome.in_place:
        return outcome, shard, offset
    if outcome is not None:
        shard, offset = sink.append(len(outcome.stored))
        sink.laid_out[shard].write_at(offset, outcome.stored)
        return _Payload(b"", 0, outcome.size, outcome.checksum, in_place=True), shard, offset
    payload = _stream_at(sink, shard, offset, path, size_hint)
    if payload is None:  # outgrown
        shard, offset = sink.end()
        payload = _stream_at(sink, shard, offset, path)
        assert payload is not None  # no limit
        sink.append(payload.size)
    return payload, shard, offset


def _stream_at(
    sink: _ShardSink, shard: int, offset: int, path: bytes, limit: int | None = None
) -> _Payload | None:
    writer = sink.laid_out[shard]
    return _stream_into(lambda at, chunk: writer.write_at(offset + at, chunk), path, limit)


def _columns(tree: _Tree, placed: _Placed) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Index columns for every walked row, and which rows to keep (files that failed are dropped)."""
    count = len(tree.parent)
    mode = np.asarray(tree.mode, dtype=np.uint32)
    columns = {
        "mode": mode,
        "uid": np.asarray(tree.uid, dtype=np.uint32),
        "gid": np.asarray(tree.gid, dtype=np.uint32),
        "size": np.asarray(tree.size, dtype=np.uint64),
        "mtime": np.asarray(tree.mtime, dtype=np.int64),
        "shard": np.zeros(count, dtype=np.uint32),
        "offset": np.zeros(count, dtype=np.uint64),
        "stored": np.zeros(count, dtype=np.uint64),
        "checksum": np.zeros(count, dtype=np.uint64),
        "flags": np.zeros(count, dtype=np.uint8),
    }
    rows = np.asarray(placed.rows, dtype=np.int64)
    for name in ("size", "shard", "offset", "stored", "checksum", "flags"):
        columns[name][rows] = np.asarray(getattr(placed, name), dtype=columns[name].dtype)
    keep = (mode & fmt.TYPE_MASK) != stat.S_IFREG
    keep[rows] = True
    return columns, keep


def _pack_locked(src: bytes, store: Store, options: PackOptions) -> PackSummary:
    summary = PackSummary(dataset_id=fmt.new_dataset_id())
    sink = _ShardSink(store, summary.dataset_id, options.shard_size)
    with ThreadPoolExecutor(max_workers=options.jobs, thread_name_prefix="dlfs-pack") as pool:
        try:
            tree = _walk(src, options, summary, pool)
            parent = np.asarray(tree.parent, dtype=np.int64)
            rows = placement_order(
                parent, np.asarray(tree.mode, dtype=np.uint32), options.order, options.seed
            )
            placed = _write_payloads(pool, tree, rows, sink, options, summary)
            shards = sink.finish()
            arrays = _build_arrays(tree, *_columns(tree, placed))
            meta = {
                "dataset_id": summary.dataset_id,
                "created_ns": time.time_ns(),
                "dlfs_version": __version__,
                "build": {
                    "source": os.fsdecode(src),
                    "shard_size": options.shard_size,
                    "compress": "lz4" if options.compress else "none",
                    "order": options.order,
                    "seed": options.seed,
                },
                "shards": shards,
            }
            index_bytes = fmt.encode_index(arrays, meta)
            store.put_atomic(fmt.INDEX_NAME, index_bytes)
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            sink.abort()
            raise
    kinds = arrays["mode"] & fmt.TYPE_MASK
    summary.files = int(np.count_nonzero(kinds == stat.S_IFREG))
    summary.directories = int(np.count_nonzero(kinds == stat.S_IFDIR))
    summary.symlinks = int(np.count_nonzero(kinds == stat.S_IFLNK))
    summary.bytes = int(arrays["size"][kinds == stat.S_IFREG].sum())
    summary.stored_bytes = sum(size for _, size in shards)
    summary.shards = len(shards)
    summary.index_bytes = len(index_bytes)
    return summary
