"""The file database of raw measurements with their provenance, shared by processes and nodes."""
from __future__ import annotations

import contextlib
import functools
import json
import os
import sqlite3
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TextIO, TypeVar

import sqlite_utils

from ...core.device import Provenance
from ...core.errors import CacheError, DamagedDatabaseError, InterruptedWriteError
from ...core.fallback import say_once
from ...core.measurements import KernelTable, Measurement, ShapeTable
from ...core.problem import ConvProblem
from ...execute.backends import split_id
from . import rows, schema
from .connection import BUSY_SLICE_S, connect, in_read_transaction, in_write_transaction, interrupted, journal, retrying
from .faults import is_full, named
from .paths import default_path, recorded_path, recorded_paths, shard_path

__all__ = ["BenchmarkDatabase", "merge", "shard_path", "default_path", "recorded_path", "recorded_paths"]

T = TypeVar("T")
EXPORT_FORMAT = "ucudnn-benchmarks"
SCRATCH_SUFFIX = ".new"  # of a file written beside its place before it is put there whole (`_scratch`)

# Shape keys go in as one JSON array and come back as their index in it (small ints are cheaper
# than long strings); CROSS JOIN makes SQLite walk the keys and search the primary key for each.
# The last column says whether the row keeps the rules (rows.valid) but that of its shape key,
# whose kernel row _KERNELS_OF reads once per key, not once per row.
_LOOKUP = (
    "SELECT k.key, backend || ':' || algo, batch, time_ms, workspace, status, repeats, accumulates, "
    f"{rows.valid(without=('shape_key',))} FROM json_each(:keys) k CROSS JOIN measurements "
    "WHERE gpu_name = :gpu AND cudnn_version = :cudnn AND execution = :execution AND shape_key = k.value"
)
_KERNELS_OF = "SELECT shape_key, problem FROM kernels WHERE shape_key IN (SELECT value FROM json_each(?))"

# What adding rows does (`Added`): the keys given, each once, and the database's measurements of
# them as they were before the write, compared with what they are after it
_KEYS = ", ".join(schema.KEY)
_GIVEN = f"CREATE TEMP TABLE given_keys ({_KEYS}, PRIMARY KEY ({_KEYS}))"
_ADD_KEY = f"INSERT OR IGNORE INTO temp.given_keys VALUES ({', '.join('?' * len(schema.KEY))})"
_STORED = (f"CREATE TEMP TABLE stored AS SELECT measurements.* FROM measurements "
           f"JOIN temp.given_keys USING ({_KEYS})")
_REPLACED = (f"SELECT count(*) FROM temp.stored s JOIN measurements m USING ({_KEYS}) WHERE "
             + " OR ".join(f"s.{c} IS NOT m.{c}" for c in schema.MEASUREMENT_COLUMNS if c not in schema.KEY))


def _flagged(where: str = "") -> str:
    """SQL: the measurement rows `where` says, each with its `valid` flag, for reads that group
    rows. LIMIT -1 (no limit) keeps SQLite from flattening this into the outer query, which would
    evaluate the rules once per use of `valid`, not once per row."""
    return f"(SELECT *, {rows.VALID} AS valid FROM measurements {where} LIMIT -1)"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def _measurement_row(device: Provenance, shape_key: str, m: Measurement, recorded_at: str) -> dict:
    backend, name = split_id(m.algo)
    return {
        "gpu_name": device.gpu_name, "cudnn_version": device.cudnn_version, "execution": device.execution,
        "shape_key": shape_key, "batch": m.batch, "accumulates": int(m.accumulates), "backend": backend,
        "algo": name,
        "time_ms": m.time_ms, "workspace": m.workspace,
        "status": m.status, "repeats": m.repeats, "compute_capability": device.compute_capability,
        "driver_version": device.driver_version, "host": device.host, "recorded_at": recorded_at,
        "timing": device.timing, "frontend_version": device.frontend_version,
    }


