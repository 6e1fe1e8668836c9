"""Faults of a shared benchmark database, injected on CPU: writers killed (SIGKILL) in the middle
of a batch, merges racing a writer, a full filesystem, a network filesystem, and the ranks of a
distributed job. Each test counts what it injected and prints it (pytest -s shows the counts)."""
from __future__ import annotations

import contextlib
import errno
import json
import multiprocessing
import os
import random
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from ucudnn import ConvProblem, Measurement, Provenance
from ucudnn.core import errors
from ucudnn.core.errors import ConfigError, UcudnnWarning
from ucudnn.measure.cache import (
    BenchmarkDatabase,
    Cache,
    cache_path,
    database as database_module,
    default_path,
    merge,
    shard_path,
)
from ucudnn.plan.sources import device_with_most, open_database

from fakes import checksums
from test_cli import inline, one_line_naming

REPO = Path(__file__).resolve().parents[1]
GPU = Provenance("Fault GPU", "9.0", 91900, host="node1")
ROWS = 30  # measurements per batch: one record() call, one write transaction
FORK = multiprocessing.get_context("fork")  # the child inherits the pipe; it only writes SQLite files
HOT = bytes.fromhex("d9d505f920a163d7")  # how a rollback journal that SQLite must roll back begins
KILL_TRIALS = 30
MERGE_TRIALS = 20
# Between the batches of a writer that readers race: a reader waits for a moment without a write,
# and so does a real one, between measurements of a GPU
WRITER_PAUSE_S = 0.002


def kernel(n: int) -> ConvProblem:
    """A kernel of its own for each batch: a batch also adds a kernel row."""
    return ConvProblem("F", (1, 8 + n, 16, 16), (8, 8 + n, 3, 3), pads=1)


def batch(n: int) -> list[Measurement]:
    return [Measurement(f"legacy:B{n}", b, 0.001 * (n + b), 1024 * b, repeats=1) for b in range(1, ROWS + 1)]


def record(path: Path, batches: range) -> None:
    with BenchmarkDatabase(path) as db:
        for n in batches:
            db.record(kernel(n), GPU, batch(n))


def batches_in(path: Path) -> dict[int, int]:
    """The number of rows of each batch the file holds (a private copy is read: nothing is written)."""
    copy = path.with_name(f"read-{path.name}")
    with sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True) as source, sqlite3.connect(copy) as target:
        source.backup(target)
        found = target.execute("SELECT algo, count(*) FROM measurements GROUP BY algo").fetchall()
    target.close()
    copy.unlink()
    return {int(algo[1:]): count for algo, count in found}


def write_batches(path: str, reports: int, first: int, kill_at: float | None, pause_s: float) -> None:
    """Record batch after batch from `first` into `path`, `pause_s` apart, writing the number of
    each committed one to the pipe `reports`. Its page cache holds one page, so each batch writes into the file (after
    syncing its journal) before it commits, as a batch larger than the cache does. With `kill_at`
    (a fraction), SIGKILL this process that far into SQLite's work on its second batch (counted by
    SQLite's progress handler, every 10 VM steps): a point inside a write transaction."""
    steps, limit = 0, None

    def step() -> int:
        nonlocal steps
        steps += 1
        if limit is not None and steps >= limit:
            os.kill(os.getpid(), signal.SIGKILL)
        return 0

    with BenchmarkDatabase(path) as db:
        db._conn.execute("PRAGMA cache_size = 1")
        db._conn.set_progress_handler(step, 10)
        for n in range(first, first + 1_000_000):
            db.record(kernel(n), GPU, batch(n))
            os.write(reports, n.to_bytes(4, "little"))
            time.sleep(pause_s)
            if kill_at is not None and limit is None:
                limit = steps + max(1, round(kill_at * steps))


