"""What the handle uses: an in-memory memo in front of an optional file database.

Repeated layers (ResNet's identical blocks) are looked up once per process. A file that cannot be
used (corrupt, truncated, read-only, locked for too long) costs one warning and nothing else: the
cache carries on in memory and kernels are benchmarked again as needed. Only a file written by a
newer ucudnn is an error, since carrying on would hide that every result is being ignored.
"""
from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from ...core.device import Provenance
from ...core.errors import CacheError
from ...core.fallback import say_once
from ...core.measurements import KernelTable, Measurement, ShapeTable
from ...core.problem import ConvProblem
from ...optimizers.configuration import Configuration
from .database import BenchmarkDatabase
from .faults import describe
from .paths import cache_path, own_shard
from .schema import NewerSchemaError

T = TypeVar("T")
FILE_FAULTS = (sqlite3.Error, OSError, CacheError)  # NewerSchemaError is re-raised before these


@dataclass
class CacheStats:
    """Counters of what the cache did since it was made."""

    memo_hits: int = 0  # kernel tables found in memory
    file_hits: int = 0  # ... found in the file (then kept in memory)
    misses: int = 0  # ... found in neither: to be benchmarked
    records: int = 0  # record() calls
    configuration_hits: int = 0
    file_errors: int = 0  # faults of the file; the first one warns and the file is set aside


def resolve_path(path: str | os.PathLike | None) -> Path:
    """The file `cache_path` picks; a directory means this process's shard in it (`own_shard`)."""
    chosen = cache_path(path)
    return own_shard(chosen) if chosen.is_dir() else chosen


class Cache:
    """Kernel tables and optimized configurations, memoized per process, backed by a file."""

    def __init__(self, path: str | os.PathLike | None = None, *, use_file: bool = True,
                 readonly: bool = False, timeout_s: float = 60.0):
        self.stats = CacheStats()
        file = resolve_path(path) if use_file else None
        self.path = file
        self._tables: dict[tuple, ShapeTable] = {}  # (device.reuse_key, shape key) -> its measurements
        self._configurations: dict[Hashable, Configuration] = {}
        self._lock = threading.RLock()
        self._warned = False
        self._file: BenchmarkDatabase | None = None
        self._writable = use_file and not readonly
        if file is not None:
            self._file = self._guard(lambda: BenchmarkDatabase(file, timeout_s=timeout_s, readonly=readonly),
                                     None, "opened")

    @property
    def using_file(self) -> bool:
        """Whether results still come from (and go to) the file."""
        return self._file is not None

    def _guard(self, action: Callable[[], T], fallback: T, verb: str = "read") -> T:
        """`action()`, or `fallback` after a file fault: a failed write stops writing, a failed
        open or read sets the file aside. `verb` (opened, read, written) says what failed."""
        try:
            return action()
        except NewerSchemaError:
            raise
        except FILE_FAULTS as error:
            self._fault(error, verb)
            self._writable = False
            if verb != "written":
                self.close()
            return fallback

    def _fault(self, error: Exception, verb: str) -> None:
        self.stats.file_errors += 1
        if not self._warned:
            self._warned = True
            say_once(f"ucudnn: {describe(self.path, error, verb)}. Carrying on with results in "
                     f"memory, so kernels may be benchmarked again")

    def close(self) -> None:
        """Stop using the file (the memo stays)."""
        file, self._file = self._file, None
        if file is not None:
            with contextlib.suppress(sqlite3.Error):
                file.close()

    # --- kernel tables ---

    def table(self, problem: ConvProblem, device: Provenance) -> KernelTable:
        """The measurements `problem` plans with (see BenchmarkDatabase.table) on `device`'s GPU
        model and cuDNN version: from memory, else from the file; empty if neither has any.
        Never raises on file faults."""
        return self.tables([problem], device)[problem.key]

    def tables(self, problems: Iterable[ConvProblem], device: Provenance) -> dict[str, KernelTable]:
        """`table` for many problems, by problem.key, with one file query for all those not in memory."""
        problems = list(problems)
        keys = list(dict.fromkeys(p.shape_key() for p in problems))
        with self._lock:
            absent = [key for key in keys if (device.reuse_key, key) not in self._tables]
            self.stats.memo_hits += len(keys) - len(absent)
            for key, found in self._from_file(absent, device).items():
                if len(found):
                    self.stats.file_hits += 1
                    self._tables[device.reuse_key, key] = found
                else:
                    self.stats.misses += 1
            empty = ShapeTable()
            return {p.key: self._tables.get((device.reuse_key, p.shape_key()), empty).for_kernel(p)
                    for p in problems}

    def _from_file(self, shape_keys: list[str], device: Provenance) -> dict[str, ShapeTable]:
        empty = {key: ShapeTable() for key in shape_keys}
        file = self._file
        if not shape_keys or file is None:
            return empty
        return self._guard(lambda: file.lookup(shape_keys, device), empty)

    def record(self, problem: ConvProblem, device: Provenance, measurements: Iterable[Measurement]) -> None:
        """Keep new measurements in memory and store them in the file. Never raises on file faults."""
        measurements = list(measurements)
        with self._lock:
            self.stats.records += 1
            key = (device.reuse_key, problem.shape_key())
            # a new table, not the old one changed: tables handed out never change under a reader;
            # with nothing in memory yet, start from what the file has
            old = self._tables[key] if key in self._tables else self._from_file([key[1]], device)[key[1]]
            self._tables[key] = ShapeTable([*old, *measurements])
            file = self._file
            if self._writable and file is not None:
                self._guard(lambda: file.record(problem, device, measurements), None, "written")

    # --- optimized configurations (memory only: they depend on limits and policies) ---

    def configuration(self, key: Hashable) -> Configuration | None:
        """The configuration remembered under `key`, e.g. (device.reuse_key, problem.key,
        policy, limit, optimizer), or None."""
        with self._lock:
            found = self._configurations.get(key)
            self.stats.configuration_hits += found is not None
            return found

    def remember(self, key: Hashable, configuration: Configuration) -> None:
        with self._lock:
            self._configurations[key] = configuration

    def __repr__(self) -> str:
        where = self.path if self.using_file else "memory only"
        return f"Cache({where}, {self.stats})"