def _kernel_row(problem: ConvProblem) -> dict:
    return {"shape_key": problem.shape_key(), "problem": json.dumps(problem.with_batch(1).to_dict())}


@functools.cache
def _new_database() -> bytes:
    """The bytes of a new, empty benchmark database of the current schema (made once, in a
    temporary folder)."""
    with tempfile.TemporaryDirectory(prefix="ucudnn-new-") as folder:
        path = Path(folder) / "new.db"
        conn = connect(path, timeout_s=BUSY_SLICE_S, readonly=False, create=True)
        try:
            in_write_transaction(conn, lambda: schema.migrate(sqlite_utils.Database(conn, execute_plugins=False)))
        finally:
            conn.close()
        return path.read_bytes()


def _problems(report: list[str]) -> list[str]:
    """The problems an SQLite check (PRAGMA quick_check, integrity_check) reports, one a line: its
    rows split at their line breaks (one row may hold many), without its heading and its 'ok'."""
    lines = [line for row in report for line in row.splitlines()]
    return [line for line in lines if line != "ok" and not line.startswith("*** in database")]


def _in_brief(check: str, problems: list[str]) -> str:
    """The problems SQLite's `check` reports, in one line: the problem, or how many and the first."""
    if len(problems) == 1:
        return problems[0]
    return f"SQLite's {check} reports {len(problems)} problems, the first: {problems[0]}"


def _named(path: Path, action: Callable[[], T]) -> T:
    """`action()`, its SQLite and file faults named for the file `path` (faults.named)."""
    try:
        return action()
    except (sqlite3.Error, OSError) as error:
        found = named(path, error)
        if found is error:
            raise
        raise found from error


def _roll_back(file: Path, shown: Path, timeout_s: float) -> None:
    """Roll back the journal of an interrupted write beside `file` through a brief writable
    connection, as the next writer's would: the file is left as its last commit made it.
    InterruptedWriteError (naming `shown`) where this process cannot write the file or its folder."""
    conn = connect(file, timeout_s=timeout_s, readonly=False)  # SQLite opens a write-protected file read-only
    try:
        conn.execute("PRAGMA schema_version")  # the first read of a connection rolls a journal back
    except sqlite3.OperationalError as error:
        if "readonly" in str(error).lower():  # SQLite's read-only errors, SQLITE_READONLY_ROLLBACK's among them
            raise InterruptedWriteError(shown, error) from None
        raise
    finally:
        conn.close()


def _past_journal(file: Path, shown: Path, timeout_s: float, action: Callable[[], T]) -> T:
    """`action()`, a read of `file`, retried while the file is locked (connection.retrying); where
    SQLite refuses a read-only connection the file until the journal of an interrupted write is
    rolled back, rolled back first (`_roll_back`)."""
    def attempt() -> T:
        try:
            return action()
        except sqlite3.OperationalError as error:
            if not interrupted(error, file):
                raise
        _roll_back(file, shown, timeout_s)
        return action()
    return retrying(attempt, timeout_s)


def _scratch(path: Path) -> Path:
    return path.with_name(f".{path.name}.{uuid.uuid4().hex}{SCRATCH_SUFFIX}")


def leftovers(folder: Path) -> list[Path]:
    """The scratch files `create` and `write_whole` left in `folder` where their process was
    killed: garbage, once no process that could be writing one there is alive."""
    return sorted(folder.glob(f".*{SCRATCH_SUFFIX}"))


def write_whole(path: Path, text: str) -> None:
    """`text` into the file `path`, written beside it and renamed into place: the file holds all of
    it or, where anything stops the write, what it held before."""
    scratch = _scratch(path)
    try:
        scratch.write_text(text, encoding="utf-8")
        os.replace(scratch, path)
    finally:
        scratch.unlink(missing_ok=True)