class Writer:
    """A process writing batches into a file (`write_batches`), and the batches it reported committed."""

    def __init__(self, path: Path, first: int = 0, kill_at: float | None = None, pause_s: float = 0.0):
        read, write = os.pipe()
        self.process = FORK.Process(target=write_batches, args=(str(path), write, first, kill_at, pause_s),
                                    daemon=True)
        self.process.start()
        self.path, self.kills_itself = path, kill_at is not None
        os.close(write)
        os.set_blocking(read, False)
        self._pipe, self._unread, self.committed = read, b"", set()

    def reported(self) -> set[int]:
        """Every batch reported committed so far (what the pipe holds now)."""
        while True:
            try:
                chunk = os.read(self._pipe, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                break
            self._unread += chunk
        whole = len(self._unread) // 4 * 4
        self.committed |= {int.from_bytes(self._unread[i:i + 4], "little") for i in range(0, whole, 4)}
        self._unread = self._unread[whole:]
        return set(self.committed)

    def wait_for(self, count: int, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.reported()) < count:
            assert time.monotonic() < deadline and self.process.is_alive(), "the writer stopped reporting"
            time.sleep(0.001)

    def kill(self) -> set[int]:
        """SIGKILL the writer (unless it kills itself) and return what it reported committed."""
        if not self.kills_itself:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.join(30)
        assert self.process.exitcode == -signal.SIGKILL
        committed = self.reported()
        os.close(self._pipe)
        return committed


def journal(path: Path) -> Path:
    return path.with_name(path.name + "-journal")


def is_hot(path: Path) -> bool:
    """Whether a journal an interrupted write left is beside `path`, for SQLite to roll back."""
    return journal(path).exists() and journal(path).read_bytes()[:8] == HOT


def crash(path: Path, rng: random.Random, first: int) -> set[int]:
    """A writer of batches from `first` killed at a random point of a batch: by itself at a random
    VM step (half the time), else by this process at a random time; the batches it reported committed."""
    if rng.random() < 0.5:
        return Writer(path, first, kill_at=rng.random()).kill()
    writer = Writer(path, first)
    writer.wait_for(1)
    time.sleep(rng.uniform(0, 0.01))
    return writer.kill()


def as_crashed(files: dict[Path, bytes]) -> None:
    """The files as the killed writer left them (its journal included), each read-only open
    meeting the crash afresh."""
    for path in (*files, *map(journal, files)):
        path.unlink(missing_ok=True)
    for path, content in files.items():
        path.write_bytes(content)


# --- killed writers ---


def _read_only_opens(path: Path, tmp_path: Path, capsys) -> dict[str, dict[int, int]]:
    """Every way ucudnn opens a file read-only, each on the file as the crash left it: the batches
    each saw (with their number of rows) where it reads them. Each must succeed without a warning."""
    left = {path: path.read_bytes()} | ({journal(path): journal(path).read_bytes()} if journal(path).exists() else {})
    seen = {}
    as_crashed(left)
    status, out, err = inline(capsys, "cache", "verify", "--cache", str(path))
    assert (status, err) == (0, "") and "no problems found" in out, err
    as_crashed(left)
    status, out, err = inline(capsys, "cache", "list", "--cache", str(path))
    assert (status, err) == (0, "") and "Fault GPU" in out, err
    as_crashed(left)
    export = tmp_path / "export.json"
    status, _, err = inline(capsys, "cache", "export", str(export), "--cache", str(path), "--force")  # each trial's
    assert (status, err) == (0, ""), err
    rows = json.loads(export.read_text())["measurements"]
    seen["export"] = {n: sum(r["algo"] == f"B{n}" for r in rows) for n in {int(r["algo"][1:]) for r in rows}}
    as_crashed(left)
    with open_database(path) as db:  # what `ucudnn optimize --offline` reads through
        device = device_with_most(db, [kernel(0)], GPU.execution)
        tables = db.tables([kernel(n) for n in seen["export"]], device)
    seen["optimize"] = {n: len(tables[kernel(n).key]) for n in seen["export"]}
    as_crashed(left)
    cache = Cache(path, readonly=True)
    seen["Cache"] = {n: len(cache.table(kernel(n), GPU)) for n in seen["export"]}
    assert cache.using_file and cache.stats.file_errors == 0
    cache.close()
    return seen


@pytest.mark.slow
def test_a_killed_writer_loses_no_committed_row_and_every_read_only_open_works(tmp_path, capsys):
    """Writers killed at random points of a batch. What they committed is all there, the batch
    they were killed in is all there or not at all, and every read-only open (verify, list, export,
    optimize's lookups, a read-only Cache) works on the file as the crash left it: where the
    journal of the interrupted write is there, the open rolls it back first."""
    rng, path = random.Random(49), tmp_path / "crashed.db"
    record(path, range(3))
    began, hot, lost, committed = time.perf_counter(), 0, 0, set(range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning either: nothing is damaged
        for _ in range(KILL_TRIALS):
            committed |= crash(path, rng, max(committed) + 2)  # + 2: the batch killed may be there or not
            hot += is_hot(path)
            for how, seen in _read_only_opens(path, tmp_path, capsys).items():
                lost += sum(ROWS - seen.get(n, 0) for n in committed)
                assert not committed - set(seen), (how, sorted(committed - set(seen)))
                assert set(seen.values()) == {ROWS}, (how, seen)  # no half batch
    print(f"\nkilled writers: {KILL_TRIALS} trials, {hot} left a journal to roll back, {lost} committed rows "
          f"lost, 0 tracebacks, 0 false 'damaged'; {time.perf_counter() - began:.1f} s")
    assert hot >= KILL_TRIALS // 4  # the trials met what they test


def test_a_crash_that_only_its_writer_can_roll_back_is_one_line_naming_the_fix(tmp_path, capsys, monkeypatch):
    """Where this process cannot write the file (SQLite opens a write-protected file read-only;
    root writes to any, so the open is made read-only as it is for anyone else), the journal cannot
    be rolled back: every read-only open says so in one line naming the file and the fix, and the
    files stay as they are; once opened by whom can write it, the file reads as last committed."""
    path = tmp_path / "crashed.db"
    record(path, range(2))
    committed = Writer(path, 2, kill_at=0.5).kill() | {0, 1}
    assert is_hot(path)
    before = checksums(path)
    real_connect = database_module.connect
    monkeypatch.setattr(database_module, "connect", lambda file, **kw: real_connect(file, **{**kw, "readonly": True}))
    with pytest.raises(errors.InterruptedWriteError, match=f"{path} holds the journal of a write that was interrupted"):
        BenchmarkDatabase(path, readonly=True)
    for argv in (("cache", "verify"), ("cache", "list"), ("cache", "export", str(tmp_path / "x.json"))):
        status, out, err = inline(capsys, *argv, "--cache", str(path))
        assert status == 2 and one_line_naming(err, str(path), "interrupted", f"ucudnn cache verify --cache {path}"), err
        assert "damaged" not in err
    with pytest.warns(UcudnnWarning, match="interrupted"):
        assert not Cache(path, readonly=True).using_file
    assert checksums(path) == before
    monkeypatch.undo()
    with BenchmarkDatabase(path, readonly=True) as db:
        assert db.verify() == [] and not journal(path).exists()
    assert set(batches_in(path)) == committed


def as_nobody(*command: str, **options) -> subprocess.CompletedProcess:
    """`command` run as the user `nobody` (65534); the test is skipped where that cannot be."""
    if os.geteuid() != 0:
        pytest.skip("runs a command as another user, which needs root")
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=120, user=65534, **options)
    except PermissionError as error:
        pytest.skip(f"this Python cannot be run by another user: {error}")


def test_a_crash_left_to_another_user_is_one_line(tmp_path):
    """The same as a user who cannot write the file: the command as `nobody`, for real."""
    folder = Path("/tmp") / f"ucudnn-crash-{os.getpid()}"
    folder.mkdir(mode=0o755)
    try:
        path = folder / "crashed.db"
        record(path, range(2))
        Writer(path, 2, kill_at=0.5).kill()
        assert is_hot(path)
        before = checksums(path)
        env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "HOME": str(folder)}
        result = as_nobody(sys.executable, "-m", "ucudnn", "cache", "verify", "--cache", str(path), env=env, cwd=folder)
        assert result.returncode == 2 and one_line_naming(result.stderr, str(path), "interrupted"), result.stderr
        assert "Traceback" not in result.stderr and checksums(path) == before
    finally:
        for leftover in folder.iterdir():
            leftover.unlink()
        folder.rmdir()


