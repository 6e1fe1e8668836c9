"""The cache: in-memory memo, file database, reuse rule, faults, migration, shards, packaging."""
from __future__ import annotations

import json
import multiprocessing
import os
import re
import sqlite3
import threading
import time
import warnings
from dataclasses import replace
from pathlib import Path

import pytest

from ucudnn import CacheError, ConvProblem, Measurement, Provenance
from ucudnn.core.accumulation import accumulates
from ucudnn.core.errors import ConfigError, DamagedDatabaseError, UcudnnWarning
from ucudnn.core.measurements import OK, OVER_CAP, UNSUPPORTED
from ucudnn.measure.cache import (
    SCHEMA_VERSION,
    BenchmarkDatabase,
    Cache,
    NewerSchemaError,
    database as database_module,
    default_path,
    merge,
    paths as paths_module,
    recorded_path,
    recorded_paths,
    schema,
    shard_path,
)
from ucudnn.measure.cache.database import read_export
from ucudnn.optimizers.configuration import Configuration, MicroConfig
from ucudnn.optimizers.search import FULL

from fakes import checksums, damage_middle, make_foreign, overwrite_root, spoil

REPO = Path(__file__).resolve().parents[1]
H100 = Provenance("NVIDIA H100 80GB HBM3", "9.0", 91900, driver_version=570, host="node1")
SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
ALGOS = range(8)
LIMIT = 64 * 2**20


def conv(cin: int, cout: int, size: int, kernel: int = 1, stride: int = 1, batch: int = 32,
         kind: str = "F") -> ConvProblem:
    return ConvProblem(kind, (batch, cin, size, size), (cout, cin, kernel, kernel),
                       pads=kernel // 2, strides=stride)


def resnet50(batch: int = 32) -> list[ConvProblem]:
    """The 53 convolutions of ResNet-50 (v1.5, 224x224) x F, BD, BF: 159 kernels."""
    layers = [conv(3, 64, 224, 7, 2, batch)]
    cin, size = 64, 56
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for block in range(blocks):
            s = stride if block == 0 else 1
            layers += [conv(cin, width, size, 1, 1, batch), conv(width, width, size, 3, s, batch)]
            if block == 0:
                layers.append(conv(cin, 4 * width, size, 1, s, batch))  # projection shortcut
            size //= s
            layers.append(conv(width, 4 * width, size, 1, 1, batch))
            cin = 4 * width
    return [layer.with_kind(kind) for layer in layers for kind in ("F", "BD", "BF")]


def fake_measurements(problem: ConvProblem, sizes=SIZES) -> list[Measurement]:
    """Deterministic t(a, b), ws(a, b); algorithm 7 is unsupported, algorithm 6 over the cap."""
    seed = sum(map(ord, problem.shape_key()))
    return [Measurement(f"legacy:A{algo}", b, None if algo >= 6 else 0.01 * b * (1 + (seed + algo) % 5),
                        2**34 if algo == 6 else 2**10 * algo * b,
                        OK if algo < 6 else (OVER_CAP if algo == 6 else UNSUPPORTED), 3, accumulates(problem, b))
            for algo in ALGOS for b in sizes]


class FakeBenchmarker:
    """Counts how often anything had to be benchmarked."""

    def __init__(self, device: Provenance):
        self.device, self.calls = device, 0

    def measure(self, problem, sizes, cap, backend=None, best=None, skip=()):
        self.calls += 1
        return fake_measurements(problem, sizes)


def table_or_benchmark(cache: Cache, problem: ConvProblem, bench: FakeBenchmarker, sizes=SIZES):
    """What the handle does: use the cache, benchmark only what it lacks."""
    table = cache.table(problem, bench.device)
    missing = FULL.missing(table, sizes, LIMIT)
    if missing:
        cache.record(problem, bench.device, bench.measure(problem, missing, None))
        table = cache.table(problem, bench.device)
    return table


def as_set(table) -> set[Measurement]:
    return set(table)


@pytest.fixture
def db_path(tmp_path) -> Path:
    return tmp_path / "benchmarks.db"


@pytest.fixture
def filled(db_path) -> Path:
    with BenchmarkDatabase(db_path) as db:
        for problem in resnet50()[:12]:
            db.record(problem, H100, fake_measurements(problem))
    return db_path


def dump(path: Path) -> list[tuple]:
    """Every measurement but its time of recording, in key order."""
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT gpu_name, cudnn_version, shape_key, batch, algo, time_ms, workspace, "
                            "status, repeats, compute_capability, driver_version, host FROM measurements "
                            "ORDER BY gpu_name, cudnn_version, shape_key, batch, algo").fetchall()


# --- the database ---


def test_record_then_table_round_trips(db_path):
    problem = conv(64, 64, 56, 3)
    with BenchmarkDatabase(db_path) as db:
        db.record(problem, H100, fake_measurements(problem))
        table = db.table(problem.with_batch(256), H100)  # any mini-batch: the shape key is what counts
    assert as_set(table) == set(fake_measurements(problem))
    assert table.sizes == SIZES


def test_record_replaces_the_same_measurement(db_path):
    problem = conv(64, 64, 56, 3)
    with BenchmarkDatabase(db_path) as db:
        db.record(problem, H100, [Measurement("legacy:A0", 1, 2.0, 10)])
        db.record(problem, H100, [Measurement("legacy:A0", 1, 1.5, 10, repeats=9)])
        assert list(db.table(problem, H100)) == [Measurement("legacy:A0", 1, 1.5, 10, repeats=9)]


def test_rows_of_candidates_not_accurate_enough_stay_in_the_file_but_are_never_read(db_path):
    """A database filled before ucudnn.core.accuracy's rule holds half-precision backward-filter rows
    of legacy ALGO_0 and engine 20: kept (nothing is lost), never offered to the optimizers."""
    bf = replace(conv(64, 64, 56, 3, kind="BF"), dtype="float16", math="tensor_op")
    rows = [Measurement(algo, 32, ms, 0) for algo, ms in (("legacy:ALGO_0", 0.5), ("engines:eng20", 0.5),
            ("engines:eng20_k2=1", 0.5), ("legacy:ALGO_1", 0.9), ("engines:eng200", 0.7))]
    with BenchmarkDatabase(db_path) as db:
        db.record(bf, H100, rows)
        db.record(replace(bf, dtype="float32", math="default"), H100, rows)
        half, single = db.table(bf, H100), db.table(replace(bf, dtype="float32", math="default"), H100)
    assert sorted(m.algo for m in half) == ["engines:eng200", "legacy:ALGO_1"]
    assert half.fastest(32).algo == "engines:eng200"
    assert {m.algo for m in single.choices(32)} == {m.algo for m in rows}
    assert len(dump(db_path)) == 2 * len(rows)


def test_file_uses_rollback_journal_and_schema_version(db_path):
    BenchmarkDatabase(db_path).close()
    with sqlite3.connect(db_path) as conn:
        conn.execute("PRAGMA journal_mode=WAL")  # as if another tool had turned WAL on
    BenchmarkDatabase(db_path).close()
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_reuse_needs_same_gpu_model_cudnn_version_and_shape_key(filled):
    problem = resnet50()[0]
    same_model_elsewhere = Provenance(H100.gpu_name, "9.0", H100.cudnn_version, driver_version=580, host="node7")
    with BenchmarkDatabase(filled, readonly=True) as db:
        assert len(db.table(problem, same_model_elsewhere)) == len(fake_measurements(problem))
        assert len(db.table(problem, Provenance(H100.gpu_name, "9.0", 91000))) == 0
        assert len(db.table(problem, Provenance("NVIDIA A100-SXM4-80GB", "8.0", 91900))) == 0
        assert len(db.table(ConvProblem("F", (32, 3, 224, 224), (64, 3, 7, 7), pads=3, strides=1), H100)) == 0


