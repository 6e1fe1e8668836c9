"""Where measurements come from: measured on this GPU into the cache, or read from a database's
recording of the GPU with the most of them. `tables_for` decides; the CLI and scripts call it."""
from __future__ import annotations

import sqlite3
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..core.device import Provenance
from ..core.errors import CacheError, MissingMeasurementsError
from ..core.measurements import KernelTable, describe_sizes
from ..core.problem import ConvProblem
from ..execute.bindings import gpu_available
from ..measure.benchmark import Benchmarker, CudnnBenchmarker, ensure_tables
from ..measure.cache.database import BenchmarkDatabase
from ..measure.cache.memo import Cache
from ..measure.cache.merging import merge
from ..measure.cache.paths import cache_path, shard_paths
from ..optimizers.search import FULL
from .config import Settings

Progress = Callable[[int, int, ConvProblem], None]


@dataclass(frozen=True)
class Measurements:
    """Tables of kernels by problem.key, the device they were measured on, the database they are
    in, and whether they were measured here (else read from a recording)."""

    tables: dict[str, KernelTable]
    device: Provenance
    path: Path
    measured: bool


def complete_tables(problems: Sequence[ConvProblem], settings: Settings, cap: int | None, source,
                    benchmarker: Benchmarker | None, progress: Progress | None = None, *,
                    device: Provenance | None = None) -> dict[str, KernelTable]:
    """Tables of the settings' backends complete for the policy's sizes within `cap` bytes and
    for the whole batch with no cap (the unlimited reference); `source` (a Cache or database)
    lacks only what the benchmarker measures. With no benchmarker, the tables of `device`'s
    recording in `source` (`recorded_tables`)."""
    if benchmarker is None:
        if device is None:
            raise ValueError("complete_tables needs a benchmarker or the device whose measurements to use")
        return recorded_tables(problems, settings, cap, source, device, progress)
    backends, search = settings.backends(gpu=True), settings.searching
    ensure_tables(problems, settings.sizes_for, cap, source, benchmarker, progress, backends=backends, search=search)
    return ensure_tables(problems, lambda p: (p.batch,), None, source, benchmarker, backends=backends, search=search)


def recorded_tables(problems: Sequence[ConvProblem], settings: Settings, cap: int | None, source,
                    device: Provenance, progress: Progress | None = None) -> dict[str, KernelTable]:
    """The tables (by problem.key) of `device`'s recording in `source` (a Cache or database), of
    the settings' backends (offline: any stored), read in one query; MissingMeasurementsError
    unless each is complete as the settings' search needs it for the policy's sizes within `cap`
    and for the whole batch with no cap, naming what `ucudnn bench` would measure."""
    problems = list({p.key: p for p in problems}.values())
    backends, search = settings.backends(gpu=False), settings.searching
    tables = {key: table.only(backends) for key, table in source.tables(problems, device).items()}
    for sizes_for, limit, heard in ((settings.sizes_for, cap, progress), (lambda p: (p.batch,), None, None)):
        for done, p in enumerate(problems):
            if heard:
                heard(done, len(problems), p)
            if search.missing(tables[p.key], sizes_for(p), limit):  # named as `ucudnn bench` would fill them
                _refuse_missing(p, FULL.missing(tables[p.key], sizes_for(p), limit), device, backends)
        if heard and problems:
            heard(len(problems), len(problems), problems[-1])
    return tables


def _refuse_missing(p: ConvProblem, missing: Sequence[int], device: Provenance, backends: Sequence[str]) -> None:
    """MissingMeasurementsError naming the `missing` sizes of `p` on `device`, if any."""
    if missing:
        missing = sorted(missing)
        which = f" of backend {'/'.join(backends)}" if backends else ""
        raise MissingMeasurementsError(
            f"no measurements{which} of {p.describe()} at {describe_sizes(missing)} on "
            f"{device.describe()} in the cache, and no GPU to measure them; run `ucudnn bench` "
            "for this network on such a GPU, or point --cache at a database that has them",
            problem=p, missing=missing)


