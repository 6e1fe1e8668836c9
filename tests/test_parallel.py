"""Parallel benchmarking on the CPU: the partition of (kernel, size, backend) tasks, worker
processes with a fake benchmarker of both backends (crashing ones included), and the MPI logic
with ranks simulated by threads."""
from __future__ import annotations

import functools
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from ucudnn.cli import build_parser, commands
from ucudnn.core.accumulation import accumulates
from ucudnn.core.device import Provenance
from ucudnn.core.errors import ConfigError, MissingMeasurementsError, install_extra
from ucudnn.core.nets import get_network
from ucudnn.execute.backends import BACKENDS, CHOICES, resolve
from ucudnn.measure import parallel
from ucudnn.measure.benchmark import ensure_tables
from ucudnn.measure.cache import BenchmarkDatabase, schema
from ucudnn.measure.parallel import (
    MeasureCall,
    Task,
    bench_devices,
    bench_on_devices,
    bench_with_mpi,
    calls,
    partition,
    split_tasks,
)
from ucudnn.plan.config import batch_sizes

from fakes import FAKE_DEVICE, FakeBenchmarker

BATCH = 12
PROBLEMS = [k.problem for k in get_network("alexnet").problems(BATCH)]  # 15 kernels
OTHER_GPU = Provenance("Other GPU", "8.0", 91900, 0, "testhost")


def sizes_for(problem):
    return batch_sizes("all", problem.batch)


# ---- helpers the worker processes import (spawn pickles them by name)


def fake_factory(device: int) -> FakeBenchmarker:
    """A benchmarker that can measure either backend: the sweep decides which it is asked for."""
    return FakeBenchmarker(backends=BACKENDS)


def other_gpu_factory(device: int) -> FakeBenchmarker:
    return FakeBenchmarker(OTHER_GPU if device == 1 else FAKE_DEVICE)


def setting_factory(device: int, backend: str) -> FakeBenchmarker:
    """As cuda_benchmarker: a benchmarker of the backends its `backend` setting names only."""
    return FakeBenchmarker(backends=resolve(backend))


def fake_default_factory(timing, execution="graph", backend="") -> functools.partial:
    """Stands in for parallel.devices.default_factory: what the sweep gives its workers."""
    return functools.partial(setting_factory, backend=backend)


class CrashingBenchmarker(FakeBenchmarker):
    """Dies (os._exit or a signal) at its call number `after` + 1, leaving a marker file."""

    def __init__(self, after: int, how: str, marker: str):
        super().__init__()
        self.after, self.how, self.marker, self.count = after, how, marker, 0

    def measure(self, problem, sizes, cap, backend=None, best=None, skip=()):
        self.count += 1
        if self.count > self.after:
            Path(self.marker).touch()
            if self.how == "raise":
                raise RuntimeError("simulated cuDNN failure")
            if self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(3)
        return super().measure(problem, sizes, cap, backend)


def crashing_factory(device: int, crash_on: int, after: int, how: str, marker: str) -> FakeBenchmarker:
    return CrashingBenchmarker(after, how, marker) if device == crash_on else FakeBenchmarker()


class StoppingBenchmarker(FakeBenchmarker):
    """Sends its parent SIGTERM at its call number `after` + 1, then measures on slowly."""

    def __init__(self, after: int):
        super().__init__()
        self.after, self.count = after, 0

    def measure(self, problem, sizes, cap, backend=None, best=None, skip=()):
        self.count += 1
        if self.count == self.after + 1:
            os.kill(os.getppid(), signal.SIGTERM)
        if self.count > self.after:
            time.sleep(0.5)
        return super().measure(problem, sizes, cap, backend)


def stopping_factory(device: int, after: int) -> FakeBenchmarker:
    return StoppingBenchmarker(after) if device == 0 else FakeBenchmarker()


def must_not_run(job, events) -> None:
    raise AssertionError("no worker should have been started")


def fake_probe(device: int) -> Provenance:
    return FAKE_DEVICE


# ---- what is compared


def rows(path: Path) -> tuple[set, set]:
    """Kernels and measurements of a database, without the time they were recorded."""
    with BenchmarkDatabase(path, readonly=True) as db:
        kernels, measurements = db.dump()
    return ({tuple(k.values()) for k in kernels},
            {tuple(v for c, v in m.items() if c != "recorded_at") for m in measurements})


