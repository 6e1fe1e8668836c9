"""The rules every row of a benchmark database keeps: the one check of import, merge, verify and
every read.

The rules are SQL, so that they run where the rows are: in the file for reads (a row that breaks
one is skipped), merge and verify, and in an in-memory copy of an export's rows for import
(`staged`). `problems` says which rows break which rule, naming a row and its value.

A measurement row holds, per column, what RULES says; its kernel row (same shape key) must
describe a convolution (ConvProblem.from_dict) whose shape key is that key.
"""
from __future__ import annotations

import functools
import json
import sqlite3

from ...core.device import EXECUTIONS, TIMING_PRESETS
from ...core.errors import CacheError
from ...core.measurements import OK, STATUSES, TORCH
from ...core.problem import ConvProblem
from ...execute.backends import BACKENDS
from .schema import MEASUREMENT_COLUMNS

KERNEL_FUNCTION = "ucudnn_kernel"  # the SQL function `describes` is registered as
KERNEL_VALID = f"coalesce({KERNEL_FUNCTION}(shape_key, problem), 0)"  # a kernel row that describes its key
# The shape keys of the kernel rows that describe their kernel; SQLite runs this once a statement
# (it depends on no outer row) and looks each measurement's key up in what it found
_DESCRIBED_KEYS = f"SELECT shape_key FROM kernels WHERE {KERNEL_VALID}"
SQLITE_INTEGERS = range(-2**63, 2**63)  # what SQLite stores as an integer (int64)
# A measured time, in ms: no GPU call takes less than a nanosecond or more than 11.6 days, and within
# these every sum and ratio of times a plan makes is a finite number (0 was a speedup's divisor,
# 1e300s summed to infinity in WD's solver and the plots' axes)
TIME_MS = (1e-6, 1e9)


def _integer(column: str, least: int) -> tuple[str, str]:
    return f"an integer from {least} to 2**63 - 1", f"typeof({column}) = 'integer' AND {column} >= {least}"


def _text(column: str) -> tuple[str, str]:
    return "a non-empty text", f"typeof({column}) = 'text' AND {column} != ''"


def _any_text(column: str) -> tuple[str, str]:
    return "a text", f"typeof({column}) = 'text'"


def _one_of(column: str, choices: tuple) -> tuple[str, str]:
    kind = "integer" if isinstance(choices[0], int) else "text"
    listed = ", ".join(repr(c) for c in choices)
    return f"one of {', '.join(map(str, choices))}", f"typeof({column}) = '{kind}' AND {column} IN ({listed})"


# column -> (what its value must be, the SQL condition that says so, of a row of `measurements`;
# its columns by their bare names)
RULES: dict[str, tuple[str, str]] = {
    "gpu_name": _text("gpu_name"),
    "cudnn_version": _integer("cudnn_version", 0),
    "execution": _one_of("execution", EXECUTIONS),
    "shape_key": ("the shape key of a kernel row that describes its convolution", f"shape_key IN ({_DESCRIBED_KEYS})"),
    "batch": _integer("batch", 1),
    "accumulates": _one_of("accumulates", (0, 1)),
    "backend": _one_of("backend", (*BACKENDS, TORCH)),
    "algo": _text("algo"),
    "time_ms": (f"a number from {TIME_MS[0]:g} to {TIME_MS[1]:g} (null only where the status is not {OK})",
                f"CASE WHEN time_ms IS NULL THEN status != '{OK}' ELSE typeof(time_ms) IN ('integer', 'real') "
                f"AND time_ms BETWEEN {TIME_MS[0]!r} AND {TIME_MS[1]!r} END"),
    "workspace": _integer("workspace", 0),
    "status": _one_of("status", STATUSES),
    "repeats": _integer("repeats", 0),
    "compute_capability": _any_text("compute_capability"),
    "driver_version": _integer("driver_version", 0),
    "host": _any_text("host"),
    "recorded_at": _any_text("recorded_at"),
    "timing": _one_of("timing", TIMING_PRESETS),
    "frontend_version": _any_text("frontend_version"),
}
assert list(RULES) == list(MEASUREMENT_COLUMNS)
# Each condition is 1 or 0, never NULL, so that NOT of it finds every row that breaks it.
_HOLDS = {column: f"coalesce(({sql}), 0)" for column, (_, sql) in RULES.items()}


def valid(without: tuple[str, ...] = ()) -> str:
    """SQL: whether a measurement row keeps the rules of every column but those `without`, which
    a read checks otherwise."""
    return "(" + " AND ".join(holds for column, holds in _HOLDS.items() if column not in without) + ")"