def check_export_path(path: Path, source: Path, force: bool) -> None:
    """CacheError unless an export of the database file `source` may be written at `path`: an
    export never replaces its own database nor any other (schema.is_database), and replaces
    another existing file only with `force`."""
    example = f"name a new file for the export, e.g. {path.with_suffix('.json')}"
    if path.exists() and path.samefile(source):
        raise CacheError(f"{path} is the database being exported; {example}")
    if schema.is_database(path):
        raise CacheError(f"{path} is a database, which an export never replaces; {example}")
    if path.exists() and not force:
        raise CacheError(f"{path} exists; name a new file for the export, or add --force to replace it")


def create(path: Path) -> None:
    """A new, empty benchmark database at `path`, written beside it in one write and linked into
    place whole, so that no process ever opens a file ucudnn has begun but not finished: a file
    without ucudnn's tables is none of ucudnn's (schema.identify). Where another process made one
    first, that one stays."""
    path.parent.mkdir(parents=True, exist_ok=True)
    content, scratch = _new_database(), _scratch(path)
    try:
        scratch.write_bytes(content)
        with contextlib.suppress(FileExistsError):
            os.link(scratch, path)
    finally:
        scratch.unlink(missing_ok=True)


@dataclass(frozen=True)
class Added:
    """What adding measurement rows to a database did (`BenchmarkDatabase.add_rows`): each of the
    `rows` given is `new` (of a key the database lacked), `replaced` the database's measurement of
    its key, left it `unchanged` (the database's is the same or ranks higher, and stays), or is one
    of the `duplicates` (a key given more than once counts once: its row that ranks highest, of
    equals the later)."""

    rows: int
    duplicates: int
    new: int
    replaced: int

    @property
    def written(self) -> int:
        return self.new + self.replaced

    @property
    def unchanged(self) -> int:
        return self.rows - self.duplicates - self.written

    def describe(self) -> str:
        """What was written and what was left out, for a message about a file's rows."""
        left = [f"{self.unchanged} where the database's is the same or ranks higher"] if self.unchanged else []
        if self.duplicates:
            left.append(f"{self.duplicates} duplicate(s) of a key in the file (of each key the higher-ranked row "
                        "is kept, else the later)")
        written = f"{self.new} new, {self.replaced} replacing the database's"
        return f"{written}; left out: {', '.join(left)}" if left else written