@pytest.fixture(scope="module")
def single_for(tmp_path_factory):
    """single_for(setting): what one writer records, ensure_tables with one fake benchmarker of
    the backends of the `backend` setting."""
    recorded: dict[str, tuple[set, set]] = {}

    def record(setting: str) -> tuple[set, set]:
        if setting not in recorded:
            path = tmp_path_factory.mktemp("single") / f"single-{setting}.db"
            with BenchmarkDatabase(path) as db:
                ensure_tables(PROBLEMS, sizes_for, None, db, FakeBenchmarker(backends=resolve(setting)))
            recorded[setting] = rows(path)
        return recorded[setting]

    return record


@pytest.fixture(scope="module")
def single(single_for) -> tuple[set, set]:
    """What one writer records with the legacy backend (the sweeps below default to it)."""
    return single_for("legacy")


def pool(path: Path, devices=(0, 1, 2), **kwargs) -> Provenance:
    kwargs = {"benchmarker_factory": fake_factory, "probe": fake_probe, "backend": "legacy", **kwargs}
    return bench_on_devices(PROBLEMS, sizes_for, None, path, list(devices), **kwargs)


def leftovers(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if ".shards-" in p.name)


# ---- tasks and their partition


tasks_strategy = st.lists(st.tuples(st.integers(0, len(PROBLEMS) - 1), st.integers(1, 256), st.sampled_from(BACKENDS)),
                          max_size=60).map(lambda triples: [Task(PROBLEMS[i], b, backend) for i, b, backend in triples])


@given(tasks_strategy, st.integers(1, 6))
def test_partition_is_disjoint_complete_balanced_and_deterministic(tasks, parts):
    shares = partition(tasks, parts)
    assert len(shares) == parts
    chosen = sorted(i for share in shares for i in map(id, share))
    assert chosen == sorted(map(id, tasks))  # every task in exactly one share
    for share in shares:  # each share keeps the order of the tasks
        positions = [next(i for i, t in enumerate(tasks) if t is task) for task in share]
        assert positions == sorted(positions)
    loads = [sum(t.cost for t in share) for share in shares]
    assert max(loads) - min(loads) <= max((t.cost for t in tasks), default=0)
    assert partition(pickle.loads(pickle.dumps(tasks)), parts) == shares  # what another rank computes


def test_partition_needs_a_worker():
    with pytest.raises(ConfigError, match="at least 1"):
        partition([], 0)


def test_plan_is_what_the_database_lacks(tmp_path):
    with BenchmarkDatabase(tmp_path / "plan.db") as db:
        tasks = split_tasks(PROBLEMS + PROBLEMS, sizes_for, None, db, FAKE_DEVICE, ("legacy",))
        assert len(tasks) == len(PROBLEMS) * BATCH  # duplicates once
        assert [t.batch for t in tasks[:BATCH]] == list(range(1, BATCH + 1))
        db.record(PROBLEMS[0], FAKE_DEVICE, FakeBenchmarker().measure(PROBLEMS[0], [1, 2, 3], None))
        again = split_tasks(PROBLEMS, sizes_for, None, db, FAKE_DEVICE, ("legacy",))
    assert len(again) == len(tasks) - 3 and Task(PROBLEMS[0], 2, "legacy") not in again


def task_keys(tasks) -> list[tuple[str, int, bool, str]]:
    return [(t.problem.shape_key(), t.batch, accumulates(t.problem, t.batch), t.backend) for t in tasks]


@pytest.mark.parametrize("setting", CHOICES)
@pytest.mark.parametrize("workers", range(1, 6))
def test_split_of_kernel_size_backend_tasks_is_disjoint_and_complete(tmp_path, setting, workers):
    smaller = [p.with_batch(8) for p in PROBLEMS]  # the same shapes: sizes 1-8 are wanted twice
    wanted = {(p.shape_key(), b, accumulates(p, b), backend) for p in PROBLEMS + smaller for b in sizes_for(p)
              for backend in resolve(setting)}  # BF at 8: a part of the larger batch's sum, and whole
    with BenchmarkDatabase(tmp_path / "empty.db") as db:
        tasks = split_tasks(PROBLEMS + smaller, sizes_for, None, db, FAKE_DEVICE, resolve(setting))
    assert sorted(task_keys(tasks)) == sorted(wanted)  # complete, each (shape, size, backend) once
    shares = partition(tasks, workers)
    dealt = [key for share in shares for key in task_keys(share)]
    assert sorted(dealt) == sorted(wanted)  # on exactly one worker
    assert shares == partition(pickle.loads(pickle.dumps(tasks)), workers)  # every rank deals alike


