"""The database schema, its version (PRAGMA user_version) and the migrations of older files.

One row per measurement, provenance included, so shards merge without renumbering anything.
A row is reused only when the GPU model, the cuDNN version, the execution it was timed for and the
whole shape key match: those four are the first columns of the primary key, which is also the
index every lookup uses. The timing preset is provenance that ranks rows: a `default`-timed
measurement is never replaced by a `quick` one, whatever their order.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import sqlite_utils

from ..bindings.enums import algo_name
from ..device import TIMING_PRESETS
from ..errors import CacheError

SCHEMA_VERSION = 4
# A file this old or newer is read without migrating it (a read-only file cannot be): v4 named
# candidates by backend and name, which every read needs.
READABLE_FROM = 4

KEY = ("gpu_name", "cudnn_version", "execution", "shape_key", "batch", "backend", "algo")
MEASUREMENT_COLUMNS = {
    "gpu_name": str, "cudnn_version": int, "execution": str, "shape_key": str, "batch": int,
    "backend": str, "algo": str,
    "time_ms": float, "workspace": int, "status": str, "repeats": int,
    "compute_capability": str, "driver_version": int, "host": str, "recorded_at": str, "timing": str,
    "frontend_version": str,
}
# What rows of older files (and exports) that lack a column are given: before v2 every
# measurement was timed one host call at a time, as direct execution runs it; before v3 every
# measurement ucudnn shipped was taken with the default timing; before v4 every one was of the
# legacy API.
DEFAULTS = {"execution": "direct", "repeats": 0, "compute_capability": "", "driver_version": 0, "host": "",
            "recorded_at": "", "timing": TIMING_PRESETS[0], "backend": "legacy", "frontend_version": ""}
# A deterministic kernel (ConvProblem.deterministic) has a shape key of its own, ending in
# '|deterministic', and its JSON alone holds the field: rows of older files, and of kernels
# without the setting, read as deterministic=False as they are (no new schema version).
KERNEL_COLUMNS = {"shape_key": str, "problem": str}  # problem: ConvProblem.to_dict() JSON, batch 1

_placeholders = ", ".join(f":{c}" for c in MEASUREMENT_COLUMNS)
_updates = ", ".join(f"{c} = excluded.{c}" for c in MEASUREMENT_COLUMNS if c not in KEY)
# A default-timed measurement beats a quick one, else the newest wins, whatever order rows arrive
# in, so merging shards gives what one writer would have. (sqlite-utils' upsert cannot take this
# condition: plain SQL here.)
_RANK = "({table}.timing = '" + TIMING_PRESETS[0] + "', {table}.recorded_at)"
UPSERT_MEASUREMENT = (
    f"INSERT INTO measurements ({', '.join(MEASUREMENT_COLUMNS)}) VALUES ({_placeholders}) "
    f"ON CONFLICT ({', '.join(KEY)}) DO UPDATE SET {_updates} "
    f"WHERE {_RANK.format(table='excluded')} >= {_RANK.format(table='measurements')}"
)
INSERT_KERNEL = "INSERT INTO kernels (shape_key, problem) VALUES (:shape_key, :problem) ON CONFLICT DO NOTHING"


class NewerSchemaError(CacheError):
    """The file was written by a newer ucudnn: this one cannot read it safely."""

    def __init__(self, path: Path, found: int):
        super().__init__(
            f"benchmark database {path} has schema version {found}, but this ucudnn supports "
            f"versions up to {SCHEMA_VERSION}: upgrade ucudnn (pip install -U ucudnn), or point "
            f"UCUDNN_CACHE (or the cache path argument) at another file"
        )


def version(db: sqlite_utils.Database) -> int:
    return db.execute("PRAGMA user_version").fetchone()[0]


def check(path: Path, found: int, readonly: bool) -> bool:
    """Whether a file of version `found` needs migrating; raises if it cannot be used."""
    if found > SCHEMA_VERSION:
        raise NewerSchemaError(path, found)
    if found < READABLE_FROM and readonly:
        raise CacheError(
            f"benchmark database {path} has schema version {found}, older than {SCHEMA_VERSION}, "
            f"and is open read-only, so it cannot be migrated: open it writable once "
            f"(BenchmarkDatabase(path)) to migrate it"
        )
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
    """v0 (or a new, empty file) to v1: the two tables with every column (a new file gets the
    current table at once)."""
    if not db["measurements"].exists():
        _create_measurements(db, "measurements")
    _add_missing_columns(db["measurements"], MEASUREMENT_COLUMNS)
    db["kernels"].create(KERNEL_COLUMNS, pk="shape_key", not_null=KERNEL_COLUMNS, if_not_exists=True)


def _to_v2(db: sqlite_utils.Database) -> None:
    """v1 to v2: `execution` joins the primary key (SQLite cannot change a key in place, so the
    table is copied); v1 rows were all timed for direct execution (the column's default)."""
    if "execution" in db["measurements"].pks:
        return  # made by _to_v1 just now
    _create_measurements(db, "measurements_v2")
    old = db["measurements"].columns_dict
    values = ", ".join(c if c in old else f"'{DEFAULTS[c]}'" for c in MEASUREMENT_COLUMNS)
    db.execute(f"INSERT INTO measurements_v2 ({', '.join(MEASUREMENT_COLUMNS)}) SELECT {values} FROM measurements")
    db.execute("DROP TABLE measurements")
    db.execute("ALTER TABLE measurements_v2 RENAME TO measurements")


def _to_v3(db: sqlite_utils.Database) -> None:
    """v2 to v3: the `timing` provenance column; v2 rows were all timed with the default preset."""
    _add_missing_columns(db["measurements"], {"timing": str})


def legacy_row(row: dict) -> dict:
    """A measurement row of schema v3 or older (algorithm number, no backend) as v4 has it:
    backend 'legacy', the algorithm by cuDNN's name (ucudnn.bindings.enums.algo_name)."""
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


# MIGRATIONS[v] brings a file of version v to version v + 1.
MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [_to_v1, _to_v2, _to_v3, _to_v4]
assert len(MIGRATIONS) == SCHEMA_VERSION


def migrate(db: sqlite_utils.Database) -> None:
    """Bring the file up to SCHEMA_VERSION; call inside a write transaction."""
    for step in MIGRATIONS[version(db):]:  # read again under the lock: another process may have done it
        step(db)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