class BenchmarkDatabase:
    """Raw measurements t(a, b), ws(a, b) per (GPU model, cuDNN version, shape key), in one SQLite
    file that many processes may read and write at once. Thread-safe; use as a context manager
    or call close().

    A missing file is created (unless `readonly`); a file that is not a ucudnn benchmark database
    (an empty file, another program's SQLite file) is neither read nor written:
    schema.ForeignFileError. A damaged file raises DamagedDatabaseError where SQLite notices (with
    `check=True`, at once: the whole file is checked on opening), a file that cannot be written
    ReadOnlyDatabaseError at the first write; other faults raise sqlite3.Error or OSError. Reads
    skip rows that break the rules (ucudnn.measure.cache.rows), with one UcudnnWarning per database.
    `shown_as`: the path messages name, where `path` is a copy of it."""

    def __init__(self, path: str | os.PathLike, *, timeout_s: float = 60.0, readonly: bool = False,
                 check: bool = False, shown_as: str | os.PathLike | None = None):
        file = self._file = Path(path)
        self.path, self.timeout_s, self.readonly = Path(shown_as or path), timeout_s, readonly
        self._lock = threading.RLock()
        self._warned = False
        if not readonly and not file.exists():
            self._named_faults(lambda: create(file))
        self._conn = self._named_faults(lambda: connect(file, timeout_s=timeout_s, readonly=readonly))
        rows.register(self._conn)
        self._db = sqlite_utils.Database(self._conn, execute_plugins=False)
        try:
            self._prepare(check)
        except BaseException:
            self._conn.close()
            raise

    def _prepare(self, check: bool) -> None:
        if check:
            self.check()
        found = self._read(lambda: schema.identify(self._db, self.path))  # nothing written before this
        if not self.readonly:
            # WAL needs shared memory, which network filesystems lack; and WAL persists in the
            # file, so one process that turned it on would break every other node
            self._read(lambda: self._conn.execute("PRAGMA journal_mode=DELETE"))
        if schema.check(self.path, found, self.readonly):
            self._write(lambda: schema.migrate(self._db))

    def _named_faults(self, action: Callable[[], T]) -> T:
        return _named(self.path, action)

    def _read(self, action: Callable[[], T]) -> T:
        with self._lock:
            return self._named_faults(lambda: _past_journal(self._file, self.path, self.timeout_s, action))

    def _read_one_snapshot(self, action: Callable[[], T]) -> T:
        """`_read` with every query of `action` in one read transaction: one state of the file."""
        return self._read(lambda: in_read_transaction(self._conn, action))

    def _write(self, action: Callable[[], T]) -> T:
        with self._lock:
            return self._named_faults(lambda: retrying(lambda: in_write_transaction(self._conn, action),
                                                       self.timeout_s))

    def _valid(self, found: list[tuple]) -> list[tuple]:
        """The rows of a read whose last column is their `valid` flag: those that keep the rules,
        without the flag; the others are skipped (`_skipped`)."""
        kept = [row[:-1] for row in found if row[-1]]
        if len(kept) < len(found):
            self._skipped()
        return kept

    def _grouped(self, sql: str, params: tuple = ()) -> list[tuple]:
        """The groups a read finds, its last two columns max(valid) and min(valid): those with a
        row that keeps the rules, without the two; one with a row that breaks them warns (`_skipped`)."""
        found = self._read(lambda: self._conn.execute(sql, params).fetchall())
        if not all(row[-1] for row in found):
            self._skipped()
        return [row[:-2] for row in found if row[-2]]

    def _skipped(self) -> None:
        """Warn, once per database, that reads skip rows that break the rules, naming one of each kind."""
        if self._warned:
            return
        self._warned = True
        found = self.bad_rows()
        say_once(f"ucudnn: benchmark database {self.path}: skipped rows that break the rules of a "
                 f"benchmark database ({'; '.join(found)}); `ucudnn cache verify --cache {self.path}` lists "
                 f"them, `ucudnn cache prune --cache {self.path}` deletes them")

    def _upsert(self, kernels: list[dict], measurements: list[dict]) -> None:
        self._conn.executemany(schema.INSERT_KERNEL, kernels)
        self._conn.executemany(schema.UPSERT_MEASUREMENT, measurements)

    def _count(self) -> int:
        return self._conn.execute("SELECT count(*) FROM measurements").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> BenchmarkDatabase:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"BenchmarkDatabase({str(self.path)!r}{', readonly=True' if self.readonly else ''})"

    # --- measurements ---

    def record(self, problem: ConvProblem, device: Provenance, measurements: Iterable[Measurement]) -> None:
        """Store measurements of `problem`'s shape key taken on `device`, in one short transaction;
        a measurement already stored for the same (GPU, cuDNN, execution, shape key, batch, algo)
        is replaced, unless it was timed with the default preset and `device.timing` is quick."""
        now, shape_key = _now(), problem.shape_key()
        rows = [_measurement_row(device, shape_key, m, now) for m in measurements]
        self._write(lambda: self._upsert([_kernel_row(problem)], rows))

    def table(self, problem: ConvProblem, device: Provenance) -> KernelTable:
        """The measurements `problem` plans with (any micro-batch size; parts of sums or whole
        calls as the kernel runs them) on `device`'s GPU model and cuDNN version, timed for its
        execution."""
        return self.tables([problem], device)[problem.key]

    def tables(self, problems: Iterable[ConvProblem], device: Provenance) -> dict[str, KernelTable]:
        """The tables of many problems in one query, keyed by problem.key; every problem asked
        for has an entry, empty if nothing is stored for it."""
        problems = list(problems)
        found = self.lookup([p.shape_key() for p in problems], device)
        return {p.key: found[p.shape_key()].for_kernel(p) for p in problems}

    def lookup(self, shape_keys: Iterable[str], device: Provenance) -> dict[str, ShapeTable]:
        """Every measurement of each shape key on `device`, by shape key."""
        keys = list(dict.fromkeys(shape_keys))
        tables = [ShapeTable() for _ in keys]
        params = {"gpu": device.gpu_name, "cudnn": device.cudnn_version, "execution": device.execution,
                  "keys": json.dumps(keys)}
        found = self._read(lambda: self._conn.execute(_LOOKUP, params).fetchall())
        kernels = self._read(lambda: self._conn.execute(_KERNELS_OF, (params["keys"],)).fetchall())
        described = {key for key, problem in kernels if rows.describes(key, problem)}
        usable = [key in described for key in keys]
        skipped = False
        for index, algo, batch, time_ms, workspace, status, repeats, summed, valid in found:
            if valid and usable[index]:
                tables[index].add(Measurement(algo, batch, time_ms, workspace, status, repeats, bool(summed)))
            else:
                skipped = True
        if skipped:
            self._skipped()
        return dict(zip(keys, tables))

    # --- what is stored ---

    def devices(self) -> list[Provenance]:
        """Every distinct provenance (GPU, compute capability, cuDNN, driver, host, execution) present."""
        group = ("gpu_name", "compute_capability", "cudnn_version", "driver_version", "host", "execution")
        sql = (f"SELECT {', '.join(group)}, max(CASE WHEN valid THEN frontend_version END), max(valid), min(valid) "
               f"FROM {_flagged()} GROUP BY {', '.join(group)} "
               "ORDER BY gpu_name, cudnn_version, execution, host, driver_version")
        return [Provenance(**dict(zip((*group, "frontend_version"), row))) for row in self._grouped(sql)]

    def kernels(self, device: Provenance | None = None) -> list[tuple[ConvProblem, int]]:
        """Each stored kernel (as a batch-1 ConvProblem) with its number of measurements,
        on `device`'s GPU model, cuDNN version and execution if given."""
        where, params = (("WHERE gpu_name = ? AND cudnn_version = ? AND execution = ?", device.reuse_key)
                         if device else ("", ()))
        sql = (f"SELECT k.problem, sum(valid), max(valid), min(valid) "
               f"FROM kernels k JOIN {_flagged(where)} m USING (shape_key) GROUP BY k.shape_key ORDER BY k.shape_key")
        return [(ConvProblem.from_dict(json.loads(problem)), n) for problem, n in self._grouped(sql, params)]

    def _dump(self) -> tuple[list[dict], list[dict]]:
        """Every kernel and measurement row that keeps the rules, as dicts, of one state of the file."""
        columns = ", ".join(schema.MEASUREMENT_COLUMNS)
        kernels, measurements = self._read_one_snapshot(lambda: [self._conn.execute(sql).fetchall() for sql in (
            f"SELECT shape_key, problem, {rows.KERNEL_VALID} FROM kernels ORDER BY shape_key",
            f"SELECT {columns}, {rows.VALID} FROM measurements ORDER BY {', '.join(schema.KEY)}")])
        return ([dict(zip(schema.KERNEL_COLUMNS, row)) for row in self._valid(kernels)],
                [dict(zip(schema.MEASUREMENT_COLUMNS, row)) for row in self._valid(measurements)])

    # --- interchange ---

    def export_json(self, path: str | os.PathLike | TextIO, *, force: bool = False) -> int:
        """Write every kernel and measurement, provenance included, to a JSON file (or a text
        stream); returns the number of measurements. `import_json` reads it back. The file is
        written whole or not at all (`write_whole`), never over a database, and over another
        existing file only with `force` (`check_export_path`)."""
        if isinstance(path, (str, os.PathLike)):
            check_export_path(Path(path), self._file, force)
        kernels, measurements = self._dump()
        document = {"format": EXPORT_FORMAT, "schema_version": schema.SCHEMA_VERSION,
                    "kernels": kernels, "measurements": measurements}
        text = json.dumps(document, indent=1)
        if isinstance(path, (str, os.PathLike)):
            write_whole(Path(path), text)
        else:
            path.write(text + "\n")
        return len(measurements)

    def import_json(self, path: str | os.PathLike) -> Added:
        """Add the contents of an `export_json` file as `add_rows` adds rows. The whole file is
        read and checked before anything is written."""
        return self.add_rows(*read_export(path))

    def add_rows(self, kernels: list[dict], measurements: list[dict]) -> Added:
        """Add kernel and measurement rows (as `read_export` gives them) in one transaction: all of
        them or, where anything stops it (an error, Ctrl-C), none. Of each key, the measurement
        that ranks highest is kept (schema.UPSERT_MEASUREMENT); returns what each row given did."""
        keys = [tuple(row[column] for column in schema.KEY) for row in measurements]

        def add() -> Added:
            before = self._count()
            self._conn.execute(_GIVEN)
            self._conn.executemany(_ADD_KEY, keys)
            self._conn.execute(_STORED)
            self._upsert(kernels, measurements)
            (distinct,), (replaced,) = (self._conn.execute(sql).fetchone()
                                        for sql in ("SELECT count(*) FROM temp.given_keys", _REPLACED))
            self._conn.execute("DROP TABLE temp.given_keys")
            self._conn.execute("DROP TABLE temp.stored")
            return Added(len(measurements), len(measurements) - distinct, self._count() - before, replaced)
        return self._write(add)

    def prune(self) -> tuple[int, int]:
        """Delete the measurements no plan can use (optimizers.pareto.plannable, per GPU, kernel,
        micro-batch size and backend: the dominated and unavailable candidates), and the rows that
        break the rules (ucudnn.measure.cache.rows), and compact the file. Plans from the file stay the
        same; `cache show` lists fewer candidates. Returns the measurements (before, after)."""
        from ...optimizers.pareto import plannable

        groups: dict[tuple, list[Measurement]] = {}
        found = self._read(lambda: self._conn.execute(
            f"SELECT {', '.join(schema.KEY)}, time_ms, workspace, status, {rows.VALID} FROM measurements").fetchall())
        for *key, algo, time_ms, workspace, status, valid in found:
            if valid:
                groups.setdefault(tuple(key), []).append(Measurement(algo, key[4], time_ms, workspace, status))
        doomed = [(*key, m.algo) for key, kept in groups.items() for m in set(kept) - set(plannable(kept))]
        where = " AND ".join(f"{column} = ?" for column in schema.KEY)

        def delete() -> None:
            self._conn.executemany(f"DELETE FROM measurements WHERE {where}", doomed)
            self._conn.execute(f"DELETE FROM measurements WHERE NOT {rows.VALID}")
            self._conn.execute(f"DELETE FROM kernels WHERE NOT {rows.KERNEL_VALID}")
        self._write(delete)
        self._read(lambda: self._conn.execute("VACUUM"))
        valid = sum(len(kept) for kept in groups.values())
        return len(found), valid - len(doomed)

    def check(self) -> None:
        """Raise DamagedDatabaseError unless SQLite's quick check of the whole file passes
        (tens of milliseconds for the shipped file)."""
        found = _problems(self._read(lambda: [row[0] for row in self._conn.execute("PRAGMA quick_check")]))
        if found:
            raise DamagedDatabaseError(self.path, _in_brief("quick check", found))

    def verify(self, details: bool = False) -> list[str]:
        """The problems of the file, one line each; [] if none: what SQLite's integrity check
        reports (in one line, how many and the first, unless `details` asks for each) or, where
        it finds the file intact, the rules its rows break (ucudnn.measure.cache.rows; what a
        damaged file reads as rows is not what was written)."""
        def check() -> list[str]:
            integrity = _problems([row[0] for row in self._conn.execute("PRAGMA integrity_check")])
            if len(integrity) > 1 and not details:
                brief = _in_brief("integrity check", integrity)
                integrity = [f"{brief}; `ucudnn cache verify --details` lists them all"]
            return [f"integrity: {problem}" for problem in integrity] or rows.problems(self._conn)
        try:
            return self._read_one_snapshot(check)
        except DamagedDatabaseError as error:  # damaged beyond what the checks can read
            return [f"integrity: {error.reason}"]

    def bad_rows(self) -> list[str]:
        """The rules rows of the file break (ucudnn.measure.cache.rows.problems); [] if none."""
        return self._read_one_snapshot(lambda: rows.problems(self._conn))


