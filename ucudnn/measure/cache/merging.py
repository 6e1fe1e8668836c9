"""Merging benchmark databases: shards into a target as one writer of all of them would have
written it, each shard read whole in one snapshot and checked before the target is touched; and
`writing`, a database opened for a command that writes into it (merge, import)."""
from __future__ import annotations

import contextlib
import os
import sqlite3
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import sqlite_utils

from . import rows, schema
from .connection import connect, in_read_transaction, journal
from .database import BenchmarkDatabase, named_faults, past_journal
from .faults import is_full, named


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
    first (database.past_journal); nothing else of the shard is written. ForeignFileError or
    NewerSchemaError (naming the shard) where ucudnn must not read it."""
    def take() -> None:
        schema.identify(sqlite_utils.Database(source, execute_plugins=False), shard)  # takes the read lock
        source.backup(target)

    def copy_whole() -> None:
        try:
            past_journal(shard, shard, timeout_s, lambda: in_read_transaction(source, take))
        except (sqlite3.Error, OSError) as error:
            if is_full(error):  # reading the shard writes nothing that grows: the copy's folder is full
                raise named(copy, error) from error
            raise

    def opened(file: Path, **options) -> contextlib.closing:
        return contextlib.closing(named_faults(file, lambda: connect(file, timeout_s=timeout_s, **options)))

    with opened(shard, readonly=True) as source, opened(copy, readonly=False, create=True) as target:
        named_faults(shard, copy_whole)


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
                    merged += into.add_rows(*source.dump()).rows
    return merged