# --- merges racing a writer ---


@contextlib.contextmanager
def written(base: Path, path: Path, pause_s: float = WRITER_PAUSE_S) -> Iterator[Writer]:
    """A copy of `base` at `path` that a writer adds batches to while in the block, `pause_s` apart
    (a new writer each time: the file grows only while it is raced); killed afterwards."""
    shutil.copyfile(base, path)
    writer = Writer(path, 1000, pause_s=pause_s)
    try:
        writer.wait_for(2)
        yield writer
    finally:
        writer.kill()


@pytest.mark.slow
def test_merges_racing_a_writer_read_each_input_in_one_snapshot(tmp_path, capsys):
    """`merge` and `ucudnn cache merge` while a writer adds kernels and measurements to the input:
    every output verifies, holds every batch committed before the merge began and no half batch,
    and no merge fails or calls the healthy input damaged."""
    base = tmp_path / "base.db"
    record(base, range(40))
    began, lost = time.perf_counter(), 0
    for trial in range(MERGE_TRIALS):
        shard, out = tmp_path / f"shard{trial}.db", tmp_path / f"merged{trial}.db"
        with written(base, shard) as writer:
            committed = writer.reported() | set(range(40))
            if trial % 2:
                merge([shard], out)
            else:
                status, _, err = inline(capsys, "cache", "merge", str(shard), "--into", str(out))
                assert (status, err) == (0, ""), err
        with BenchmarkDatabase(out, readonly=True) as merged:
            assert merged.verify() == [], trial
        found = batches_in(out)
        lost += sum(ROWS - found.get(n, 0) for n in committed)
        assert committed <= set(found) and set(found.values()) == {ROWS}, trial
    print(f"\nmerges racing a writer: {MERGE_TRIALS} trials, {lost} committed rows lost, 0 tracebacks, "
          f"0 false 'damaged'; {time.perf_counter() - began:.1f} s")