def _not_an_export(path: str | os.PathLike, error: Exception) -> CacheError:
    return CacheError(f"{path} is not a ucudnn benchmark export ({error}); write one with "
                      f"`ucudnn cache export` (BenchmarkDatabase.export_json)")


# What reading or converting a file that is not an export raises (ValueError: bad JSON or UTF-8)
_NOT_AN_EXPORT = (ValueError, KeyError, TypeError, AttributeError)


def _schema_version(document: dict, path: str | os.PathLike) -> int:
    found = document.get("schema_version", 0)
    if type(found) is not int or found < 0:
        raise CacheError(f"schema version {found!r} is not an integer from 0 to {schema.SCHEMA_VERSION}")
    if found > schema.SCHEMA_VERSION:
        raise schema.NewerSchemaError(Path(path), found)
    return found


def _parse_export(path: str | os.PathLike) -> tuple[int, list[dict], list[dict]]:
    """The schema version of an `export_json` file, its kernel rows and its measurement rows, each
    measurement with what its version lacks (schema.DEFAULTS) and its `position` in the file;
    CacheError naming the file if it is not an export."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(document, dict) or document.get("format") != EXPORT_FORMAT:
            raise CacheError(f"no \"format\": \"{EXPORT_FORMAT}\"")
        found = _schema_version(document, path)
        kernels, measurements = list(document["kernels"]), list(document["measurements"])
        if not all(isinstance(row, dict) for row in (*kernels, *measurements)):
            raise CacheError("a row that is not a JSON object")
    except schema.NewerSchemaError:
        raise
    except (*_NOT_AN_EXPORT, CacheError) as error:
        raise _not_an_export(path, error) from None
    return found, kernels, [{**schema.DEFAULTS, **row, "position": i} for i, row in enumerate(measurements)]


def _converted(path: str | os.PathLike, found: int, kernels: list[dict], measurements: list[dict]) -> list[dict]:
    """The measurement rows of an export of schema `found` as the current schema has them,
    converted as a file's migration converts them."""
    try:
        if found < 4:  # candidates by number, no backend
            measurements = [schema.legacy_row(row) for row in measurements]
        if found < 5:  # no `accumulates` yet: derived as a file's migration does
            problems = {k["shape_key"]: ConvProblem.from_dict(json.loads(k["problem"])) for k in kernels}
            measurements = schema.v4_accumulates(measurements, problems)
    except _NOT_AN_EXPORT as error:
        raise _not_an_export(path, error) from None
    return measurements