def test_tables_answers_every_problem_in_one_call(filled):
    problems = resnet50()
    with BenchmarkDatabase(filled) as db:
        found = db.tables(problems, H100)
    assert set(found) == {p.key for p in problems}
    stored = {p.key for p in problems[:12]}
    assert all((len(table) > 0) == (key in stored) for key, table in found.items())


def test_devices_and_kernels_describe_the_contents(filled):
    with BenchmarkDatabase(filled) as db:
        db.record(conv(8, 8, 8), Provenance("Tesla P100-SXM2-16GB", "6.0", 7605, host="old"),
                  [Measurement("legacy:A0", 1, 1.0, 0)])
        assert set(db.devices()) == {H100, Provenance("Tesla P100-SXM2-16GB", "6.0", 7605, host="old")}
        on_h100 = db.kernels(H100)
        everything = db.kernels()
    assert {p.shape_key() for p, _ in on_h100} == {p.shape_key() for p in resnet50()[:12]}
    assert all(p.batch == 1 and n == len(fake_measurements(p)) for p, n in on_h100)
    assert len(everything) == len(on_h100) + 1


def test_export_import_round_trips_measurements_and_provenance(filled, tmp_path):
    exported = tmp_path / "benchmarks.json"
    with BenchmarkDatabase(filled) as db:
        count = db.export_json(exported)
    with BenchmarkDatabase(tmp_path / "copy.db") as copy:
        assert copy.import_json(exported).new == count
        assert copy.devices() == [H100]
    assert dump(tmp_path / "copy.db") == dump(filled)
    assert json.loads(exported.read_text())["measurements"][0]["recorded_at"]


def test_import_rejects_what_is_not_an_export(db_path, tmp_path):
    other = tmp_path / "other.json"
    other.write_text('{"measurements": []}')
    with BenchmarkDatabase(db_path) as db, pytest.raises(CacheError, match="not a ucudnn benchmark export"):
        db.import_json(other)


def test_verify_finds_nothing_wrong_in_a_good_file(filled):
    with BenchmarkDatabase(filled) as db:
        assert db.verify() == []


def test_verify_names_bad_rows(filled):
    with sqlite3.connect(filled) as conn:
        conn.execute("UPDATE measurements SET status = 'great' WHERE algo = 'A0'")
        conn.execute("UPDATE measurements SET time_ms = -1 WHERE algo = 'A1'")
        conn.execute("DELETE FROM kernels WHERE rowid = 1")
    with BenchmarkDatabase(filled) as db:
        problems = db.verify()
    assert len(problems) == 3
    assert any("whose status 'great' is not one of ok, unsupported" in p for p in problems)
    assert any("whose time_ms -1.0 is not a number from 1e-06 to 1e+09" in p for p in problems)
    assert any("is not the shape key of a kernel row that describes its convolution" in p for p in problems)


# --- schema versions ---


def test_newer_schema_is_a_clear_error(db_path):
    BenchmarkDatabase(db_path).close()
    with sqlite3.connect(db_path) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    for open_it in (lambda: BenchmarkDatabase(db_path), lambda: BenchmarkDatabase(db_path, readonly=True),
                    lambda: Cache(db_path)):
        with pytest.raises(NewerSchemaError) as raised:  # a CacheError
            open_it()
        message = str(raised.value)
        assert str(db_path) in message and f"version {SCHEMA_VERSION + 1}" in message
        assert f"up to {SCHEMA_VERSION}" in message and "upgrade ucudnn" in message and "UCUDNN_CACHE" in message
        assert "install a newer ucudnn" in message and "ucudnn --version" in message and "-U" not in message


def make_v0(path: Path) -> ConvProblem:
    """A hand-made file of before versioning: no repeats, no provenance, no kernels table."""
    problem = conv(64, 64, 56, 3)
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE measurements (gpu_name TEXT NOT NULL, cudnn_version INTEGER NOT NULL, "
                     "shape_key TEXT NOT NULL, batch INTEGER NOT NULL, algo INTEGER NOT NULL, time_ms REAL, "
                     "workspace INTEGER NOT NULL, status TEXT NOT NULL, "
                     "PRIMARY KEY (gpu_name, cudnn_version, shape_key, batch, algo))")
        conn.execute("INSERT INTO measurements VALUES (?, ?, ?, 4, 1, 0.5, 1024, 'ok')",
                     (H100.gpu_name, H100.cudnn_version, problem.shape_key()))
    return problem


def test_older_schema_migrates(db_path):
    """A v0 file describes no kernel: its rows are kept, and read once a record describes theirs."""
    problem = make_v0(db_path)
    with BenchmarkDatabase(db_path) as db:
        with pytest.warns(UcudnnWarning, match="not the shape key of a kernel row"):
            assert list(db.table(problem, H100)) == []
        db.record(problem, H100, [Measurement("legacy:A2", 4, 0.25, 0, OK, 5)])
        assert set(db.table(problem, H100)) == {Measurement("legacy:IMPLICIT_PRECOMP_GEMM", 4, 0.5, 1024, OK, 0),
                                                Measurement("legacy:A2", 4, 0.25, 0, OK, 5)}
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_older_schema_read_only_cannot_migrate(db_path):
    make_v0(db_path)
    with pytest.raises(CacheError, match="open it writable once"):
        BenchmarkDatabase(db_path, readonly=True)


def make_v1(path: Path) -> ConvProblem:
    """A file as ucudnn wrote it before v2: every column but `execution`, which is not in the key."""
    problem = conv(64, 64, 56, 3)
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE measurements (gpu_name TEXT NOT NULL, cudnn_version INTEGER NOT NULL, "
                     "shape_key TEXT NOT NULL, batch INTEGER NOT NULL, algo INTEGER NOT NULL, time_ms REAL, "
                     "workspace INTEGER NOT NULL, status TEXT NOT NULL, repeats INTEGER NOT NULL DEFAULT 0, "
                     "compute_capability TEXT NOT NULL DEFAULT '', driver_version INTEGER NOT NULL DEFAULT 0, "
                     "host TEXT NOT NULL DEFAULT '', recorded_at TEXT NOT NULL DEFAULT '', "
                     "PRIMARY KEY (gpu_name, cudnn_version, shape_key, batch, algo)) WITHOUT ROWID")
        conn.execute("CREATE TABLE kernels (shape_key TEXT PRIMARY KEY NOT NULL, problem TEXT NOT NULL)")
        conn.execute("INSERT INTO measurements VALUES (?, ?, ?, 4, 1, 0.5, 1024, 'ok', 7, '9.0', 570, 'node1', 'then')",
                     (H100.gpu_name, H100.cudnn_version, problem.shape_key()))
        conn.execute("INSERT INTO kernels VALUES (?, ?)", (problem.shape_key(), json.dumps(problem.with_batch(1).to_dict())))
        conn.execute("PRAGMA user_version = 1")
    return problem