def test_engine_tasks_weigh_more():
    legacy, engines = Task(PROBLEMS[0], 4, "legacy"), Task(PROBLEMS[0], 4, "engines")
    assert engines.cost == parallel.ENGINE_TASK_WEIGHT * legacy.cost > legacy.cost


def test_a_database_with_one_backend_lacks_only_the_other(tmp_path):
    with BenchmarkDatabase(tmp_path / "legacy.db") as db:
        ensure_tables(PROBLEMS, sizes_for, None, db, FakeBenchmarker(backends=("legacy",)))
        assert split_tasks(PROBLEMS, sizes_for, None, db, FAKE_DEVICE, ("legacy",)) == []
        tasks = split_tasks(PROBLEMS, sizes_for, None, db, FAKE_DEVICE, BACKENDS)
    with BenchmarkDatabase(tmp_path / "empty.db") as db:
        empty = split_tasks(PROBLEMS, sizes_for, None, db, FAKE_DEVICE, ("engines",))
    assert {t.backend for t in tasks} == {"engines"}
    assert task_keys(tasks) == task_keys(empty)  # every engine task, and no legacy one


def test_calls_group_sizes_of_one_kernel_and_backend():
    share = ([Task(PROBLEMS[0], b, "legacy") for b in range(1, 11)] + [Task(PROBLEMS[0], 3, "engines")]
             + [Task(PROBLEMS[1], 4, "legacy")])
    assert [(p.key, backend, sizes) for p, backend, sizes in calls(share)] == [
        (PROBLEMS[0].key, "legacy", list(range(1, 9))), (PROBLEMS[0].key, "legacy", [9, 10]),
        (PROBLEMS[0].key, "engines", [3]), (PROBLEMS[1].key, "legacy", [4])]
    assert isinstance(calls(share)[0], MeasureCall)


# ---- worker processes on one node


def test_workers_record_what_one_writer_does(tmp_path, single):
    progress = []
    device = pool(tmp_path / "pool.db", progress=lambda done, total, p: progress.append((done, total)))
    assert device == FAKE_DEVICE
    assert rows(tmp_path / "pool.db") == single
    assert progress[0] == (0, len(PROBLEMS)) and progress[-1] == (len(PROBLEMS), len(PROBLEMS))
    assert not leftovers(tmp_path)
    pool(tmp_path / "pool.db", worker=must_not_run)  # a second run has nothing to measure


@pytest.mark.parametrize("setting", CHOICES)
@pytest.mark.slow
def test_workers_record_what_one_writer_does_per_backend(tmp_path, single_for, setting):
    pool(tmp_path / "pool.db", backend=setting)
    assert rows(tmp_path / "pool.db") == single_for(setting)
    assert not leftovers(tmp_path)


@pytest.mark.slow
def test_a_second_backend_is_added_to_a_database_of_the_first(tmp_path, single_for):
    pool(tmp_path / "pool.db", backend="legacy")
    assert rows(tmp_path / "pool.db") == single_for("legacy")
    pool(tmp_path / "pool.db", backend="all")
    assert rows(tmp_path / "pool.db") == single_for("all")


def test_the_backend_reaches_the_workers(tmp_path, single_for, monkeypatch):
    """Without a benchmarker factory, the workers' default one is made for the backend setting:
    a worker of the wrong backends would refuse its engine tasks."""
    monkeypatch.setattr(parallel.pool, "default_factory", fake_default_factory)
    pool(tmp_path / "pool.db", devices=[0, 1], benchmarker_factory=None, backend="engines")
    assert rows(tmp_path / "pool.db") == single_for("engines")
    pool(tmp_path / "one.db", devices=[0], benchmarker_factory=None, backend="engines", worker=must_not_run)
    assert rows(tmp_path / "one.db") == single_for("engines")


