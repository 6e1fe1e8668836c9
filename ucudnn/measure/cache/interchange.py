"""The export format: a benchmark database's rows as one JSON file (`ucudnn cache export`), and
reading one back (`ucudnn cache import`), every row checked against the rules
(ucudnn.measure.cache.rows) and an older schema's rows converted as a file's migration converts
them."""
from __future__ import annotations

import json
import os
from pathlib import Path

from ...core.errors import CacheError
from ...core.problem import ConvProblem
from . import rows, schema

EXPORT_FORMAT = "ucudnn-benchmarks"

# What reading or converting a file that is not an export raises (ValueError: bad JSON or UTF-8)
_NOT_AN_EXPORT = (ValueError, KeyError, TypeError, AttributeError)


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


def export_text(kernels: list[dict], measurements: list[dict]) -> str:
    """The export of kernel and measurement rows (as BenchmarkDatabase.dump gives them)."""
    document = {"format": EXPORT_FORMAT, "schema_version": schema.SCHEMA_VERSION,
                "kernels": kernels, "measurements": measurements}
    return json.dumps(document, indent=1)


def _not_an_export(path: str | os.PathLike, error: Exception) -> CacheError:
    return CacheError(f"{path} is not a ucudnn benchmark export ({error}); write one with "
                      f"`ucudnn cache export` (BenchmarkDatabase.export_json)")


def _schema_version(document: dict, path: str | os.PathLike) -> int:
    found = document.get("schema_version", 0)
    if type(found) is not int or found < 0:
        raise CacheError(f"schema version {found!r} is not an integer from 0 to {schema.SCHEMA_VERSION}")
    if found > schema.SCHEMA_VERSION:
        raise schema.NewerSchemaError(Path(path), found)
    return found


def _parse_export(path: str | os.PathLike) -> tuple[int, list[dict], list[dict]]:
    """The schema version of an export file, its kernel rows and its measurement rows, each
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
    """The kernel and measurement rows of an export file, every row checked against the rules
    (ucudnn.measure.cache.rows); CacheError naming the file (and a bad row, its column and value)
    if it is not an export or a row breaks a rule. The rows of an older export are checked before
    they are converted too (but algorithm numbers, which the conversion names), so that a bad
    value is named, not what converting it tripped over."""
    found, kernels, measurements = _parse_export(path)
    if found < schema.SCHEMA_VERSION:
        _check_rows(path, kernels, measurements, without=("algo",) if found < 4 else ())
        measurements = _converted(path, found, kernels, measurements)
    _check_rows(path, kernels, measurements)
    return kernels, [{column: row[column] for column in schema.MEASUREMENT_COLUMNS} for row in measurements]