def test_v1_rows_become_direct_execution_rows_and_graph_rows_live_beside_them(db_path):
    problem = make_v1(db_path)
    graph = H100.for_execution("graph")
    with BenchmarkDatabase(db_path) as db:
        assert list(db.table(problem, H100)) == [Measurement("legacy:IMPLICIT_PRECOMP_GEMM", 4, 0.5, 1024, OK, 7)]
        assert len(db.table(problem, graph)) == 0  # never reused for the other execution
        db.record(problem, graph, [Measurement("legacy:A1", 4, 0.25, 1024, OK, 3)])
        assert list(db.table(problem, graph)) == [Measurement("legacy:A1", 4, 0.25, 1024, OK, 3)]
        assert list(db.table(problem, H100)) == [Measurement("legacy:IMPLICIT_PRECOMP_GEMM", 4, 0.5, 1024, OK, 7)]
        assert {d.execution for d in db.devices()} == {"direct", "graph"}
        assert db.verify() == []
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION >= 2
        keys = [row[1] for row in conn.execute("PRAGMA table_info(measurements)") if row[5]]
        assert "execution" in keys


QUICK = H100.for_timing("quick")


def stored_times(path: Path) -> list[tuple]:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT algo, time_ms, timing FROM measurements ORDER BY algo").fetchall()


def test_quick_timing_never_replaces_default_timing(db_path):
    problem = conv(64, 64, 56, 3)
    with BenchmarkDatabase(db_path) as db:
        db.record(problem, H100, [Measurement("legacy:A0", 4, 2.0, 0, OK, 9), Measurement("legacy:A1", 4, 2.0, 0, OK, 9)])
        db.record(problem, QUICK, [Measurement("legacy:A0", 4, 1.0, 0, OK, 1)])  # newer, but quick: ignored
        db.record(problem, QUICK, [Measurement("legacy:A2", 4, 1.0, 0, OK, 1)])  # nothing to replace: kept
        db.record(problem, QUICK, [Measurement("legacy:A2", 4, 0.5, 0, OK, 1)])  # quick replaces older quick
        db.record(problem, H100, [Measurement("legacy:A2", 4, 3.0, 0, OK, 9)])  # default replaces quick
        db.record(problem, H100, [Measurement("legacy:A1", 4, 1.5, 0, OK, 9)])  # newer default replaces default
        assert sorted(db.table(problem, QUICK), key=lambda m: m.algo) == [  # reads: timing is not in the reuse key
            Measurement("legacy:A0", 4, 2.0, 0, OK, 9), Measurement("legacy:A1", 4, 1.5, 0, OK, 9), Measurement("legacy:A2", 4, 3.0, 0, OK, 9)]
    assert stored_times(db_path) == [("A0", 2.0, "default"), ("A1", 1.5, "default"), ("A2", 3.0, "default")]


def test_merge_prefers_default_timing_whatever_the_order(tmp_path):
    problem = conv(64, 64, 56, 3)
    careful, quick = tmp_path / "careful.db", tmp_path / "quick.db"
    with BenchmarkDatabase(careful) as db:
        db.record(problem, H100, [Measurement("legacy:A0", 4, 2.0, 0, OK, 9)])
    with BenchmarkDatabase(quick) as db:  # recorded later
        db.record(problem, QUICK, [Measurement("legacy:A0", 4, 1.0, 0, OK, 1)])
    for order in ((careful, quick), (quick, careful)):
        target = tmp_path / f"merged-{order[0].stem}.db"
        merge(order, target)
        assert stored_times(target) == [("A0", 2.0, "default")]


def make_v2(path: Path) -> ConvProblem:
    """A file as ucudnn wrote it before v3: `execution` in the key, no `timing`."""
    problem = make_v1(path)
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE m2 (gpu_name TEXT NOT NULL, cudnn_version INTEGER NOT NULL, "
                     "execution TEXT NOT NULL DEFAULT 'direct', shape_key TEXT NOT NULL, batch INTEGER NOT NULL, "
                     "algo INTEGER NOT NULL, time_ms REAL, workspace INTEGER NOT NULL, status TEXT NOT NULL, "
                     "repeats INTEGER NOT NULL DEFAULT 0, compute_capability TEXT NOT NULL DEFAULT '', "
                     "driver_version INTEGER NOT NULL DEFAULT 0, host TEXT NOT NULL DEFAULT '', "
                     "recorded_at TEXT NOT NULL DEFAULT '', "
                     "PRIMARY KEY (gpu_name, cudnn_version, execution, shape_key, batch, algo)) WITHOUT ROWID")
        conn.execute("INSERT INTO m2 SELECT gpu_name, cudnn_version, 'direct', shape_key, batch, algo, time_ms, "
                     "workspace, status, repeats, compute_capability, driver_version, host, recorded_at "
                     "FROM measurements")
        conn.execute("DROP TABLE measurements")
        conn.execute("ALTER TABLE m2 RENAME TO measurements")
        conn.execute("PRAGMA user_version = 2")
    return problem


def test_a_v2_file_is_refused_read_only_and_migrated_when_writable(db_path):
    problem = make_v2(db_path)
    before = db_path.read_bytes()
    with pytest.raises(CacheError, match="open it writable once"):
        BenchmarkDatabase(db_path, readonly=True)  # v5 tells parts of sums, which every read needs
    assert db_path.read_bytes() == before
    with BenchmarkDatabase(db_path) as db:
        assert [d.execution for d in db.devices()] == ["direct"]
        db.record(problem, QUICK, [Measurement("legacy:IMPLICIT_PRECOMP_GEMM", 4, 0.25, 1024, OK, 1)])  # v2 rows were default-timed
        assert list(db.table(problem, H100)) == [Measurement("legacy:IMPLICIT_PRECOMP_GEMM", 4, 0.5, 1024, OK, 7)]
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5
        assert conn.execute("SELECT backend, frontend_version FROM measurements").fetchall() == [("legacy", "")]
    assert stored_times(db_path) == [("IMPLICIT_PRECOMP_GEMM", 0.5, "default")]


def test_an_export_of_schema_3_is_imported_with_named_candidates(tmp_path, db_path):
    problem = conv(64, 64, 56, 3)
    with BenchmarkDatabase(db_path) as db:
        db.record(problem, H100, [Measurement("legacy:FFT", 4, 0.5, 1024, OK, 7)])
        db.export_json(tmp_path / "export.json")
    document = json.loads((tmp_path / "export.json").read_text())
    row = document["measurements"][0]
    assert (row["backend"], row["algo"]) == ("legacy", "FFT")
    del row["backend"], row["frontend_version"]
    row["algo"], document["schema_version"] = 4, 3  # FFT is forward algorithm 4
    (tmp_path / "export.json").write_text(json.dumps(document))
    with BenchmarkDatabase(tmp_path / "other.db") as other:
        other.import_json(tmp_path / "export.json")
        assert list(other.table(problem, H100)) == [Measurement("legacy:FFT", 4, 0.5, 1024, OK, 7)]


def test_timing_presets_label_what_they_measure():
    from ucudnn.measure.parallel.devices import TIMINGS, default_factory

    assert {name: timing.name for name, timing in TIMINGS.items()} == {"default": "default", "quick": "quick"}
    assert default_factory("quick").keywords["timing"].name == "quick"
    with pytest.raises(ConfigError, match="'fast'.*default, quick"):
        Provenance("GPU", "9.0", 91900, timing="fast")