def test_one_gpu_is_measured_in_this_process(tmp_path, single):
    pool(tmp_path / "one.db", devices=[0], worker=must_not_run)
    assert rows(tmp_path / "one.db") == single


@pytest.mark.parametrize("how, reason", [("exit", "exited with status 3"), ("kill", "was killed by SIGKILL")])
@pytest.mark.slow
def test_a_dead_worker_is_reported_and_the_cache_keeps_the_rest(tmp_path, single, how, reason):
    factory = functools.partial(crashing_factory, crash_on=1, after=2, how=how, marker=str(tmp_path / "crashed"))
    with pytest.raises(MissingMeasurementsError, match=f"the worker on GPU 1 {reason}") as error:
        pool(tmp_path / "crash.db", devices=[0, 1], benchmarker_factory=factory, retries=0)
    assert (tmp_path / "crashed").exists() and "run the same command again" in str(error.value)
    with BenchmarkDatabase(tmp_path / "crash.db") as db:
        assert db.verify() == []
    kernels, measurements = rows(tmp_path / "crash.db")
    assert measurements < single[1] and kernels <= single[0] and not leftovers(tmp_path)
    with BenchmarkDatabase(tmp_path / "empty.db") as empty:
        shares = partition(split_tasks(PROBLEMS, sizes_for, None, empty, FAKE_DEVICE, ("legacy",)), 2)
    shape_key, batch = (list(schema.MEASUREMENT_COLUMNS).index(c) for c in ("shape_key", "batch"))
    kept = {(m[shape_key], m[batch]) for m in measurements}
    assert {(t.problem.shape_key(), t.batch) for t in shares[0]} <= kept  # GPU 0's whole share
    recorded = [(call.problem.shape_key(), b) for call in calls(shares[1])[:2] for b in call.sizes]
    assert set(recorded) <= kept  # and what GPU 1 recorded before it died
    pool(tmp_path / "crash.db", devices=[0, 1])  # the rerun measures only what is missing
    assert rows(tmp_path / "crash.db") == single


@pytest.mark.slow
def test_the_tasks_of_a_dead_worker_are_retried_on_the_others(tmp_path, single):
    factory = functools.partial(crashing_factory, crash_on=2, after=1, how="raise", marker=str(tmp_path / "crashed"))
    pool(tmp_path / "retried.db", benchmarker_factory=factory)
    assert (tmp_path / "crashed").exists()
    assert rows(tmp_path / "retried.db") == single


def test_a_worker_error_is_named(tmp_path):
    factory = functools.partial(crashing_factory, crash_on=0, after=0, how="raise", marker=str(tmp_path / "crashed"))
    with pytest.raises(MissingMeasurementsError, match="GPU 0 exited with status 1 .RuntimeError: simulated cuDNN"):
        pool(tmp_path / "error.db", devices=[0, 1], benchmarker_factory=factory, retries=0)


def test_gpus_of_different_models_are_refused(tmp_path):
    probe = lambda d: OTHER_GPU if d == 1 else FAKE_DEVICE  # noqa: E731
    with pytest.raises(ConfigError, match=r"GPU 0: Fake GPU .*GPU 1: Other GPU .*List GPUs of one model"):
        pool(tmp_path / "mixed.db", devices=[0, 1], probe=probe, worker=must_not_run)
    with pytest.raises(ConfigError, match=r"GPU\(s\) 1 listed more than once"):
        pool(tmp_path / "twice.db", devices=[0, 1, 1], worker=must_not_run)


def test_a_sweep_stopped_by_sigterm_keeps_what_its_workers_measured(tmp_path, single):
    """`timeout` or a scheduler's time limit sends SIGTERM: the CLI raises it as Stopped where the
    sweep is, which stops the workers and merges their shards before the command exits."""
    from ucudnn.cli import Stopped, _stopped_by_sigterm

    factory = functools.partial(stopping_factory, after=3)
    with pytest.raises(Stopped), _stopped_by_sigterm():
        pool(tmp_path / "stopped.db", devices=[0, 1], benchmarker_factory=factory)
    kernels, measurements = rows(tmp_path / "stopped.db")
    assert 0 < len(measurements) < len(single[1]) and not leftovers(tmp_path)
    pool(tmp_path / "stopped.db", devices=[0, 1])  # the same command goes on from there
    assert rows(tmp_path / "stopped.db") == single


