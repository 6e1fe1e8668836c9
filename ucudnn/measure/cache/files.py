"""Files written whole: each is written beside its place (a scratch file) and then renamed or
linked into place, so that no process ever reads one that ucudnn has begun but not finished. A
process killed in between leaves its scratch file (`leftovers`), never a part of a file."""
from __future__ import annotations

import contextlib
import functools
import os
import tempfile
import uuid
from pathlib import Path

import sqlite_utils

from . import schema
from .connection import BUSY_SLICE_S, connect, in_write_transaction

SCRATCH_SUFFIX = ".new"  # of a file written beside its place before it is put there whole (`_scratch`)


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