def _check_rows(path: str | os.PathLike, kernels: list[dict], measurements: list[dict],
                without: tuple[str, ...] = ()) -> None:
    """CacheError naming the file, and a bad row, its column and value, if an export's rows break
    the rules (ucudnn.measure.cache.rows) but those of the columns `without`."""
    rows.refuse(path, rows.problems(rows.staged(kernels, measurements), without),
                "correct those values, or export the database again with `ucudnn cache export`")


def read_export(path: str | os.PathLike) -> tuple[list[dict], list[dict]]:
    """The kernel and measurement rows of an `export_json` file, every row checked against the
    rules (ucudnn.measure.cache.rows); CacheError naming the file (and a bad row, its column and value)
    if it is not an export or a row breaks a rule. The rows of an older export are checked before
    they are converted too (but algorithm numbers, which the conversion names), so that a bad
    value is named, not what converting it tripped over."""
    found, kernels, measurements = _parse_export(path)
    if found < schema.SCHEMA_VERSION:
        _check_rows(path, kernels, measurements, without=("algo",) if found < 4 else ())
        measurements = _converted(path, found, kernels, measurements)
    _check_rows(path, kernels, measurements)
    return kernels, [{column: row[column] for column in schema.MEASUREMENT_COLUMNS} for row in measurements]