def test_shards_a_killed_run_left_are_merged_by_the_next_run_on_its_host(tmp_path, single):
    from ucudnn.measure.parallel.pool import _host

    pool(tmp_path / "whole.db")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    live, other_host = f"target.db.shards-{_host()}-{os.getpid()}-abcd", f"target.db.shards-{_host()}-{dead}-{dead}-ab"
    for name in (f"target.db.shards-{_host()}-{dead}-abcd", live, other_host):  # a killed run's, a live one's,
        folder = tmp_path / name  # and host "<this host>-<dead>"'s, whose process this host cannot see
        folder.mkdir()
        shutil.copy(tmp_path / "whole.db", folder / f"{_host()}-0.db")
    pool(tmp_path / "target.db", worker=must_not_run)  # nothing left to measure once merged
    assert rows(tmp_path / "target.db") == single
    assert sorted(p.name for p in leftovers(tmp_path)) == sorted([live, other_host])


def test_merging_shards_removes_what_a_worker_killed_while_making_its_shard_left(tmp_path):
    from ucudnn.measure.cache.database import create
    from ucudnn.measure.parallel.pool import merge_shards

    folder = tmp_path / "x.db.shards-1"
    create(folder / "vm-0.db")
    (folder / ".vm-1.db.0123abcd.new").write_bytes(b"")  # killed between its write and its link
    merge_shards(folder, tmp_path / "x.db")
    assert list(folder.iterdir()) == []


def test_a_worker_on_another_model_than_probed_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="worker on GPU 1 measures on Other GPU"):
        pool(tmp_path / "lied.db", devices=[0, 1], benchmarker_factory=other_gpu_factory)
    assert not leftovers(tmp_path)


# ---- MPI, with ranks as threads


class ThreadComm:
    """The little of an mpi4py communicator that bench_with_mpi uses; objects are pickled in
    transit, as MPI does."""

    def __init__(self, rank: int, shared: dict):
        self.rank, self.shared = rank, shared

    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return len(self.shared["slots"])

    def allgather(self, obj):
        slots, barrier = self.shared["slots"], self.shared["barrier"]
        slots[self.rank] = pickle.dumps(obj)
        barrier.wait()
        gathered = [pickle.loads(s) for s in slots]
        barrier.wait()
        return gathered

    def bcast(self, obj, root: int = 0):
        return self.allgather(obj)[root]


def mpi(path: Path, size: int = 2, factory=lambda rank: fake_factory, **kwargs) -> list:
    """bench_with_mpi on `size` thread ranks (factory=None: each rank's default factory); each
    rank's result or exception."""
    shared = {"slots": [None] * size, "barrier": threading.Barrier(size, timeout=60)}
    results: list = [None] * size
    kwargs = {"backend": "legacy", **kwargs}

    def rank(r: int) -> None:
        try:
            results[r] = bench_with_mpi(PROBLEMS, sizes_for, None, path, comm=ThreadComm(r, shared),
                                        benchmarker_factory=factory and factory(r), device_count=lambda: size,
                                        **kwargs)
        except Exception as exc:
            results[r] = exc

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


@pytest.mark.parametrize("shared", [False, True])
def test_mpi_ranks_record_what_one_writer_does(tmp_path, single, shared):
    assert mpi(tmp_path / "mpi.db", shared=shared) == [FAKE_DEVICE, None]
    assert rows(tmp_path / "mpi.db") == single and not leftovers(tmp_path)


@pytest.mark.parametrize("shared", [False, True])
def test_mpi_ranks_record_what_one_writer_does_for_both_backends(tmp_path, single_for, shared):
    assert mpi(tmp_path / "mpi.db", size=3, shared=shared, backend="all") == [FAKE_DEVICE, None, None]
    assert rows(tmp_path / "mpi.db") == single_for("all") and not leftovers(tmp_path)