def test_the_memo_keeps_executions_apart(db_path):
    cache, problem = Cache(db_path), conv(64, 64, 56, 3)
    cache.record(problem, H100, [Measurement("legacy:A1", 4, 0.5, 0, OK, 3)])
    assert len(cache.table(problem, H100)) == 1
    assert len(cache.table(problem, H100.for_execution("graph"))) == 0


def test_an_unknown_execution_is_refused():
    with pytest.raises(ConfigError, match="'gpu'.*graph, direct"):
        Provenance("GPU", "9.0", 91900, execution="gpu")


# --- the in-memory memo ---


def test_memo_answers_repeated_layers(db_path):
    cache, bench = Cache(db_path), FakeBenchmarker(H100)
    problems = resnet50()
    for problem in problems:
        table_or_benchmark(cache, problem, bench)
    distinct = len({p.shape_key() for p in problems})
    assert bench.calls == cache.stats.misses == cache.stats.records == distinct < len(problems)
    # every repeated layer, and every first one re-read after recording it
    assert cache.stats.memo_hits == len(problems)
    assert cache.stats.file_errors == 0


def test_tables_prefetches_a_network_in_one_file_query(filled):
    cache = Cache(filled)
    problems = resnet50()
    found = cache.tables(problems, H100)
    assert cache.stats.file_hits == len({p.shape_key() for p in problems[:12]})
    assert cache.stats.misses == len({p.shape_key() for p in problems}) - cache.stats.file_hits
    assert found[problems[0].key].sizes == SIZES
    cache.tables(problems[:12], H100)
    assert cache.stats.memo_hits == len({p.shape_key() for p in problems[:12]})


def test_configurations_are_remembered(tmp_path):
    cache = Cache(use_file=False)
    key = (H100.reuse_key, conv(64, 64, 56, 3).key, "powerOfTwo", 64 * 2**20, "wr")
    configuration = Configuration((MicroConfig("legacy:A1", 16, 0.5, 2**20), MicroConfig("legacy:A1", 16, 0.5, 2**20)))
    assert cache.configuration(key) is None
    cache.remember(key, configuration)
    assert cache.configuration(key) is configuration and cache.stats.configuration_hits == 1


def test_memory_only_cache_touches_no_file(tmp_path, monkeypatch):
    monkeypatch.setenv("UCUDNN_CACHE", str(tmp_path / "never.db"))
    cache, bench = Cache(use_file=False), FakeBenchmarker(H100)
    table_or_benchmark(cache, conv(8, 8, 8), bench)
    table_or_benchmark(cache, conv(8, 8, 8), bench)
    assert bench.calls == 1 and not cache.using_file and not (tmp_path / "never.db").exists()


# --- paths ---