def open_database(path: str | Path | None, check: bool = True) -> BenchmarkDatabase:
    """The benchmark database at `path`, read-only, checked whole unless `check` is False; a
    shard folder reads as its shards merged (`MergedShards`); an error naming the fix where there
    is none or it is damaged."""
    if path is None:
        raise MissingMeasurementsError("no recorded measurements are shipped with this ucudnn; "
                                       "pass --cache FILE with a database from `ucudnn bench`")
    if Path(path).is_dir():
        shards = shards_in(path)
        return open_database(shards[0], check) if len(shards) == 1 else MergedShards(Path(path), shards)
    if not Path(path).is_file():
        raise CacheError(f"no benchmark database at {path}; pass --cache FILE with one from `ucudnn bench`")
    try:
        return BenchmarkDatabase(path, readonly=True, check=check)
    except sqlite3.DatabaseError as exc:
        raise CacheError(f"{path} is not a usable benchmark database ({exc}); check the path") from None


def shards_in(folder: str | Path) -> list[Path]:
    """The shard files of a shard folder; an error naming the fix where it holds none."""
    shards = shard_paths(folder)
    if not shards:
        raise CacheError(f"{folder} holds no shard files (*.db); pass --cache FILE with a database from "
                         "`ucudnn bench`, or a folder of the shards it wrote")
    return shards


class MergedShards(BenchmarkDatabase):
    """The shards of a folder merged as `ucudnn cache merge` merges them (no shard is written; a
    row that breaks the rules is skipped with a warning naming its shard), into a temporary file
    that close() removes; read-only, and `path` is the folder."""

    def __init__(self, folder: Path, shards: list[Path]):
        self._scratch = tempfile.TemporaryDirectory(prefix="ucudnn-shards-")
        merged = Path(self._scratch.name) / "merged.db"
        try:
            merge(shards, merged, skip_bad=True)
            super().__init__(merged, readonly=True)
        except BaseException:
            self._scratch.cleanup()
            raise
        self.path = folder

    def close(self) -> None:
        super().close()
        self._scratch.cleanup()


def devices_in(database: BenchmarkDatabase) -> list[Provenance]:
    """One provenance per (GPU, cuDNN, execution): what measurements are shared by."""
    return list({d.reuse_key: d for d in database.devices()}.values())


def device_with_most(database: BenchmarkDatabase, problems: Iterable[ConvProblem], execution: str) -> Provenance:
    """Of the GPUs in a database measured for `execution`, the one with measurements of the
    most of these kernels."""
    every = devices_in(database)
    devices = [d for d in every if d.execution == execution]
    if not devices:
        others = sorted({d.execution for d in every})
        hint = f"it has {' and '.join(others)} execution measurements: pass --execution {others[0]}, or " if others else ""
        raise MissingMeasurementsError(f"the database {database.path} holds no measurements timed for {execution} "
                                       f"execution; {hint}fill it with `ucudnn bench --execution {execution}` on a GPU")
    problems = list(problems)
    return max(devices, key=lambda d: sum(len(t) > 0 for t in database.tables(problems, d).values()))


def tables_for(problems: Sequence[ConvProblem], settings: Settings, cap: int | None, *,
               measure: bool | None = None, progress: Progress | None = None,
               explain: Callable[[MissingMeasurementsError, BenchmarkDatabase, Provenance], Exception] | None = None
               ) -> Measurements:
    """Tables complete for the policy's sizes within `cap` and for the whole batch (see
    `complete_tables`): measured on this GPU into the cache where `measure` (default: where a GPU
    is usable), else read from the database's recording of the GPU with the most of them. Missing
    ones raise MissingMeasurementsError, or what `explain(error, database, device)` makes of it."""
    problems = list(problems)
    measure = gpu_available() if measure is None else measure
    benchmarker: CudnnBenchmarker | None = None
    recording: BenchmarkDatabase | None = None
    if measure:
        benchmarker = CudnnBenchmarker(execution=settings.execution, backend=settings.backend)
        source: Cache | BenchmarkDatabase = Cache(cache_path(settings.cache_path))
        device = benchmarker.device
    else:
        source = recording = open_database(cache_path(settings.cache_path, readonly=True))
        device = device_with_most(recording, problems, settings.execution)
    try:
        tables = complete_tables(problems, settings, cap, source, benchmarker, progress, device=device)
    except MissingMeasurementsError as exc:
        if explain is None or recording is None:
            raise
        raise explain(exc, recording, device) from None
    finally:
        source.close()
    assert source.path is not None  # a Cache made with its file
    return Measurements(tables, device, Path(source.path), measure)
