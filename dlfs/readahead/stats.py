"""The read-ahead's counters, shown under ``readahead`` in ``.dlfs/stats``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ReadAheadStats:
    issued_files: int = 0
    issued_bytes: int = 0
    storage_reads: int = 0
    pushed_files: int = 0
    push_refused: int = 0
    held_files: int = 0
    used_files: int = 0
    wasted_files: int = 0
    restarts: int = 0
    misses_ahead: int = 0
    already_cached: int = 0
    load_cpu_seconds: float = 0.0
    push_cpu_seconds: float = 0.0
    revealed_dirs: int = 0
    forgotten_ahead: int = 0
    handed_over: int = 0
    cold_batches: int = 0
    native_cpu_seconds: float = 0.0
    pauses: int = 0
    resumes: int = 0

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in self.__dict__.items()}