def test_an_export_is_one_snapshot_of_a_file_being_written(tmp_path):
    """Kernels and measurements are read in one read transaction: an export taken while a writer
    adds kernels imports back (every measurement's kernel is in it)."""
    base = tmp_path / "base.db"
    record(base, range(40))
    for trial in range(MERGE_TRIALS):
        with written(base, tmp_path / f"written{trial}.db") as writer, \
                BenchmarkDatabase(writer.path, readonly=True) as db:
            db.export_json(tmp_path / "export.json", force=True)  # each trial's
        with BenchmarkDatabase(tmp_path / f"imported{trial}.db") as copy:
            copy.import_json(tmp_path / "export.json")


# --- a full filesystem ---


def fill(folder: Path) -> Path:
    """A file that takes every free byte of `folder`'s filesystem."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as out:
        try:
            while out.write(b"\0" * 4096):
                pass
        except OSError as error:
            assert error.errno == errno.ENOSPC
    return filler


@pytest.fixture
def small_filesystem(tmp_path):
    """A 4 MiB tmpfs, unmounted afterwards; the test is skipped, with the reason, where none can be mounted."""
    point = tmp_path / "small"
    point.mkdir()
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(point)],
                                 capture_output=True, text=True)
    except OSError as error:
        pytest.skip(f"cannot mount a tmpfs here: {error}")
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here (needs root in a system that allows it): {mounted.stderr.strip()}")
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], check=False)


def assert_full_is_one_line(status: int, err: str, path: Path) -> None:
    assert status == 2 and one_line_naming(err, str(path), "filesystem is full", "free space", "UCUDNN_CACHE"), err
    assert "damaged" not in err and "Traceback" not in err


def full_disk_faults(target: Path, source: Path, capsys) -> int:
    """`cache import` and `cache merge --into` of `source`'s rows into `target`, a `Cache` record,
    and `BenchmarkDatabase.record` with no room left: each one line (or one warning, or
    DatabaseFullError) naming the file and the fix, and `target` unchanged. The faults met."""
    before = checksums(target)
    export = source.with_suffix(".json")
    with BenchmarkDatabase(source, readonly=True) as db:
        db.export_json(export)
    status, _, err = inline(capsys, "cache", "import", str(export), "--cache", str(target))
    assert_full_is_one_line(status, err, target)
    status, _, err = inline(capsys, "cache", "merge", str(source), "--into", str(target))
    assert_full_is_one_line(status, err, target)
    with pytest.warns(UcudnnWarning, match="filesystem is full") as warned:
        cache = Cache(target)
        cache.record(kernel(900), GPU, batch(900))
    assert len(warned) == 1 and "damaged" not in str(warned[0].message)
    assert len(cache.table(kernel(900), GPU)) == ROWS  # carries on in memory
    cache.close()
    with BenchmarkDatabase(target) as db, pytest.raises(errors.DatabaseFullError, match=str(target)):
        db.record(kernel(901), GPU, batch(901))
    assert checksums(target) == before
    return 4


def test_a_full_database_is_one_line_and_loses_nothing(tmp_path, capsys, monkeypatch):
    """SQLite's page limit (max_page_count) makes the target full wherever the tests run."""
    target, source = tmp_path / "full.db", tmp_path / "source.db"
    record(target, range(5))
    record(source, range(5, 25))
    real_connect = database_module.connect

    def capped(file, **options):
        conn = real_connect(file, **options)
        if Path(file) == target and not options.get("readonly"):
            conn.execute(f"PRAGMA max_page_count = {conn.execute('PRAGMA page_count').fetchone()[0]}")
        return conn

    monkeypatch.setattr(database_module, "connect", capped)
    full_disk_faults(target, source, capsys)
    monkeypatch.undo()
    assert set(batches_in(target)) == set(range(5)) and BenchmarkDatabase(target).verify() == []