def test_path_comes_from_argument_then_environment_then_default(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("UCUDNN_CACHE", raising=False)
    assert default_path() == tmp_path / "xdg" / "ucudnn" / "benchmarks.db"
    assert Cache().path == default_path()
    monkeypatch.setenv("UCUDNN_CACHE", str(tmp_path / "env.db"))
    assert Cache().path == tmp_path / "env.db"
    assert Cache(tmp_path / "arg.db").path == tmp_path / "arg.db"
    assert Cache(tmp_path).path == shard_path(tmp_path)  # a directory: this host's shard in it


def test_shard_paths_are_per_host_and_optionally_per_process(tmp_path):
    assert shard_path(tmp_path, "gpu-node-01") == tmp_path / "gpu-node-01.db"
    assert shard_path(tmp_path, "gpu node/01", pid=42) == tmp_path / "gpu_node_01-42.db"


def test_recorded_paths_sort_naturally(tmp_path, monkeypatch):
    monkeypatch.setattr(paths_module, "_recordings_dir", lambda: tmp_path)
    assert recorded_path() is None
    for name in ("h100-cudnn100100.db", "h100-cudnn91900.db", "notes.json"):
        (tmp_path / name).touch()
    assert [p.name for p in recorded_paths()] == ["h100-cudnn91900.db", "h100-cudnn100100.db"]
    assert recorded_path() == tmp_path / "h100-cudnn100100.db"


def test_recordings_are_found_in_a_source_checkout():
    assert paths_module._recordings_dir() == REPO / "cache"
    assert all(p.suffix == ".db" for p in recorded_paths())


def test_pyproject_ships_every_package_and_the_recordings():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {".".join(d.relative_to(REPO).parts) for d in (REPO / "ucudnn").rglob("*")
               if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py"))} | {"ucudnn"}
    missing = on_disk - set(config["packages"])
    assert not missing, f"add {sorted(missing)} to [tool.setuptools] packages in pyproject.toml"
    assert config["package-dir"]["ucudnn.recorded"] == "cache"
    assert "*.db" in config["package-data"]["ucudnn.recorded"]
    assert (REPO / "cache" / "__init__.py").is_file()


# --- offline use and sharing ---


def _record_in_another_process(path: str) -> None:
    cache, bench = Cache(path), FakeBenchmarker(H100)
    for problem in resnet50():
        table_or_benchmark(cache, problem, bench)
    assert cache.stats.file_errors == 0


def test_offline_use_needs_no_benchmarking(db_path):
    process = multiprocessing.get_context("spawn").Process(target=_record_in_another_process, args=(str(db_path),))
    process.start()
    process.join(60)
    assert process.exitcode == 0
    elsewhere = Provenance(H100.gpu_name, "9.0", H100.cudnn_version, driver_version=575, host="node2")
    cache, bench = Cache(db_path, readonly=True), FakeBenchmarker(elsewhere)
    for problem in resnet50():
        assert as_set(table_or_benchmark(cache, problem, bench)) == set(fake_measurements(problem))
    assert bench.calls == 0 and cache.stats.misses == 0
    for other in (Provenance(H100.gpu_name, "9.0", 90100), Provenance("NVIDIA H200", "9.0", 91900)):
        assert len(Cache(db_path, readonly=True).table(resnet50()[0], other)) == 0


def test_merged_shards_equal_one_writer(tmp_path):
    problems = resnet50()[:30]
    hosts = [Provenance(H100.gpu_name, "9.0", H100.cudnn_version, 570, f"node{i}") for i in range(3)]
    single = tmp_path / "single.db"
    with BenchmarkDatabase(single) as one:
        for i, problem in enumerate(problems):  # hosts overlap on every third kernel: newest wins
            for host in (hosts[i % 3], hosts[(i + 1) % 3]) if i % 3 == 0 else (hosts[i % 3],):
                measurements = [Measurement(m.algo, m.batch, m.time_ms, m.workspace, m.status, i)
                                for m in fake_measurements(problem)]
                one.record(problem, host, measurements)
                with BenchmarkDatabase(shard_path(tmp_path / "shards", host.host)) as shard:
                    shard.record(problem, host, measurements)
    shards = sorted((tmp_path / "shards").glob("*.db"), reverse=True)  # order must not matter
    merged = merge(shards, tmp_path / "merged.db")
    assert merged == sum(len(dump(s)) for s in shards)
    assert dump(tmp_path / "merged.db") == dump(single)
    assert merge(shards, tmp_path / "merged.db") == merged and dump(tmp_path / "merged.db") == dump(single)


# --- faults: warn once, carry on in memory, never crash ---


def assert_carries_on(cache: Cache, bench: FakeBenchmarker) -> None:
    """Tables still work (from memory), benchmarking again; exactly one warning was given."""
    problem = conv(16, 16, 16, 3)  # in no fixture's file
    for _ in range(3):
        assert as_set(table_or_benchmark(cache, problem, bench)) == set(fake_measurements(problem))
    assert bench.calls == 1 and cache.stats.file_errors >= 1


def test_corrupt_file_warns_once_and_carries_on(db_path):
    db_path.write_bytes(os.urandom(64 * 1024))
    with pytest.warns(UcudnnWarning, match="damaged") as warned:
        cache = Cache(db_path)
        assert_carries_on(cache, FakeBenchmarker(H100))
    assert len(warned) == 1 and str(db_path) in str(warned[0].message)
    assert not cache.using_file


def test_truncated_file_warns_once_and_carries_on(filled):
    data = filled.read_bytes()
    filled.write_bytes(data[:len(data) // 2])
    with pytest.warns(UcudnnWarning) as warned:
        cache = Cache(filled)
        assert_carries_on(cache, FakeBenchmarker(H100))
        cache.tables(resnet50(), H100)
    assert len(warned) == 1


def test_damage_in_the_middle_is_a_named_error_of_the_database(filled):
    damage_middle(filled)
    with pytest.raises(DamagedDatabaseError, match="damaged.*ucudnn cache verify") as raised:
        BenchmarkDatabase(filled, check=True)  # the whole file checked at once
    assert str(filled) in str(raised.value)
    with BenchmarkDatabase(filled, readonly=True) as db:  # else where a read meets the damage
        for read in (db.devices, db.kernels, lambda: db.tables(resnet50(), H100)):
            with pytest.raises(DamagedDatabaseError):
                read()
        assert db.verify()[0].startswith("integrity:")


def test_damage_in_the_middle_warns_once_on_every_read_path(filled):
    damage_middle(filled)
    with pytest.warns(UcudnnWarning, match="damaged.*ucudnn cache verify") as warned:
        cache = Cache(filled)
        cache.tables(resnet50(), H100)  # reads the damaged page: set aside, carries on
        table_or_benchmark(cache, resnet50()[0], FakeBenchmarker(H100))
        assert_carries_on(cache, FakeBenchmarker(H100))
    assert len(warned) == 1 and str(filled) in str(warned[0].message) and not cache.using_file


def test_merge_of_a_damaged_shard_changes_nothing(filled, tmp_path):
    good, target = tmp_path / "good.db", tmp_path / "merged.db"
    filled.rename(good)
    damaged = tmp_path / "damaged.db"
    damaged.write_bytes(good.read_bytes())
    damage_middle(damaged)
    with pytest.raises(DamagedDatabaseError, match=str(damaged)):
        merge([good, damaged], target)
    assert not target.exists()  # nothing made: no empty file left behind
    merge([good], target)
    before = target.read_bytes()
    with pytest.raises(DamagedDatabaseError):
        merge([good, damaged], target)
    assert target.read_bytes() == before


def test_import_of_a_bad_export_writes_nothing(db_path, tmp_path):
    bad = tmp_path / "bad.json"
    for text in ("{}", "not json", '{"format": "ucudnn-benchmarks"}'):
        bad.write_text(text)
        with pytest.raises(CacheError, match="bad.json is not a ucudnn benchmark export"):
            read_export(bad)
    bad.write_bytes(b"\xff\xfe")
    with pytest.raises(CacheError, match="not a ucudnn benchmark export"):
        read_export(bad)
    assert not db_path.exists()


def test_read_only_file_is_read_but_not_written(filled, monkeypatch):
    """A write-protected file. chmod 0o444 does not stop root (the tests run as root), so the
    file is opened the way SQLite opens a write-protected one for anyone else: read-only
    (mode=ro). Reads go on; the first write warns; later writes are not tried."""
    real_connect = database_module.connect
    monkeypatch.setattr(database_module, "connect", lambda path, **kw: real_connect(path, **{**kw, "readonly": True}))
    before = dump(filled)
    bench = FakeBenchmarker(H100)
    with pytest.warns(UcudnnWarning, match="writable") as warned:
        cache = Cache(filled)
        assert as_set(cache.table(resnet50()[0], H100)) == set(fake_measurements(resnet50()[0]))
        assert_carries_on(cache, bench)
        table_or_benchmark(cache, conv(8, 8, 8), bench)
    assert len(warned) == 1 and cache.using_file and cache.stats.file_errors == 1
    assert dump(filled) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to 0o444 files; the mode=ro test covers it")
def test_chmod_read_only_file(filled):
    filled.chmod(0o444)
    with pytest.warns(UcudnnWarning, match="writable"):
        assert_carries_on(Cache(filled), FakeBenchmarker(H100))


def test_read_only_cache_never_writes(filled):
    before = dump(filled)
    cache = Cache(filled, readonly=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        table_or_benchmark(cache, conv(8, 8, 8), FakeBenchmarker(H100))
    assert dump(filled) == before and cache.stats.file_errors == 0


def test_missing_read_only_file_warns_once(tmp_path):
    with pytest.warns(UcudnnWarning, match="cannot be opened.*path exists") as warned:
        assert_carries_on(Cache(tmp_path / "absent.db", readonly=True), FakeBenchmarker(H100))
    assert len(warned) == 1


def test_file_locked_for_long_warns_once_and_carries_on(filled):
    holder = sqlite3.connect(filled, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        start = time.monotonic()
        with pytest.warns(UcudnnWarning, match="locked") as warned:
            cache = Cache(filled, timeout_s=0.3)
            assert_carries_on(cache, FakeBenchmarker(H100))
        assert len(warned) == 1 and time.monotonic() - start < 5
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_database_retries_until_a_short_lock_is_released(filled):
    holder = sqlite3.connect(filled, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    threading.Timer(1.5, lambda: (holder.execute("ROLLBACK"), holder.close())).start()
    with BenchmarkDatabase(filled, timeout_s=10) as db:  # longer than SQLite's own busy slice
        db.record(conv(8, 8, 8), H100, [Measurement("legacy:A0", 1, 1.0, 0)])
        assert len(db.table(conv(8, 8, 8), H100)) == 1


def test_unwritable_directory_warns_once(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.warns(UcudnnWarning) as warned:
        assert_carries_on(Cache(blocker / "sub" / "benchmarks.db"), FakeBenchmarker(H100))
    assert len(warned) == 1


# --- speed ---


def test_resnet50_lookup_from_the_file(db_path):
    problems = resnet50()
    distinct = {p.shape_key(): p for p in problems}
    with BenchmarkDatabase(db_path) as db:
        for problem in distinct.values():
            db.record(problem, H100, fake_measurements(problem))
        db.record(conv(8, 8, 8), Provenance("other", "8.0", 1), [Measurement("legacy:A0", 1, 1.0, 0)])
    walls, cpus = [], []
    for _ in range(10):  # the best of ten: other processes on a small machine add noise
        wall, cpu = time.perf_counter(), time.process_time()
        found = Cache(db_path, readonly=True).tables(problems, H100)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    rows = sum(len(found[p.key]) for p in distinct.values())
    assert rows == len(distinct) * len(SIZES) * len(ALGOS)
    best = min(walls) * 1e3
    print(f"\nResNet-50 lookup: {len(problems)} kernels ({len(distinct)} shape keys, {rows} measurements) "
          f"from the file in {best:.1f} ms (open + one query; median {sorted(walls)[5] * 1e3:.1f} ms, "
          f"CPU {min(cpus) * 1e3:.1f} ms)")


def test_docs_examples_run(tmp_path, capsys):
    text = (REPO / "docs" / "cache.md").read_text()
    for block in re.findall(r"```python\n(.*?)```", text, re.S):
        exec(block.replace("/tmp/", f"{tmp_path}/"), {})
    assert "Measurement(algo='legacy:IMPLICIT_PRECOMP_GEMM', batch=32" in capsys.readouterr().out


@pytest.mark.skipif(recorded_path() is None, reason="no recorded measurements are shipped in cache/")
def test_resnet50_lookup_from_the_shipped_recording():
    """Issue 3's figure on real data: every kernel of ResNet-50 (B=64, fp32) from the H100 file."""
    from ucudnn.core.nets import get_network

    problems = [k.problem for k in get_network("resnet50").problems(64)]
    with BenchmarkDatabase(recorded_path(), readonly=True) as db:
        device = next(d for d in db.devices() if "H100" in d.gpu_name)
    walls = []
    for _ in range(10):
        start = time.perf_counter()
        found = Cache(recorded_path(), readonly=True).tables(problems, device)
        walls.append(time.perf_counter() - start)
    rows = sum(len(table) for table in found.values())
    # the shipped file is pruned to what plans can use (`ucudnn cache prune`): ~850 rows for these kernels
    assert all(len(table) for table in found.values()) and rows > 500
    print(f"\nshipped ResNet-50 lookup: {len(found)} shape keys, {rows} measurements in "
          f"{min(walls) * 1e3:.1f} ms (best of 10; median {sorted(walls)[5] * 1e3:.1f} ms)")


# --- parts of backward-filter sums, kept apart from whole calls (ucudnn.core.accumulation) ---


def test_a_kernel_plans_with_parts_below_its_batch_and_whole_calls_at_it(db_path):
    bf = conv(16, 16, 14, 3, batch=64).with_kind("BF")
    part = lambda b, ms: Measurement("legacy:A0", b, ms, 0, OK, 3, True)  # noqa: E731
    whole = lambda b, ms: Measurement("legacy:A0", b, ms, 0, OK, 3, False)  # noqa: E731
    with BenchmarkDatabase(db_path) as db:
        db.record(bf, H100, [part(16, 1.5), part(32, 2.5), whole(32, 2.0), whole(64, 4.0)])
        assert sorted((m.batch, m.time_ms) for m in db.table(bf, H100)) == [(16, 1.5), (32, 2.5), (64, 4.0)]
        assert sorted((m.batch, m.time_ms) for m in db.table(bf.with_batch(32), H100)) == [(16, 1.5), (32, 2.0),
                                                                                           (64, 4.0)]
        # a part stands in for the whole call where no whole call was measured, never the other way
        assert sorted((m.batch, m.time_ms) for m in db.table(bf.with_batch(16), H100) if m.batch <= 16) == [(16, 1.5)]
        forward = bf.with_kind("F")
        db.record(forward, H100, [whole(32, 1.0)])
        assert [m.batch for m in db.table(forward, H100)] == [32]  # F and BD are never parts


def test_a_whole_call_measured_first_is_measured_again_as_a_part(tmp_path):
    """Recording ResNet-50 at 32 then at 64 samples: the BF row at 32 of the first kernel is a
    whole call; the second kernel needs it as a part of its sum and measures it again."""
    small = conv(64, 64, 56, 1, batch=32).with_kind("BF")
    large = small.with_batch(64)
    cache = Cache(tmp_path / "db.sqlite")
    bench = FakeBenchmarker(H100)
    for problem in (small, large):
        table = cache.table(problem, H100)
        missing = FULL.missing(table, (16, 32, problem.batch), None)
        cache.record(problem, H100, [replace(m, accumulates=accumulates(problem, m.batch))
                                     for m in bench.measure(problem, missing, None)])
    assert bench.calls == 2 and sorted(m.batch for m in cache.table(large, H100)) == [16] * 8 + [32] * 8 + [64] * 8
    assert all(m.accumulates == (m.batch < 64) for m in cache.table(large, H100))


def _v4_row(shape_key, batch, backend, algo, workspace, recorded_at):
    return dict(gpu_name="G", cudnn_version=1, execution="graph", shape_key=shape_key, batch=batch, backend=backend,
                algo=algo, workspace=workspace, recorded_at=recorded_at)


def test_v4_rows_are_parts_where_a_larger_size_was_measured_by_their_call():
    from ucudnn.measure.cache.schema import v4_accumulates

    bf = conv(64, 64, 56, 1).with_kind("BF")
    half = replace(bf, dtype="float16")
    key, half_key = bf.shape_key(), half.shape_key()
    rows = [_v4_row(key, 32, "legacy", "A0", 0, "t1"), _v4_row(key, 16, "legacy", "A0", 0, "t1"),  # kernel of 32
            _v4_row(key, 64, "legacy", "A0", 0, "t2"),  # then one of 64 measured only its own size
            _v4_row(key, 48, "legacy", "A0", 0, "t3"),  # a later top-up below the largest: a part
            _v4_row(key, 16, "engines", "e", 0, "t1"),  # an engine part without its buffers: a whole call
            _v4_row(key, 8, "engines", "e", 10**8, "t1"), _v4_row(key, 32, "engines", "e", 0, "t1"),
            _v4_row(half_key, 8, "legacy", "A0", 0, "t1"), _v4_row(half_key, 32, "legacy", "A0", 0, "t1"),
            _v4_row(bf.with_kind("F").shape_key(), 8, "legacy", "A0", 0, "t1"),
            _v4_row(bf.with_kind("F").shape_key(), 32, "legacy", "A0", 0, "t1")]
    problems = {p.shape_key(): p.with_batch(1) for p in (bf, half, bf.with_kind("F"))}
    kept = {(r["shape_key"][:2], r["batch"], r["backend"]): r["accumulates"] for r in v4_accumulates(rows, problems)}
    assert kept == {("BF", 32, "legacy"): 0, ("BF", 16, "legacy"): 1, ("BF", 64, "legacy"): 0, ("BF", 48, "legacy"): 1,
                    ("BF", 16, "engines"): 0, ("BF", 8, "engines"): 1, ("BF", 32, "engines"): 0,
                    ("F|", 8, "legacy"): 0, ("F|", 32, "legacy"): 0}
    assert sum(1 for r in v4_accumulates(rows, problems) if r["shape_key"] == half_key) == 1


def test_a_v4_file_is_migrated_and_its_half_legacy_parts_dropped(db_path):
    half = conv(16, 16, 14, 3, batch=64).with_kind("BF")
    half = replace(half, dtype="float16", math="tensor_op", layout="nhwc")
    with BenchmarkDatabase(db_path) as db:
        db.record(half, H100, [Measurement("legacy:A0", b, 1.0, 0, OK, 3, b < 64) for b in (8, 64)])
    with sqlite3.connect(db_path) as conn:  # back to v4: no accumulates column
        conn.execute("UPDATE measurements SET accumulates = 0")
        conn.execute("PRAGMA user_version = 4")
    with pytest.raises(CacheError, match="open it writable once"):
        BenchmarkDatabase(db_path, readonly=True)
    with BenchmarkDatabase(db_path) as db:
        assert [(m.batch, m.accumulates) for m in db.table(half, H100)] == [(64, False)]
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 5


def test_an_export_of_schema_4_gets_its_parts_told_apart(tmp_path, db_path):
    bf = conv(16, 16, 14, 3, batch=64).with_kind("BF")
    with BenchmarkDatabase(db_path) as db:
        db.record(bf, H100, [Measurement("legacy:A0", b, 1.0, 0, OK, 3, b < 64) for b in (8, 64)])
        db.export_json(tmp_path / "export.json")
    document = json.loads((tmp_path / "export.json").read_text())
    for row in document["measurements"]:
        del row["accumulates"]
    document["schema_version"] = 4
    (tmp_path / "export.json").write_text(json.dumps(document))
    with BenchmarkDatabase(tmp_path / "other.db") as other:
        other.import_json(tmp_path / "export.json")
        assert sorted((m.batch, m.accumulates) for m in other.table(bf, H100)) == [(8, True), (64, False)]


# --- the rules of a row ---


BAD_VALUES = [("gpu_name", ""), ("gpu_name", None), ("cudnn_version", "nine"), ("cudnn_version", 2**63),
              ("execution", "teleport"), ("shape_key", "F|no kernel"), ("batch", 0), ("batch", 2.5),
              ("accumulates", 2), ("accumulates", True), ("backend", "magic"), ("algo", 7), ("time_ms", "fast"),
              ("time_ms", -0.5), ("time_ms", float("nan")), ("time_ms", float("inf")), ("time_ms", None),
              ("time_ms", 0), ("time_ms", 5e-324), ("time_ms", 1e300),
              ("workspace", -1), ("workspace", 10**30), ("status", "great"), ("repeats", [3]), ("host", 5),
              ("driver_version", -570), ("timing", "sloppy"), ("frontend_version", None)]


@pytest.mark.parametrize("column, value", BAD_VALUES)
def test_each_bad_value_breaks_its_columns_rule_alone(column, value):
    from ucudnn.measure.cache import rows
    from ucudnn.measure.cache.adding import kernel_row, measurement_row

    problem = conv(8, 8, 8)
    good = measurement_row(H100, problem.shape_key(), Measurement("legacy:A0", 4, 0.5, 64, OK, 3), "then")
    assert rows.problems(rows.staged([kernel_row(problem)], [good])) == []
    found = rows.problems(rows.staged([kernel_row(problem)], [{**good, column: value}]))
    shown = value.decode() if isinstance(value, bytes) else repr(value)
    assert len(found) == 1 and found[0].startswith(f"1 measurement(s) whose {column} {shown} is not "), found


def test_reads_skip_invalid_rows_with_one_warning_naming_the_file_and_the_row(filled, tmp_path):
    problem = resnet50()[0]
    spoil(filled, f"UPDATE measurements SET time_ms = 'fast' WHERE algo = 'A0' AND batch = 1 AND shape_key = '{problem.shape_key()}'",
          "UPDATE measurements SET execution = 'teleport' WHERE algo = 'A1' AND batch = 2")
    good = [m for m in fake_measurements(problem) if (m.algo, m.batch) not in (("legacy:A0", 1), ("legacy:A1", 2))]
    with BenchmarkDatabase(filled, readonly=True) as db, pytest.warns(UcudnnWarning) as warned:
        assert as_set(db.lookup([problem.shape_key()], H100)[problem.shape_key()]) == set(good)
        assert [d.execution for d in db.devices()] == ["direct"]
        assert sum(n for _, n in db.kernels()) == 12 * len(SIZES) * len(ALGOS) - 1 - 12
        db.export_json(tmp_path / "export.json")
    assert len(warned) == 1
    message = str(warned[0].message)
    assert str(filled) in message and "skipped" in message and "ucudnn cache verify" in message
    assert re.search(r"time_ms 'fast'|execution 'teleport'", message)
    assert len(read_export(tmp_path / "export.json")[1]) == 12 * len(SIZES) * len(ALGOS) - 1 - 12


def test_verify_names_each_broken_rule_with_a_row_and_its_value(filled):
    spoil(filled, "UPDATE measurements SET time_ms = 'fast' WHERE algo = 'A0' AND batch = 1",
          "UPDATE measurements SET workspace = -5 WHERE algo = 'A1' AND batch = 1",
          "UPDATE measurements SET backend = 'magic' WHERE algo = 'A2' AND batch = 1",
          "UPDATE kernels SET problem = '{\"kind\": \"F\"}' WHERE rowid = 2")
    with BenchmarkDatabase(filled, readonly=True) as db:
        problems = db.verify()
    assert any(re.match(r"12 measurement\(s\) whose time_ms 'fast' is not a number from 1e-06 to 1e\+09", p) for p in problems)
    assert any(re.match(r"12 measurement\(s\) whose workspace -5 is not an integer from 0 to", p) for p in problems)
    assert any(re.match(r"12 measurement\(s\) whose backend 'magic' is not one of legacy, engines", p) for p in problems)
    assert any(re.match(r"1 kernel row\(s\) whose problem does not describe a convolution of its shape key", p)
               for p in problems)
    assert all(" e.g. " in p for p in problems)


def test_import_json_checks_every_row_before_it_writes(filled, tmp_path):
    with BenchmarkDatabase(filled) as db:
        db.export_json(tmp_path / "export.json")
    document = json.loads((tmp_path / "export.json").read_text())
    document["measurements"][-1]["batch"] = 0
    (tmp_path / "export.json").write_text(json.dumps(document))
    before = checksums(filled)
    with BenchmarkDatabase(filled) as db, pytest.raises(CacheError, match=r"batch 0 is not .* e\.g\. measurements\[\d+\]"):
        db.import_json(tmp_path / "export.json")
    assert checksums(filled) == before


# --- files that are not ucudnn's, and files ucudnn makes ---


@pytest.mark.parametrize("kind", ["empty", "people"])
def test_a_file_ucudnn_did_not_make_is_neither_read_nor_written(db_path, kind):
    make_foreign(db_path, kind)
    before = checksums(db_path)
    for readonly in (False, True):
        with pytest.raises(CacheError, match=f"{db_path} is not a ucudnn benchmark database") as raised:
            BenchmarkDatabase(db_path, readonly=readonly)
        assert "schema version" not in str(raised.value) and "writable" not in str(raised.value)
    with pytest.warns(UcudnnWarning, match="is not a ucudnn benchmark database") as warned:
        assert_carries_on(Cache(db_path), FakeBenchmarker(H100))
    assert len(warned) == 1 and checksums(db_path) == before


def test_a_new_database_appears_whole_to_every_opener(db_path):
    """Many openers of a missing path at once: each finds a whole database, never an empty file."""
    start, errors = threading.Barrier(8), []

    def open_and_record(i: int) -> None:
        start.wait()
        try:
            with BenchmarkDatabase(db_path) as db:
                db.record(resnet50()[i], H100, fake_measurements(resnet50()[i]))
        except Exception as error:  # noqa: BLE001 - collected for the assertion
            errors.append(error)

    threads = [threading.Thread(target=open_and_record, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and sorted(p.name for p in db_path.parent.iterdir()) == [db_path.name]
    with BenchmarkDatabase(db_path, readonly=True) as db:
        assert len(db.kernels()) == 8


def test_merge_reads_an_older_shard_without_writing_it_and_an_interrupted_one_as_last_committed(filled, tmp_path):
    """The journal of an interrupted write is rolled back in place, as any writer's open would:
    the shard then holds what its last commit left, and nothing else of it changes."""
    older, interrupted = tmp_path / "older.db", tmp_path / "interrupted.db"
    older.write_bytes(filled.read_bytes())
    spoil(older, "PRAGMA user_version = 4")
    problem = conv(16, 16, 16, 3)
    with BenchmarkDatabase(interrupted) as db:
        db.record(problem, H100, fake_measurements(problem))
    writer = sqlite3.connect(interrupted, isolation_level=None)
    writer.execute("PRAGMA cache_size = 1")  # spill to the file: the journal holds the committed pages
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("DELETE FROM measurements")
    writer.execute("INSERT INTO kernels VALUES ('junk', zeroblob(100000))")
    files = (interrupted, interrupted.with_name(interrupted.name + "-journal"))
    state = [path.read_bytes() for path in files]  # as a process killed mid-write leaves it: a hot journal
    writer.execute("ROLLBACK")
    writer.close()
    for path, content in zip(files, state):
        path.write_bytes(content)
    before = checksums(older)
    assert files[1].exists()
    merged = merge([older, interrupted], tmp_path / "merged.db")
    assert merged == len(dump(filled)) + len(fake_measurements(problem))
    assert checksums(older) == before and not files[1].exists()
    assert len(dump(interrupted)) == len(fake_measurements(problem))


# --- what export and import keep, and what a stop leaves ---


def test_an_export_replaces_a_file_whole_and_only_when_forced(filled, tmp_path, monkeypatch):
    """An export is written beside its file and renamed into place: stopped before the rename, the
    file is as it was and nothing is left beside it."""
    target = tmp_path / "export.json"
    target.write_text("an older export")

    def stopped(*args):
        raise KeyboardInterrupt
    with BenchmarkDatabase(filled) as db:
        with pytest.raises(CacheError, match=f"{target} exists; .*--force"):
            db.export_json(target)
        with monkeypatch.context() as patched:
            patched.setattr(database_module.os, "replace", stopped)  # the export written, not yet renamed
            with pytest.raises(KeyboardInterrupt):
                db.export_json(target, force=True)
        assert target.read_text() == "an older export"
        assert db.export_json(target, force=True) == len(dump(filled))
    assert json.loads(target.read_text())["format"] == "ucudnn-benchmarks"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["benchmarks.db", "export.json"]


def test_an_export_never_replaces_its_database_or_another(filled, tmp_path):
    other, foreign = tmp_path / "other.db", make_foreign(tmp_path / "foreign.db", "people")
    other.write_bytes(filled.read_bytes())
    before = checksums(filled, other, foreign)
    with BenchmarkDatabase(filled) as db:
        with pytest.raises(CacheError, match=f"{filled} is the database being exported; name a new file"):
            db.export_json(filled, force=True)
        for target in (other, foreign):
            with pytest.raises(CacheError, match=f"{target} is a database, which an export never replaces"):
                db.export_json(target, force=True)
    assert checksums(filled, other, foreign) == before


def test_adding_rows_counts_what_it_added_replaced_and_left(filled, tmp_path):
    """Two rows of one key were counted as two measurements imported, and one was kept."""
    with BenchmarkDatabase(filled) as db:
        db.export_json(tmp_path / "export.json")
    kernels, rows = read_export(tmp_path / "export.json")
    first, second, third = rows[:3]
    given = [first, {**first, "time_ms": first["time_ms"] * 2},  # a duplicate ranked alike: the later kept
             second,  # the same as the database's
             {**third, "timing": "quick", "time_ms": 5.0},  # ranked lower than the database's default-timed one
             {**third, "algo": "A9"}]  # a new key
    with BenchmarkDatabase(filled) as db:
        added = db.add_rows(kernels, given)
    assert (added.rows, added.duplicates, added.new, added.replaced, added.unchanged) == (5, 1, 1, 1, 2)
    stored = {(row[2], row[3], row[4]): row[5] for row in dump(filled)}  # shape key, batch, algorithm: time
    assert len(stored) == len(rows) + 1
    assert stored[first["shape_key"], first["batch"], first["algo"]] == first["time_ms"] * 2


class _StopsMidWrite:
    """A connection that is stopped (KeyboardInterrupt, as Ctrl-C raises it) once `after`
    measurement rows of its writes are written."""

    def __init__(self, conn: sqlite3.Connection, after: int):
        self._conn, self.left = conn, after

    def __getattr__(self, name: str):
        return getattr(self._conn, name)

    def executemany(self, sql: str, rows):
        rows = list(rows)
        if sql == schema.UPSERT_MEASUREMENT:
            if len(rows) > self.left:
                self._conn.executemany(sql, rows[:self.left])
                raise KeyboardInterrupt
            self.left -= len(rows)
        return self._conn.executemany(sql, rows)


def test_an_import_stopped_mid_write_leaves_the_database_as_it_was(filled, tmp_path, monkeypatch):
    """Ctrl-C in an import kept the rows of each 1000 written before it."""
    with BenchmarkDatabase(tmp_path / "a100.db") as other:
        for problem in resnet50():
            other.record(problem, replace(H100, gpu_name="NVIDIA A100-SXM4-80GB"), fake_measurements(problem))
        other.export_json(tmp_path / "export.json")
    before = checksums(filled)
    with BenchmarkDatabase(filled) as db:
        monkeypatch.setattr(db, "_conn", _StopsMidWrite(db._conn, after=2500))  # of 69 kernels' 4968 rows
        with pytest.raises(KeyboardInterrupt):
            db.import_json(tmp_path / "export.json")
    assert checksums(filled) == before


def test_overwritten_pages_are_one_problem_unless_the_details_are_asked_for(filled):
    """A page overwritten by another made SQLite's whole report, a line per problem, one error."""
    overwrite_root(filled, "measurements", "sqlite_autoindex_kernels_1")
    with pytest.raises(DamagedDatabaseError) as raised:
        BenchmarkDatabase(filled, check=True)
    assert "\n" not in str(raised.value)
    assert re.search(r"SQLite's quick check reports \d+ problems, the first: \w", str(raised.value))
    with BenchmarkDatabase(filled, readonly=True) as db:
        brief, details = db.verify(), db.verify(details=True)
    assert len(brief) == 1 and re.match(r"integrity: SQLite's integrity check reports (\d+) problems, the "
                                        r"first: .*; `ucudnn cache verify --details` lists them", brief[0])
    assert len(details) == int(re.search(r"reports (\d+)", brief[0]).group(1)) > 1
    assert all(re.fullmatch(r"integrity: [^\n*]+", problem) for problem in details), details


def test_ucudnn_cache_path_is_refused_naming_ucudnn_cache():
    """UCUDNN_CACHE_PATH, documented nowhere, chose the database where UCUDNN_CACHE was unset."""
    for env in ({"UCUDNN_CACHE_PATH": "x.db"}, {"UCUDNN_CACHE_PATH": "x.db", "UCUDNN_CACHE": "y.db"}):
        with pytest.raises(ConfigError, match=r"UCUDNN_CACHE_PATH='x.db' is not read: .* is UCUDNN_CACHE"):
            paths_module.cache_path(env=env)
        with pytest.raises(ConfigError, match="UCUDNN_CACHE_PATH"):
            paths_module.cache_path("z.db", env=env)