def test_the_backend_reaches_the_mpi_ranks(tmp_path, single_for, monkeypatch):
    monkeypatch.setattr(parallel.mpi, "default_factory", fake_default_factory)
    assert mpi(tmp_path / "mpi.db", factory=None, backend="engines") == [FAKE_DEVICE, None]
    assert rows(tmp_path / "mpi.db") == single_for("engines")


def test_mpi_rank_failure_is_retried_by_the_others(tmp_path, single):
    marker = str(tmp_path / "crashed")
    factory = lambda rank: functools.partial(crashing_factory, crash_on=1, after=1, how="raise", marker=marker)  # noqa
    assert mpi(tmp_path / "mpi.db", size=3, factory=factory) == [FAKE_DEVICE, None, None]
    assert Path(marker).exists() and rows(tmp_path / "mpi.db") == single


def test_mpi_refuses_mixed_models_and_too_many_ranks(tmp_path):
    results = mpi(tmp_path / "mixed.db", factory=lambda rank: other_gpu_factory)
    assert all(isinstance(r, ConfigError) and "rank 1 (host" in str(r) for r in results)
    results = mpi(tmp_path / "crowded.db", devices=[0])
    assert all(isinstance(r, ConfigError) and "runs 2 ranks but has 1 GPU(s)" in str(r) for r in results)


def test_mpi_world_of_one_under_a_launcher_of_two_is_refused():
    with pytest.raises(ConfigError, match="mpi4py uses another MPI library"):
        parallel.check_world(1, {"OMPI_COMM_WORLD_SIZE": "2"})
    parallel.check_world(2, {"OMPI_COMM_WORLD_SIZE": "2"})


def test_mpi_needs_mpi4py():
    try:
        import mpi4py  # noqa: F401
        pytest.skip("mpi4py is installed")
    except ImportError:
        with pytest.raises(ConfigError, match=re.escape(install_extra("mpi"))):
            parallel.mpi_world()


# ---- the command line


def test_bench_devices_come_from_the_flag_then_the_variable(monkeypatch):
    parse = lambda *a: build_parser().parse_args(["bench", "--net", "alexnet", *a])  # noqa: E731
    devices = lambda args: bench_devices(args.devices, args.mpi)  # noqa: E731  (as `ucudnn bench` asks)
    monkeypatch.delenv("UCUDNN_BENCH_DEVICES", raising=False)
    assert devices(parse()) == [0] and devices(parse("--mpi")) is None
    monkeypatch.setenv("UCUDNN_BENCH_DEVICES", "0,1")
    assert devices(parse()) == [0, 1] and devices(parse("--devices", "1")) == [1]
    args = parse("--mpi", "--timing", "quick")
    assert (args.mpi, args.timing) == ("shards", "quick") and parse("--mpi", "shared").mpi == "shared"
    monkeypatch.setenv("UCUDNN_BENCH_DEVICES", "zero")
    with pytest.raises(ConfigError, match="UCUDNN_BENCH_DEVICES: 'zero' is not a list of GPU numbers"):
        devices(parse())


@pytest.mark.parametrize("flag, variable, expected", [(["--backend", "engines"], None, "engines"),
                                                      ([], "legacy", "legacy"), ([], None, "")])
@pytest.mark.parametrize("mpi_flag", [[], ["--mpi"]])
def test_bench_passes_the_backend_to_the_parallel_sweep(monkeypatch, flag, variable, expected, mpi_flag):
    asked = {}
    record = lambda name: lambda *args, **kwargs: asked.update({name: kwargs["backend"]})  # noqa: E731
    monkeypatch.setattr(commands, "bench_on_devices", record("pool"))
    monkeypatch.setattr(commands, "bench_with_mpi", record("mpi"))
    monkeypatch.delenv("UCUDNN_BACKEND", raising=False)
    if variable:
        monkeypatch.setenv("UCUDNN_BACKEND", variable)
    args = build_parser().parse_args(["bench", "--net", "alexnet", "--batch", "4", *flag, *mpi_flag])
    _, kernels = commands.kernels_of(args)
    commands._bench_on_devices(kernels, commands._settings(args), [0, 1], None, args)
    assert asked == {"mpi" if mpi_flag else "pool": expected}
