"""SQLite connections that many processes on many nodes can share through one file.

Network filesystems have no shared memory, so WAL mode cannot work there: the rollback journal
(journal_mode=DELETE) is used instead. SQLite's busy handler waits for a lock up to a short slice;
past it, the operation is retried after a jittered backoff until the caller's timeout, so that
processes that collided do not collide again in lock step. Writes are short transactions that
take the write lock up front (BEGIN IMMEDIATE), which rules out the deadlock of two readers
both upgrading to writers.

A process killed in a write leaves its journal beside the file (`journal`): the next connection
that reads the file rolls it back first, restoring what was committed. A read-only connection
cannot, and SQLite refuses it the file until a writable one has (`interrupted`).
"""
from __future__ import annotations

import random
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

BUSY_SLICE_S = 1.0  # how long SQLite's own busy handler waits before a retry of ours
BACKOFF_FIRST_S = 0.005
BACKOFF_MAX_S = 0.5
SQLITE_READONLY_ROLLBACK = 776  # sqlite3.SQLITE_READONLY_ROLLBACK from Python 3.11 on


def connect(path: Path, *, timeout_s: float, readonly: bool, create: bool = False) -> sqlite3.Connection:
    """An autocommit connection (transactions are explicit) usable from any thread, to an
    existing file unless `create`."""
    uri = f"{path.absolute().as_uri()}?mode={'ro' if readonly else 'rwc' if create else 'rw'}"
    return sqlite3.connect(uri, uri=True, timeout=min(timeout_s, BUSY_SLICE_S),
                           isolation_level=None, check_same_thread=False)


def journal(path: Path) -> Path:
    """The rollback journal of the database file `path`, present while a write is under way or was
    interrupted."""
    return path.with_name(path.name + "-journal")


def interrupted(error: sqlite3.Error, path: Path) -> bool:
    """Whether `error` is SQLite refusing a read-only connection the file `path` because the
    journal of an interrupted write is there to roll back (SQLITE_READONLY_ROLLBACK; Python 3.10
    has no error codes: a read-only error with a journal beside the file)."""
    code = getattr(error, "sqlite_errorcode", None)
    if code is not None:
        return code == SQLITE_READONLY_ROLLBACK
    return "readonly" in str(error).lower() and journal(path).exists()


def is_busy(error: sqlite3.Error) -> bool:
    message = str(error).lower()
    return isinstance(error, sqlite3.OperationalError) and ("locked" in message or "busy" in message)


def retrying(action: Callable[[], T], timeout_s: float) -> T:
    """`action()`, retried with jittered exponential backoff while the database is locked,
    until `timeout_s` has passed; then the last 'database is locked' error is raised."""
    deadline = time.monotonic() + timeout_s
    attempt = 0
    while True:
        try:
            return action()
        except sqlite3.OperationalError as error:
            left = deadline - time.monotonic()
            if not is_busy(error) or left <= 0:
                raise
            time.sleep(min(random.uniform(0, BACKOFF_FIRST_S * 2**attempt), BACKOFF_MAX_S, left))
            attempt += 1


def in_write_transaction(conn: sqlite3.Connection, action: Callable[[], T]) -> T:
    """`action()` inside BEGIN IMMEDIATE ... COMMIT, rolled back if anything fails."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = action()
        conn.execute("COMMIT")
        return result
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def in_read_transaction(conn: sqlite3.Connection, action: Callable[[], T]) -> T:
    """`action()` inside BEGIN ... COMMIT: every query of it reads one snapshot of the file (the
    shared lock is held throughout, so no write commits in between)."""
    conn.execute("BEGIN")
    try:
        return action()
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")
