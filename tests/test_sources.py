"""ucudnn.plan.sources (where measurements come from), the one cache-path rule, the vocabulary that
bindings number, and what a Provenance is made of."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from ucudnn.core.device import Hardware, MeasurementKind, Provenance
from ucudnn.core.errors import CacheError, MissingMeasurementsError
from ucudnn.core.nets import get_network
from ucudnn.core.problem import DTYPES, LAYOUTS, MATH_TYPES, MODES
from ucudnn.execute.bindings import enums
from ucudnn.measure.cache.database import BenchmarkDatabase
from ucudnn.measure.cache.paths import cache_path, default_path, recorded_path
from ucudnn.plan.config import Settings
from ucudnn.plan.sources import tables_for

from synthetic import DEVICE, record_network


def test_the_cache_path_is_the_argument_then_the_variable_then_the_default():
    env = {"UCUDNN_CACHE": "/tmp/env.db"}
    assert cache_path("/tmp/arg.db", env=env) == Path("/tmp/arg.db")
    assert cache_path(None, env=env) == cache_path(None, readonly=True, env=env) == Path("/tmp/env.db")
    assert cache_path(None, env={}) == default_path()
    assert cache_path(None, readonly=True, env={}) == recorded_path()


@pytest.fixture
def synthetic_db(tmp_path) -> Path:
    path = tmp_path / "synthetic.db"
    with BenchmarkDatabase(path) as database:
        record_network(database, get_network("alexnet").problems(256))
    return path


def test_tables_for_reads_the_recording_with_the_most_measurements(synthetic_db):
    problems = [k.problem for k in get_network("alexnet").problems(256)]
    found = tables_for(problems, Settings.load(env={}, cache_path=str(synthetic_db)), 64 * 2**20, measure=False)
    assert (found.device, found.path, found.measured) == (DEVICE, synthetic_db, False)
    assert set(found.tables) == {p.key for p in problems} and all(len(t) for t in found.tables.values())


def test_tables_for_names_what_is_missing_or_explains_it(synthetic_db):
    problems = [k.problem for k in get_network("resnet18").problems(128)]
    settings = Settings.load(env={}, cache_path=str(synthetic_db))
    with pytest.raises(MissingMeasurementsError):
        tables_for(problems, settings, None, measure=False)
    with pytest.raises(LookupError, match="explained"):
        tables_for(problems, settings, None, measure=False,
                   explain=lambda error, database, device: LookupError(f"explained on {device.gpu_name}"))
    with pytest.raises(MissingMeasurementsError, match="--execution graph"):
        tables_for(problems, Settings.load(env={}, cache_path=str(synthetic_db), execution="direct"), None,
                   measure=False)
    with pytest.raises(CacheError, match="no benchmark database"):
        tables_for(problems, Settings.load(env={}, cache_path=str(synthetic_db) + ".absent"), None, measure=False)


def test_bindings_number_exactly_the_problem_models_names():
    for names, numbers in ((DTYPES, enums.DATA_TYPE), (LAYOUTS, enums.TENSOR_FORMAT),
                           (MATH_TYPES, enums.MATH_TYPE), (MODES, enums.CONV_MODE)):
        assert list(numbers) == list(names)
    with pytest.raises(RuntimeError, match="do not match"):
        enums._numbered(("a", "b"), {"a": 0})


def test_a_provenance_is_hardware_and_how_it_was_measured():
    hardware, kind = Hardware("GPU", "9.0", 91900, 570, "node1"), MeasurementKind("graph", "quick")
    provenance = Provenance.of(hardware, kind)
    assert (provenance.hardware, provenance.kind) == (hardware, kind)
    assert provenance == Provenance("GPU", "9.0", 91900, 570, "node1", execution="graph", timing="quick")
    assert provenance.describe() == f"{hardware.describe()}, graph execution"


@pytest.fixture
def shard_folder(tmp_path) -> Path:
    """AlexNet at batch 256 recorded in two shards of one folder, half the kernels each."""
    folder = tmp_path / "shards"
    folder.mkdir()
    kernels = get_network("alexnet").problems(256)
    for name, part in (("node1.db", kernels[:8]), ("node2.db", kernels[8:])):
        with BenchmarkDatabase(folder / name) as database:
            record_network(database, part)
    return folder


def test_a_shard_folder_reads_as_its_shards_merged_and_stays_unchanged(shard_folder, tmp_path, monkeypatch):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    before = {path.name: path.read_bytes() for path in shard_folder.iterdir()}
    problems = [k.problem for k in get_network("alexnet").problems(256)]
    found = tables_for(problems, Settings.load(env={}, cache_path=str(shard_folder)), 64 * 2**20, measure=False)
    assert (found.device, found.path) == (DEVICE, shard_folder)
    assert all(len(found.tables[p.key]) for p in problems)
    assert {path.name: path.read_bytes() for path in shard_folder.iterdir()} == before
    assert list(scratch.iterdir()) == []  # the merged copy is gone


def test_a_folder_without_shards_is_named(tmp_path):
    problems = [k.problem for k in get_network("alexnet").problems(256)]
    with pytest.raises(CacheError, match=f"{tmp_path} holds no shard files"):
        tables_for(problems, Settings.load(env={}, cache_path=str(tmp_path)), None, measure=False)
