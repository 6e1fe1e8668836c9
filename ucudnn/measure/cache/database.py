"""The file database of raw measurements with their provenance, shared by processes and nodes:
opening a file (past the journal of an interrupted write), its transactions, and reading its rows.
Rows written (adding), the export format (interchange), files written whole (files) and merging
shards (merging) are modules of their own."""
from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TextIO, TypeVar

import sqlite_utils

from ...core.device import Provenance
from ...core.errors import DamagedDatabaseError, InterruptedWriteError
from ...core.fallback import say_once
from ...core.measurements import KernelTable, Measurement, ShapeTable
from ...core.problem import ConvProblem
from ...optimizers.pareto import plannable
from . import rows, schema
from .adding import Added, add, recorded, upsert
from .connection import connect, in_read_transaction, in_write_transaction, interrupted, retrying
from .faults import named
from .files import create, write_whole
from .interchange import check_export_path, export_text, read_export

__all__ = ["BenchmarkDatabase"]

T = TypeVar("T")

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


def _flagged(where: str = "") -> str:
    """SQL: the measurement rows `where` says, each with its `valid` flag, for reads that group
    rows. LIMIT -1 (no limit) keeps SQLite from flattening this into the outer query, which would
    evaluate the rules once per use of `valid`, not once per row."""
    return f"(SELECT *, {rows.VALID} AS valid FROM measurements {where} LIMIT -1)"


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


def named_faults(path: Path, action: Callable[[], T]) -> T:
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


def past_journal(file: Path, shown: Path, timeout_s: float, action: Callable[[], T]) -> T:
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
            named_faults(self.path, lambda: create(file))
        self._conn = named_faults(self.path, lambda: connect(file, timeout_s=timeout_s, readonly=readonly))
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

    def _read(self, action: Callable[[], T]) -> T:
        with self._lock:
            return named_faults(self.path, lambda: past_journal(self._file, self.path, self.timeout_s, action))

    def _read_one_snapshot(self, action: Callable[[], T]) -> T:
        """`_read` with every query of `action` in one read transaction: one state of the file."""
        return self._read(lambda: in_read_transaction(self._conn, action))

    def _write(self, action: Callable[[], T]) -> T:
        with self._lock:
            return named_faults(self.path, lambda: retrying(lambda: in_write_transaction(self._conn, action),
                                                            self.timeout_s))

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
        kernels, found = recorded(problem, device, measurements)
        self._write(lambda: upsert(self._conn, kernels, found))

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

    def dump(self) -> tuple[list[dict], list[dict]]:
        """Every kernel and measurement row that keeps the rules, as dicts, of one state of the file
        (what an export holds and a merge adds); the others are skipped (`_skipped`)."""
        columns = ", ".join(schema.MEASUREMENT_COLUMNS)
        kernels, measurements = self._read_one_snapshot(lambda: [self._conn.execute(sql).fetchall() for sql in (
            f"SELECT shape_key, problem, {rows.KERNEL_VALID} FROM kernels ORDER BY shape_key",
            f"SELECT {columns}, {rows.VALID} FROM measurements ORDER BY {', '.join(schema.KEY)}")])
        kept = [[row[:-1] for row in found if row[-1]] for found in (kernels, measurements)]
        if sum(map(len, kept)) < len(kernels) + len(measurements):
            self._skipped()
        return ([dict(zip(schema.KERNEL_COLUMNS, row)) for row in kept[0]],
                [dict(zip(schema.MEASUREMENT_COLUMNS, row)) for row in kept[1]])

    # --- interchange ---

    def export_json(self, path: str | os.PathLike | TextIO, *, force: bool = False) -> int:
        """Write every kernel and measurement, provenance included, to a JSON file (or a text
        stream); returns the number of measurements. `import_json` reads it back. The file is
        written whole or not at all (`write_whole`), never over a database, and over another
        existing file only with `force` (`check_export_path`)."""
        if isinstance(path, (str, os.PathLike)):
            check_export_path(Path(path), self._file, force)
        kernels, measurements = self.dump()
        text = export_text(kernels, measurements)
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
        return self._write(lambda: add(self._conn, kernels, measurements))

    def prune(self) -> tuple[int, int]:
        """Delete the measurements no plan can use (optimizers.pareto.plannable, per GPU, kernel,
        micro-batch size and backend: the dominated and unavailable candidates), and the rows that
        break the rules (ucudnn.measure.cache.rows), and compact the file. Plans from the file stay the
        same; `cache show` lists fewer candidates. Returns the measurements (before, after)."""
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
        (what it costs: docs/cache.md)."""
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


