"""What a fault of a benchmark database file means: SQLite's errors named (damaged, read-only, full),
and the fix to suggest for the rest. The one home of these rules for the database, the memo
and the command line."""
from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

from ...core.errors import CacheError, DamagedDatabaseError, DatabaseFullError, ReadOnlyDatabaseError

_DAMAGED_WORDS = ("malformed", "not a database", "corrupt")
_READ_ONLY_WORDS = ("readonly", "read-only")


def is_full(error: Exception) -> bool:
    """Whether `error` says the filesystem (or SQLite's page limit) has no room for a write."""
    if isinstance(error, OSError):
        return error.errno == errno.ENOSPC
    return isinstance(error, sqlite3.OperationalError) and "disk is full" in str(error)  # SQLITE_FULL's text


def named(path: Path, error: Exception) -> Exception:
    """`error` (an sqlite3.Error or OSError) as DatabaseFullError, ReadOnlyDatabaseError or
    DamagedDatabaseError where it is one of those, else unchanged (locks, paths that cannot be
    opened, ...)."""
    message = str(error).lower()
    if is_full(error):
        return DatabaseFullError(path, error)
    if not isinstance(error, sqlite3.Error):
        return error
    if any(word in message for word in _READ_ONLY_WORDS):
        return ReadOnlyDatabaseError(path, error)
    if isinstance(error, sqlite3.DatabaseError) and any(word in message for word in _DAMAGED_WORDS):
        return DamagedDatabaseError(path, error)
    return error


# What to do about any other fault, by words of its message; the last entry catches the rest.
_ADVICE = (
    (("permission",), "make the file writable, or set UCUDNN_CACHE to a writable path"),
    (("locked",), "another process held the file locked too long; if the filesystem's locking is "
                  "unreliable, use per-host shards (--cache FOLDER: `ucudnn bench --help`)"),
    (("unable to open", "no such file", "not a directory", "file exists"),
     "make sure the path exists (or can be created) and is accessible, or set UCUDNN_CACHE to another path"),
    (("disk i/o",), "the filesystem failed a read or write (over its quota, unmounted, or failing): check it "
                    "(df, quota), or set UCUDNN_CACHE to a path on another filesystem"),
    (("",), "the file may be damaged: move it away (ucudnn makes a new one) or set UCUDNN_CACHE to another path"),
)


def advice(error: Exception) -> str:
    message = str(error).lower()
    return next(advice for words, advice in _ADVICE if any(word in message for word in words))


def describe(path: Path | None, error: Exception, verb: str) -> str:
    """One sentence: the file, what could not be done (`verb`: opened, read, written), why,
    and the fix. Named errors already say all of that."""
    if isinstance(error, CacheError):
        return str(error)
    return (f"benchmark database {path} cannot be {verb} ({type(error).__name__}: {error}); "
            f"fix: {advice(error)}")