VALID = valid()  # a measurement row that keeps every rule


@functools.lru_cache(maxsize=4096)
def describes(shape_key, problem) -> bool:
    """Whether `problem` (a kernel row's JSON) is a convolution whose shape key is `shape_key`."""
    try:
        return ConvProblem.from_dict(json.loads(problem)).shape_key() == shape_key
    except Exception:  # whatever a bad description raises, it describes no convolution
        return False


def register(conn: sqlite3.Connection) -> None:
    """Make the rules' SQL function known to `conn`."""
    conn.create_function(KERNEL_FUNCTION, 2, describes, deterministic=True)


def _storable(value):
    """`value` as SQLite stores it unchanged; anything else (NaN, an integer beyond int64, a
    bool, a list) as the bytes of its repr: a blob, which no rule accepts."""
    kind = type(value)
    if value is None or kind is str or (kind is float and value == value) or (kind is int and value in SQLITE_INTEGERS):
        return value
    return repr(value).encode()


def staged(kernels: list, measurements: list) -> sqlite3.Connection:
    """An in-memory database of an export's rows as they are (columns without types, so nothing
    is converted), for `problems`; `position` is a measurement's own `position` (its place in the
    export), else its index in the list. A missing column reads as the blob '(missing)'."""
    conn = sqlite3.connect(":memory:")
    register(conn)
    columns = ", ".join(MEASUREMENT_COLUMNS)
    conn.execute(f"CREATE TABLE measurements (position, {columns})")
    conn.execute("CREATE TABLE kernels (position, shape_key, problem)")
    conn.execute("CREATE INDEX kernel_keys ON kernels (shape_key)")
    value = lambda row, column: _storable(row[column]) if column in row else b"(missing)"  # noqa: E731
    conn.executemany(f"INSERT INTO measurements VALUES (?, {', '.join('?' * len(MEASUREMENT_COLUMNS))})",
                     [(row.get("position", i), *(value(row, c) for c in MEASUREMENT_COLUMNS))
                      for i, row in enumerate(measurements)])
    conn.executemany("INSERT INTO kernels VALUES (?, ?, ?)",
                     [(i, *(value(row, c) for c in ("shape_key", "problem"))) for i, row in enumerate(kernels)])
    return conn


def _shown(value) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else repr(value)


def name(row: dict) -> str:
    """A measurement row as a message names it: by its position in an export, else by its key."""
    if "position" in row:
        return f"measurements[{row['position']}]"
    return (f"the measurement of {row['backend']}:{row['algo']} at micro-batch {row['batch']} "
            f"({'part of a sum' if row['accumulates'] == 1 else 'whole call'}) of kernel {row['shape_key']} "
            f"on {row['gpu_name']}, cuDNN {row['cudnn_version']}, {row['execution']} execution")


def _first(conn: sqlite3.Connection, sql: str) -> dict:
    cursor = conn.execute(sql)
    return dict(zip([d[0] for d in cursor.description], cursor.fetchone()))


def problems(conn: sqlite3.Connection, without: tuple[str, ...] = ()) -> list[str]:
    """Each rule that rows of `conn`'s tables break (but those of the columns `without`): how many,
    one of them and its value; [] if none."""
    checked = {column: holds for column, holds in _HOLDS.items() if column not in without}
    counts = conn.execute(f"SELECT {', '.join(f'sum(NOT {sql})' for sql in checked.values())} FROM measurements")
    found = []
    for (column, holds), count in zip(checked.items(), counts.fetchone()):
        if count:
            example = _first(conn, f"SELECT * FROM measurements WHERE NOT {holds} LIMIT 1")
            found.append(f"{count} measurement(s) whose {column} {_shown(example[column])} is not "
                         f"{RULES[column][0]}, e.g. {name(example)}")
    (count,) = conn.execute(f"SELECT count(*) FROM kernels WHERE NOT {KERNEL_VALID}").fetchone()
    if count:
        example = _first(conn, f"SELECT * FROM kernels WHERE NOT {KERNEL_VALID} LIMIT 1")
        where = f"kernels[{example['position']}] " if "position" in example else ""
        found.append(f"{count} kernel row(s) whose problem does not describe a convolution of its shape key, "
                     f"e.g. {where}{_shown(example['shape_key'])}")
    return found


def refuse(source, found: list[str], fix: str) -> None:
    """Raise CacheError naming `source` and the `found` problems (rows ucudnn will not write), if any."""
    if found:
        raise CacheError(f"{source} holds rows that break the rules of a benchmark database, so nothing was "
                         f"written: {'; '.join(found)}; {fix}")
