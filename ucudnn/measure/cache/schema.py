"""The database schema, its version (PRAGMA user_version) and the migrations of older files.

One row per measurement, provenance included, so shards merge without renumbering anything.
A row is reused only when the GPU model, the cuDNN version, the execution it was timed for and the
whole shape key match: those four are the first columns of the primary key, which is also the
index every lookup uses. The timing preset is provenance that ranks rows: a `default`-timed
measurement is never replaced by a `quick` one, whatever their order.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import sqlite_utils

from ...core.accumulation import route
from ...core.device import TIMING_PRESETS
from ...core.errors import CacheError
from ...core.measurements import TAKEN
from ...core.problem import HALF_TYPES, ConvProblem
from ...execute.bindings.enums import algo_name

SCHEMA_VERSION = 5
# A file this old or newer is read without migrating it (a read-only file cannot be): v5 keeps
# measurements of parts of backward-filter sums apart from whole calls, which every read needs.
READABLE_FROM = 5

KEY = ("gpu_name", "cudnn_version", "execution", "shape_key", "batch", "accumulates", "backend", "algo")
MEASUREMENT_COLUMNS = {
    "gpu_name": str, "cudnn_version": int, "execution": str, "shape_key": str, "batch": int,
    "accumulates": int, "backend": str, "algo": str,
    "time_ms": float, "workspace": int, "status": str, "repeats": int,
    "compute_capability": str, "driver_version": int, "host": str, "recorded_at": str, "timing": str,
    "frontend_version": str,
}
# What rows of older files (and exports) that lack a column are given: before v2 every
# measurement was timed one host call at a time, as direct execution runs it; before v3 every
# measurement ucudnn shipped was taken with the default timing; before v4 every one was of the
# legacy API. `accumulates` of older rows is derived by _to_v5.
DEFAULTS = {"execution": "direct", "repeats": 0, "compute_capability": "", "driver_version": 0, "host": "",
            "recorded_at": "", "timing": TIMING_PRESETS[0], "backend": "legacy", "frontend_version": "",
            "accumulates": 0}
# A deterministic kernel (ConvProblem.deterministic) has a shape key of its own, ending in
# '|deterministic', and its JSON alone holds the field: rows of older files, and of kernels
# without the setting, read as deterministic=False as they are (no new schema version).
KERNEL_COLUMNS = {"shape_key": str, "problem": str}  # problem: ConvProblem.to_dict() JSON, batch 1

_placeholders = ", ".join(f":{c}" for c in MEASUREMENT_COLUMNS)
_updates = ", ".join(f"{c} = excluded.{c}" for c in MEASUREMENT_COLUMNS if c not in KEY)
# A row TAKEN beats one not (over the cap, out of memory, pruned), a default-timed one a quick one, else the
# newest wins, whatever order rows arrive in, so merging shards gives what one writer would have
# (ShapeTable.add keeps the first rule in memory). (sqlite-utils' upsert cannot take this
# condition: plain SQL here.)
_RANK = ("({table}.status IN (" + ", ".join(f"'{s}'" for s in TAKEN) + "), "
         "{table}.timing = '" + TIMING_PRESETS[0] + "', {table}.recorded_at)")
UPSERT_MEASUREMENT = (
    f"INSERT INTO measurements ({', '.join(MEASUREMENT_COLUMNS)}) VALUES ({_placeholders}) "
    f"ON CONFLICT ({', '.join(KEY)}) DO UPDATE SET {_updates} "
    f"WHERE {_RANK.format(table='excluded')} >= {_RANK.format(table='measurements')}"
)
INSERT_KERNEL = "INSERT INTO kernels (shape_key, problem) VALUES (:shape_key, :problem) ON CONFLICT DO NOTHING"


# What makes a file a ucudnn benchmark database: a `measurements` table with these columns (every
# version has had them) and, from version 1, a `kernels` table. ucudnn reads and writes no other
# file; a new one it makes is whole before any other process can open it (database.create).
CORE_COLUMNS = ("gpu_name", "cudnn_version", "shape_key", "batch", "algo", "time_ms", "workspace", "status")
EMPTY = "an empty file"  # what a 0-byte file is, which SQLite reads as a database without tables
SQLITE_HEADER = b"SQLite format 3\x00"  # the first bytes of every SQLite database file
UPGRADE = ("install a newer ucudnn (`ucudnn --version` names this one): a newer wheel with pip install, or in a "
           "clone git pull, then pip install .")


class NewerSchemaError(CacheError):
    """The file was written by a newer ucudnn: this one cannot read it safely."""

    def __init__(self, path: Path, found: int):
        self.path, self.found = path, found
        super().__init__(
            f"benchmark database {path} has schema version {found}, but this ucudnn supports "
            f"versions up to {SCHEMA_VERSION}: upgrade ucudnn ({UPGRADE}), or point "
            f"UCUDNN_CACHE (or the cache path argument) at another file"
        )


class OlderSchemaError(CacheError):
    """The file is of an older schema and open read-only, so it cannot be migrated."""

    def __init__(self, path: Path, found: int):
        super().__init__(
            f"benchmark database {path} has schema version {found}, older than {SCHEMA_VERSION}, and is "
            f"open read-only, so it cannot be migrated: write a migrated copy with `ucudnn cache merge "
            f"{path} --into NEW.db`, or open it writable once (ucudnn.measure.cache.BenchmarkDatabase(path)) to "
            f"migrate it in place"
        )


class ForeignFileError(CacheError):
    """The file is not a ucudnn benchmark database (CORE_COLUMNS): ucudnn neither reads nor writes it."""

    def __init__(self, path: Path, reason: str):
        self.path, self.reason = path, reason
        super().__init__(
            f"{path} is not a ucudnn benchmark database ({reason}), and ucudnn writes only its own: point "
            f"--cache (or UCUDNN_CACHE) at a ucudnn database, or at a path where none exists yet for a "
            f"new one" + ("; an empty file may be removed, and ucudnn makes a new database there"
                          if reason == EMPTY else "")
        )


def version(db: sqlite_utils.Database) -> int:
    return db.execute("PRAGMA user_version").fetchone()[0]


def _not_ours(db: sqlite_utils.Database, found: int) -> str:
    """Why the file is not a ucudnn benchmark database; '' if it is one."""
    tables = db.table_names()
    if not tables:
        return EMPTY if db.execute("PRAGMA page_count").fetchone()[0] == 0 else "an SQLite database without tables"
    columns = db["measurements"].columns_dict if "measurements" in tables else {}
    if any(c not in columns for c in CORE_COLUMNS):
        return f"an SQLite database whose tables ({', '.join(sorted(tables))}) are not ucudnn's"
    if found > 0 and "kernels" not in tables:
        return f"ucudnn's measurements table at version {found}, but no kernels table"
    return ""


def is_database(path: Path) -> bool:
    """Whether `path` is an SQLite database file, ucudnn's or another program's (its first bytes
    are SQLite's header)."""
    if not path.is_file():
        return False
    with open(path, "rb") as file:
        return file.read(len(SQLITE_HEADER)) == SQLITE_HEADER


def identify(db: sqlite_utils.Database, path: Path) -> int:
    """The schema version of a ucudnn benchmark database; ForeignFileError if the file is not one,
    NewerSchemaError if a newer ucudnn wrote it."""
    found = version(db)
    reason = _not_ours(db, found)
    if reason:
        raise ForeignFileError(path, reason)
    if found > SCHEMA_VERSION:
        raise NewerSchemaError(path, found)
    return found


def check(path: Path, found: int, readonly: bool) -> bool:
    """Whether a file of version `found` needs migrating; OlderSchemaError if it cannot be."""
    if found < READABLE_FROM and readonly:
        raise OlderSchemaError(path, found)
    return found < SCHEMA_VERSION and not readonly


def _add_missing_columns(table: sqlite_utils.db.Table, columns: dict) -> None:
    """Add the (non-key) columns an older file's table lacks."""
    for name, kind in columns.items():
        if name not in table.columns_dict:
            table.add_column(name, kind, not_null_default=DEFAULTS.get(name))


def _create_measurements(db: sqlite_utils.Database, name: str) -> None:
    create = db.create_table_sql(name, MEASUREMENT_COLUMNS, pk=KEY, defaults=DEFAULTS,
                                 not_null=(*KEY, "workspace", "status", *DEFAULTS))
    # stored in primary key order: a lookup reads one b-tree, and the file is a third smaller
    db.execute(create.strip().rstrip(";") + " WITHOUT ROWID")


def _to_v1(db: sqlite_utils.Database) -> None:
    """v0 (or the new file database.create makes) to v1: the two tables with every column (a new
    file gets the current table at once)."""
    if not db["measurements"].exists():
        _create_measurements(db, "measurements")
    _add_missing_columns(db.table("measurements"), MEASUREMENT_COLUMNS)
    db.table("kernels").create(KERNEL_COLUMNS, pk="shape_key", not_null=KERNEL_COLUMNS, if_not_exists=True)


def _to_v2(db: sqlite_utils.Database) -> None:
    """v1 to v2: `execution` joins the primary key (SQLite cannot change a key in place, so the
    table is copied); v1 rows were all timed for direct execution (the column's default)."""
    if "execution" in db.table("measurements").pks:
        return  # made by _to_v1 just now
    _create_measurements(db, "measurements_v2")
    old = db["measurements"].columns_dict
    values = ", ".join(c if c in old else f"'{DEFAULTS[c]}'" for c in MEASUREMENT_COLUMNS)
    db.execute(f"INSERT INTO measurements_v2 ({', '.join(MEASUREMENT_COLUMNS)}) SELECT {values} FROM measurements")
    db.execute("DROP TABLE measurements")
    db.execute("ALTER TABLE measurements_v2 RENAME TO measurements")


def _to_v3(db: sqlite_utils.Database) -> None:
    """v2 to v3: the `timing` provenance column; v2 rows were all timed with the default preset."""
    _add_missing_columns(db.table("measurements"), {"timing": str})


def legacy_row(row: dict) -> dict:
    """A measurement row of schema v3 or older (algorithm number, no backend) as v4 has it:
    backend 'legacy', the algorithm by cuDNN's name (ucudnn.execute.bindings.enums.algo_name)."""
    if "backend" in row and not str(row["algo"]).lstrip("-").isdigit():
        return row
    kind = row["shape_key"].split("|", 1)[0]
    return {**DEFAULTS, **row, "backend": "legacy", "algo": algo_name(kind, int(row["algo"]))}


def _to_v4(db: sqlite_utils.Database) -> None:
    """v3 to v4: candidates named `backend`, `algo` (text) in the key, and the frontend's version
    as provenance; every older row is of the legacy API (the table is copied: the key changes;
    a table that earlier steps made with the v4 columns gets its algorithm numbers named)."""
    _create_measurements(db, "measurements_v4")
    columns = list(MEASUREMENT_COLUMNS)
    insert = f"INSERT INTO measurements_v4 ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
    rows = db.execute("SELECT * FROM measurements")
    names = [d[0] for d in rows.description]
    for chunk in iter(lambda: rows.fetchmany(10_000), []):
        converted = (legacy_row(dict(zip(names, values))) for values in chunk)
        db.conn.executemany(insert, [tuple(r[c] for c in columns) for r in converted])
    db.execute("DROP TABLE measurements")
    db.execute("ALTER TABLE measurements_v4 RENAME TO measurements")


def v4_accumulates(rows: list[dict], problems: dict[str, ConvProblem]) -> list[dict]:
    """Rows of schema v4 or older (no `accumulates`), as v5 has them. v4 kept one row per
    micro-batch size of a shape key: a backward-filter row was timed as a part of a sum where the
    kernel it was measured for had more samples. That kernel is taken to be the largest size of
    its shape key (and backend) measured by the time of the row's call (rows one call recorded
    share `recorded_at`; rows without it are taken as of the latest call). The rows that cannot
    stand are dropped, to be measured again: half-precision legacy parts (their sum was in the
    half output, with no buffers in their workspace; parts now sum in a float32 accumulator,
    ucudnn.core.accumulation). An engine part whose workspace is below the buffers every part holds
    was a whole call: it is kept as one. `problems`: the kernels by shape key."""
    group = lambda r: (r["gpu_name"], r["cudnn_version"], r["execution"], r["shape_key"], r["backend"])  # noqa: E731
    calls: dict[tuple, dict[str, int]] = {}  # group -> recorded_at -> the largest size of that call
    for r in rows:
        call = calls.setdefault(group(r), {})
        call[r["recorded_at"]] = max(call.get(r["recorded_at"], 0), r["batch"])
    kernel: dict[tuple, int] = {}  # (group, recorded_at) -> the largest size measured by then
    for g, call in calls.items():
        undated, largest = call.get("", 0), 0
        for recorded_at in sorted(call):  # ISO times sort in time order
            largest = max(largest, call[recorded_at])
            kernel[g, recorded_at] = max(largest, undated)
        kernel[g, ""] = largest
    kept = []
    for r in rows:
        problem = problems.get(r["shape_key"])
        summed = False
        if problem is not None and problem.kind.value == "BF" and r["batch"] < kernel[group(r), r["recorded_at"]]:
            if r["backend"] == "legacy" and problem.dtype in HALF_TYPES:
                continue
            summed = r["backend"] == "legacy" or r["workspace"] >= route(
                problem.with_batch(r["batch"]), 1, 3, 1.0, 0.0, blends=False).buffer_bytes
        kept.append({**r, "accumulates": int(summed)})
    return kept


def kernel_problems(db: sqlite_utils.Database) -> dict[str, ConvProblem]:
    """The kernels a file describes, by shape key (batch 1)."""
    return {row["shape_key"]: ConvProblem.from_dict(json.loads(row["problem"])) for row in db["kernels"].rows}


def _to_v5(db: sqlite_utils.Database) -> None:
    """v4 to v5: `accumulates` joins the key (the table is copied); see v4_accumulates."""
    rows = [dict(r) for r in db["measurements"].rows]
    _create_measurements(db, "measurements_v5")
    columns = list(MEASUREMENT_COLUMNS)
    insert = f"INSERT INTO measurements_v5 ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
    converted = v4_accumulates(rows, kernel_problems(db))
    db.conn.executemany(insert, [tuple(r[c] for c in columns) for r in converted])
    db.execute("DROP TABLE measurements")
    db.execute("ALTER TABLE measurements_v5 RENAME TO measurements")


# MIGRATIONS[v] brings a file of version v to version v + 1.
MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [_to_v1, _to_v2, _to_v3, _to_v4, _to_v5]
assert len(MIGRATIONS) == SCHEMA_VERSION


def migrate(db: sqlite_utils.Database) -> None:
    """Bring the file up to SCHEMA_VERSION; call inside a write transaction."""
    for step in MIGRATIONS[version(db):]:  # read again under the lock: another process may have done it
        step(db)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