def test_a_full_filesystem_is_one_line_and_loses_nothing(small_filesystem, tmp_path, capsys):
    target, source = small_filesystem / "bench.db", tmp_path / "source.db"
    record(target, range(5))
    record(source, range(5, 45))
    filler = fill(small_filesystem)
    faults = full_disk_faults(target, source, capsys)
    status, _, err = inline(capsys, "cache", "import", str(source.with_suffix(".json")),
                            "--cache", str(small_filesystem / "new.db"))  # a new file that does not fit
    assert_full_is_one_line(status, err, small_filesystem / "new.db")
    assert sorted(p.name for p in small_filesystem.iterdir()) == ["bench.db", "filler"]
    result = subprocess.run([sys.executable, "-m", "ucudnn", "cache", "merge", str(source), "--into", str(target)],
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert_full_is_one_line(result.returncode, result.stderr, target)
    filler.unlink()
    assert set(batches_in(target)) == set(range(5)) and BenchmarkDatabase(target).verify() == []
    print(f"\nfull filesystem: {faults + 2} faults, 0 rows lost, 0 tracebacks, 0 false 'damaged'")


# --- network filesystems and ranks ---


@pytest.fixture
def default_on(tmp_path, monkeypatch):
    """The default database under `tmp_path`, on a filesystem of the type given (the probe faked),
    outside any distributed job."""
    from ucudnn.measure.cache import filesystems, paths

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for variable in ("UCUDNN_CACHE", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(paths, "_said", set())
    return lambda kind: monkeypatch.setattr(filesystems, "filesystem_type", lambda path: kind)


def test_the_default_database_on_a_network_filesystem_is_a_shard_per_process(default_on, tmp_path, monkeypatch,
                                                                               capsys):
    folder, source = tmp_path / "ucudnn" / "shards", tmp_path / "source.db"
    record(source, range(2, 3))
    with BenchmarkDatabase(source) as db:
        db.export_json(tmp_path / "export.json")
    default_on("ext4")
    assert cache_path() == default_path() == tmp_path / "ucudnn" / "benchmarks.db"
    default_on("nfs4")
    with pytest.warns(UcudnnWarning, match=r"network filesystem \(nfs4\).*each process writes its own shard") as said:
        host = Cache()
        host.record(kernel(0), GPU, batch(0))
        status, _, err = inline(capsys, "cache", "import", str(tmp_path / "export.json"))  # where Cache writes
        assert status == 0, err
        monkeypatch.setenv("RANK", "3")
        monkeypatch.setenv("WORLD_SIZE", "8")
        rank = Cache()
        rank.record(kernel(1), GPU, batch(1))
    assert len(said) == 1 and str(folder) in str(said[0].message)
    host.close()
    rank.close()
    assert (host.path, rank.path) == (shard_path(folder), folder / f"{socket.gethostname()}-rank3.db")
    assert not default_path().exists()
    status, out, err = inline(capsys, "cache", "list", "--cache", str(folder))  # reads merge the shards
    assert status == 0 and "3 kernels" in out, err
    assert set(batches_in(shard_path(folder))) == {0, 2}


def test_filesystem_type_is_the_deepest_mount_holding_the_path(tmp_path, monkeypatch):
    from ucudnn.measure.cache import filesystems

    (tmp_path / "home" / "a b").mkdir(parents=True)
    mounts = tmp_path / "mounts"
    mounts.write_text(f"overlay / overlay rw 0 0\nserver:/home {tmp_path}/home nfs4 rw 0 0\n"
                      f"mds@o2ib:/fs {tmp_path}/home/a\\040b lustre rw,flock 0 0\n")
    monkeypatch.setattr(filesystems, "MOUNTS", mounts)
    assert filesystems.filesystem_type(tmp_path / "home" / "x" / "benchmarks.db") == "nfs4"  # not made yet
    assert filesystems.filesystem_type(tmp_path / "home" / "a b" / "ucudnn") == "lustre"
    assert filesystems.filesystem_type(tmp_path) == "overlay"
    assert {"nfs4", "lustre"} <= filesystems.NETWORK_FILESYSTEMS and "overlay" not in filesystems.NETWORK_FILESYSTEMS
    monkeypatch.setattr(filesystems, "MOUNTS", tmp_path / "none")
    assert filesystems.filesystem_type(tmp_path) == ""


@pytest.mark.parametrize("env, expected", [
    ({}, (0, 1, 0, False)),
    ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}, (3, 8, 1, True)),
    ({"RANK": "2"}, (2, 3, 0, True)),
    ({"RANK": "0", "WORLD_SIZE": "1"}, (0, 1, 0, False)),
])
def test_the_rank_is_read_as_torchrun_sets_it(env, expected, tmp_path):
    from ucudnn.core.ranks import current_rank
    from ucudnn.measure.cache.paths import own_shard

    place = current_rank(env)
    assert (place.rank, place.world_size, place.local_rank, place.distributed) == expected
    named = f"-rank{place.rank}.db" if place.distributed else f"{socket.gethostname()}.db"
    assert own_shard(tmp_path, env).name.endswith(named)


def test_the_rank_of_a_running_process_group_comes_first(monkeypatch):
    from ucudnn.core.ranks import current_rank

    group = SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True, get_rank=lambda: 5,
                            get_world_size=lambda: 6)
    monkeypatch.setitem(sys.modules, "torch.distributed", group)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert (current_rank().rank, current_rank().world_size, current_rank().local_rank) == (5, 6, 1)


@pytest.mark.parametrize("env, message", [({"RANK": "x"}, "RANK='x' is not a rank"),
                                          ({"RANK": "8", "WORLD_SIZE": "8"}, "RANK=8 is not below WORLD_SIZE=8"),
                                          ({"LOCAL_RANK": "-1"}, "LOCAL_RANK='-1' is not a rank")])
def test_a_bad_rank_variable_is_named(env, message):
    from ucudnn.core.ranks import current_rank

    with pytest.raises(ConfigError, match=message):
        current_rank(env)