@contextlib.contextmanager
def writing(path: str | os.PathLike, **options) -> Iterator[BenchmarkDatabase]:
    """`BenchmarkDatabase(path, check=True, **options)` for a command that writes into it: a
    file this makes is removed again if the command fails, so a failed command leaves nothing."""
    path = Path(path)
    existed = path.exists()
    try:
        with BenchmarkDatabase(path, check=True, **options) as database:
            yield database
    except BaseException:
        if not existed:
            for leftover in (path, journal(path)):
                leftover.unlink(missing_ok=True)
        raise


def _snapshot(shard: Path, copy: Path, timeout_s: float = 60.0) -> None:
    """`shard` copied whole into the new file `copy` by SQLite's backup API, in one read
    transaction (which the backup uses, so it never waits for a lock itself): what was committed
    when it began, never part of a write under way. A journal of an interrupted write is rolled back
    first (`_past_journal`); nothing else of the shard is written. ForeignFileError or
    NewerSchemaError (naming the shard) where ucudnn must not read it."""
    def take() -> None:
        schema.identify(sqlite_utils.Database(source, execute_plugins=False), shard)  # takes the read lock
        source.backup(target)

    def copy_whole() -> None:
        try:
            _past_journal(shard, shard, timeout_s, lambda: in_read_transaction(source, take))
        except (sqlite3.Error, OSError) as error:
            if is_full(error):  # reading the shard writes nothing that grows: the copy's folder is full
                raise named(copy, error) from error
            raise

    def opened(file: Path, **options) -> contextlib.closing:
        return contextlib.closing(_named(file, lambda: connect(file, timeout_s=timeout_s, **options)))

    with opened(shard, readonly=True) as source, opened(copy, readonly=False, create=True) as target:
        _named(shard, copy_whole)


