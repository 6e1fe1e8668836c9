"""Rows into a benchmark database: a measurement as its row, and adding rows in a transaction of
the caller's with an account of what each row did (`Added`). Of each key, the measurement that
ranks highest is kept (schema.UPSERT_MEASUREMENT)."""
from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone

from ...core.device import Provenance
from ...core.measurements import Measurement
from ...core.problem import ConvProblem
from ...execute.backends import split_id
from . import schema

# What adding rows does (`Added`): the keys given, each once, and the database's measurements of
# them as they were before the write, compared with what they are after it
_KEYS = ", ".join(schema.KEY)
_GIVEN = f"CREATE TEMP TABLE given_keys ({_KEYS}, PRIMARY KEY ({_KEYS}))"
_ADD_KEY = f"INSERT OR IGNORE INTO temp.given_keys VALUES ({', '.join('?' * len(schema.KEY))})"
_STORED = (f"CREATE TEMP TABLE stored AS SELECT measurements.* FROM measurements "
           f"JOIN temp.given_keys USING ({_KEYS})")
_REPLACED = (f"SELECT count(*) FROM temp.stored s JOIN measurements m USING ({_KEYS}) WHERE "
             + " OR ".join(f"s.{c} IS NOT m.{c}" for c in schema.MEASUREMENT_COLUMNS if c not in schema.KEY))


def measurement_row(device: Provenance, shape_key: str, m: Measurement, recorded_at: str) -> dict:
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


def kernel_row(problem: ConvProblem) -> dict:
    return {"shape_key": problem.shape_key(), "problem": json.dumps(problem.with_batch(1).to_dict())}


def recorded(problem: ConvProblem, device: Provenance,
             measurements: Iterable[Measurement]) -> tuple[list[dict], list[dict]]:
    """The kernel row and the measurement rows of measurements of `problem` taken on `device`,
    stamped with the time now."""
    now = datetime.now(timezone.utc).isoformat(timespec="microseconds")
    shape_key = problem.shape_key()
    return [kernel_row(problem)], [measurement_row(device, shape_key, m, now) for m in measurements]


@dataclass(frozen=True)
class Added:
    """What adding measurement rows to a database did (`add`): each of the `rows` given is `new`
    (of a key the database lacked), `replaced` the database's measurement of its key, left it
    `unchanged` (the database's is the same or ranks higher, and stays), or is one of the
    `duplicates` (a key given more than once counts once: its row that ranks highest, of equals
    the later)."""

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


def upsert(conn: sqlite3.Connection, kernels: list[dict], measurements: list[dict]) -> None:
    """Kernel and measurement rows into `conn`'s database, inside the caller's transaction."""
    conn.executemany(schema.INSERT_KERNEL, kernels)
    conn.executemany(schema.UPSERT_MEASUREMENT, measurements)


def _count(conn: sqlite3.Connection) -> int:
    return conn.execute("SELECT count(*) FROM measurements").fetchone()[0]


def add(conn: sqlite3.Connection, kernels: list[dict], measurements: list[dict]) -> Added:
    """`upsert` the rows, inside the caller's transaction, and say what each did."""
    keys = [tuple(row[column] for column in schema.KEY) for row in measurements]
    before = _count(conn)
    conn.execute(_GIVEN)
    conn.executemany(_ADD_KEY, keys)
    conn.execute(_STORED)
    upsert(conn, kernels, measurements)
    (distinct,), (replaced,) = (conn.execute(sql).fetchone()
                                for sql in ("SELECT count(*) FROM temp.given_keys", _REPLACED))
    conn.execute("DROP TABLE temp.given_keys")
    conn.execute("DROP TABLE temp.stored")
    return Added(len(measurements), len(measurements) - distinct, _count(conn) - before, replaced)
