"""Many writers on one database file at once: processes (as on the nodes of a cluster) and threads."""
from __future__ import annotations

import multiprocessing
import threading
import time
import traceback
from pathlib import Path

import pytest

from ucudnn import ConvProblem, Measurement, Provenance
from ucudnn.measure.cache import BenchmarkDatabase, Cache

PROCESSES = 8
WRITES = 500  # per process
KERNELS = 50  # writers share these shape keys, so they also race on the kernels table
GPU = Provenance("Stress GPU", "9.0", 91900)


def problem(i: int) -> ConvProblem:
    return ConvProblem("F", (1, 8 + i % KERNELS, 16, 16), (8, 8 + i % KERNELS, 3, 3), pads=1)


def measurement(writer: int, i: int) -> Measurement:
    """Unique per (writer, i): algo is the writer, batch and shape key come from i."""
    return Measurement(algo=f"legacy:A{writer}", batch=1 + i // KERNELS, time_ms=writer * 1000 + i + 1, workspace=i, repeats=1)


def write(db_or_cache, writer: int, writes: int) -> list[str]:
    """`writes` record calls, one measurement each; the errors they raised, as text."""
    errors = []
    for i in range(writes):
        try:
            db_or_cache.record(problem(i), GPU, [measurement(writer, i)])
        except Exception:  # counted, not raised: the test reports every one
            errors.append(traceback.format_exc())
    return errors


def process_writer(path: str, writer: int, start, results) -> None:
    try:
        with BenchmarkDatabase(path) as db:  # every process also races to create the schema
            start.wait()
            results.put((writer, write(db, writer, WRITES)))
    except Exception:
        results.put((writer, [traceback.format_exc()]))


def assert_all_present(path: Path, writers: int, writes: int) -> int:
    with BenchmarkDatabase(path, readonly=True) as db:
        tables = db.tables([problem(i) for i in range(KERNELS)], GPU)
        found = {(m.algo, m.batch, m.time_ms) for table in tables.values() for m in table}
    expected = {(f"legacy:A{w}", (m := measurement(w, i)).batch, m.time_ms) for w in range(writers) for i in range(writes)}
    assert found == expected, f"{len(expected - found)} rows missing, {len(found - expected)} unexpected"
    return len(found)


@pytest.mark.slow
def test_processes_write_one_file_at_once(tmp_path):
    path = tmp_path / "shared.db"
    context = multiprocessing.get_context("spawn")
    start, results = context.Barrier(PROCESSES), context.Queue()
    processes = [context.Process(target=process_writer, args=(str(path), w, start, results))
                 for w in range(PROCESSES)]
    began = time.perf_counter()
    for p in processes:
        p.start()
    reports = dict(results.get(timeout=300) for _ in processes)
    for p in processes:
        p.join(60)
    seconds = time.perf_counter() - began
    errors = [e for report in reports.values() for e in report]
    found = assert_all_present(path, PROCESSES, WRITES)
    print(f"\nstress: {PROCESSES} processes, {PROCESSES * WRITES} rows written, {found} rows found, "
          f"{len(errors)} errors, {seconds:.1f} s")
    assert not errors, errors[0]
    assert all(p.exitcode == 0 for p in processes)


def test_threads_share_one_cache(tmp_path):
    cache, threads_, writes = Cache(tmp_path / "threads.db"), 8, 100
    errors: list[str] = []
    threads = [threading.Thread(target=lambda w=w: errors.extend(write(cache, w, writes))) for w in range(threads_)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and cache.stats.file_errors == 0 and cache.stats.records == threads_ * writes
    assert assert_all_present(tmp_path / "threads.db", threads_, writes) == threads_ * writes
    in_memory = {(m.algo, m.time_ms) for i in range(KERNELS) for m in cache.table(problem(i), GPU)}
    assert len(in_memory) == threads_ * writes


def test_threads_with_their_own_connections(tmp_path):
    path, threads_, writes = tmp_path / "connections.db", 4, 100
    errors: list[str] = []

    def writer(w: int) -> None:
        with BenchmarkDatabase(path) as db:
            errors.extend(write(db, w, writes))

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(threads_)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert assert_all_present(path, threads_, writes) == threads_ * writes