def merge(shards: Iterable[str | os.PathLike], target: str | os.PathLike, *, skip_bad: bool = False) -> int:
    """Add every measurement of the shard files to `target` (created if absent), newest
    measurement winning, so the result is what one writer of all of them would have written.
    Returns the number of measurements read from the shards. The target itself is skipped if
    listed among the shards. Each shard is read once, whole, in one snapshot (`_snapshot`), so
    a shard being written merges as of one commit, and what is done after is on copies (an
    older schema is migrated in its copy); every shard is checked before the target is touched,
    so a damaged, unreadable or foreign shard, or one with a row that breaks the rules
    (ucudnn.measure.cache.rows), changes nothing; with `skip_bad`, such rows are left out with one
    warning per shard instead. Each shard is added in one transaction (`add_rows`): a merge
    stopped part way keeps the shards it added (a target it made is removed again, `writing`)."""
    target = Path(target)
    sources = [Path(shard) for shard in shards if Path(shard).resolve() != target.resolve()]
    with tempfile.TemporaryDirectory(prefix="ucudnn-merge-") as scratch:
        copies = [Path(scratch) / f"{i}.db" for i in range(len(sources))]
        for shard, copy in zip(sources, copies):
            _snapshot(shard, copy)
        opened = lambda i: BenchmarkDatabase(copies[i], check=True, shown_as=sources[i])  # noqa: E731
        for i in range(len(sources)):
            with opened(i) as source:
                if not skip_bad:
                    rows.refuse(source.path, source.bad_rows(), "correct or delete those rows (`ucudnn cache "
                                f"prune --cache {source.path}` deletes them), then merge again")
        merged = 0
        with writing(target) as into:
            for i in range(len(sources)):
                with opened(i) as source:
                    merged += into.add_rows(*source._dump()).rows
    return merged
