"""Across nodes: the ranks of an MPI job, each measuring its share on its own GPU into a shard
(or the shared database), with rank 0 planning and merging."""
from __future__ import annotations

import os
import pickle
import socket
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from ...core.device import Provenance
from ...core.errors import ConfigError, GpuUnavailableError, UcudnnError, install_extra
from ...core.problem import ConvProblem
from ...execute.backends import resolve as resolve_backends
from ..benchmark import Benchmarker, TimingSettings
from ..cache.database import BenchmarkDatabase
from ..cache.memo import resolve_path
from ..cache.paths import shard_path
from .devices import Factory, backend_setting, check_one_model, cuda_device_count, default_factory
from .pool import merge_shards, new_shard_dir, remove_if_empty
from .tasks import RETRIES, KernelProgress, Progress, SizesFor, Task, measure_share, partition, split_tasks, sweep

# Variables by which launchers tell a process how many were started (to catch a mismatched mpi4py).
LAUNCHER_SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MV2_COMM_WORLD_SIZE")


# ---- across nodes: the ranks of an MPI job


def mpi_world():
    """mpi4py's COMM_WORLD (mpi4py is imported only here: it is the optional extra `mpi`)."""
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError) as exc:  # RuntimeError: mpi4py found no MPI library to load
        raise ConfigError(f"--mpi needs mpi4py and an MPI library ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0]}): {install_extra('mpi')} and an MPI (Open MPI, MPICH; "
                          "or pip install mpich), then start e.g. mpirun -np 2 python -m mpi4py -m ucudnn bench "
                          "--mpi ...") from None
    return MPI.COMM_WORLD


def check_world(size: int, environ=os.environ) -> None:
    """Catch an mpi4py built for another MPI than the launcher's: each process would be alone
    in a world of 1 and measure everything on the same GPU."""
    if size > 1:
        return
    for name in LAUNCHER_SIZE_VARIABLES:
        started = environ.get(name, "")
        if started.isdigit() and int(started) > 1:
            raise ConfigError(f"the launcher started {started} processes ({name}={started}) but mpi4py sees a "
                              "world of 1: mpi4py uses another MPI library than this mpirun. Start with the "
                              "mpiexec of the library that `python -m mpi4py --mpi-lib-version` names")


def on_root(comm, action: Callable[[], object]):
    """action() on rank 0, its result (or error) broadcast, so every rank returns (or raises) alike."""
    outcome: tuple[object, Exception | None] = (None, None)
    error = None
    if comm.Get_rank() == 0:
        try:
            outcome = (action(), None)
        except Exception as exc:  # re-raised below, on every rank
            error = exc
            outcome = (None, _portable(exc))
    value, failure = comm.bcast(outcome, root=0)
    if error is not None:
        raise error
    if failure is not None:
        raise failure
    return value


def _portable(exc: Exception) -> Exception:
    """`exc` if it survives pickling (to go to the other ranks), else a UcudnnError saying it."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # e.g. an error class whose __init__ takes other arguments than its message
        return UcudnnError(f"rank 0: {type(exc).__name__}: {exc}")


def check_ranks_fit(hosts: Sequence[str], gpus: Sequence[Sequence[int]]) -> None:
    """Each rank needs its own GPU on its host: the k-th rank of a host takes its k-th listed GPU."""
    for rank, host in enumerate(hosts):
        local, listed = hosts[:rank].count(host), list(gpus[rank])
        if local >= len(listed):
            raise ConfigError(f"host {host} runs {hosts.count(host)} ranks but has {len(listed)} GPU(s) to measure "
                              f"on ({', '.join(map(str, listed)) or 'none'}): start at most {len(listed)} rank(s) per "
                              "node (e.g. mpirun --npernode N) or list more GPUs with --devices")


def _attempt(action: Callable[[], Benchmarker]) -> tuple[Benchmarker | None, str | None]:
    try:
        return action(), None
    except Exception as exc:  # reported through the ranks' allgather, never left to hang the others
        return None, f"could not start measuring ({type(exc).__name__}: {exc})"


def bench_with_mpi(problems: Iterable[ConvProblem], sizes_for: SizesFor, cap: int | None, path,
                   devices: Sequence[int] | None = None, *, comm=None, shared: bool = False,
                   progress: Progress | None = None, timing: str | TimingSettings = "default",
                   execution: str = "graph", backend: str = "", benchmarker_factory: Factory | None = None,
                   device_count: Callable[[], int] | None = None, retries: int = RETRIES) -> Provenance | None:
    """`bench_on_devices` for the ranks of an MPI job (call it on every rank): the k-th rank of
    each host measures on the k-th GPU of `devices` (default: every GPU of the host), rank r
    takes share r of the same partition and writes its own shard, merged into `path` by rank 0
    after all are done, or with `shared` writes the database at `path` itself. Rank 0 resolves
    the `backend` setting for all. Returns the GPU measured on at rank 0 and None at the
    others. `comm` defaults to mpi4py's COMM_WORLD."""
    comm = comm if comm is not None else mpi_world()
    problems, rank = list(problems), comm.Get_rank()
    check_world(comm.Get_size())
    backends = on_root(comm, lambda: resolve_backends(backend))  # the frontend may be installed on some nodes only
    hosts = comm.allgather(socket.gethostname())
    gpus = comm.allgather(list(devices) if devices else list(range((device_count or cuda_device_count)())))
    check_ranks_fit(hosts, gpus)
    local = [hosts[:r].count(h) for r, h in enumerate(hosts)]
    labels = [f"rank {r} (host {h}, GPU {gpus[r][local[r]]})" for r, h in enumerate(hosts)]
    factory = benchmarker_factory or default_factory(timing, execution, backend_setting(backends))
    benchmarker, error = _attempt(lambda: factory(gpus[rank][local[rank]]))
    infos, errors = zip(*comm.allgather((benchmarker.device if benchmarker else None, error)))
    alive = [r for r, info in enumerate(infos) if info is not None]
    if not alive:
        raise GpuUnavailableError("no rank could measure: " + "; ".join(f"{labels[r]} {e}" for r, e in enumerate(errors)))
    check_one_model([(labels[r], infos[r]) for r in alive])
    device, target = infos[alive[0]], resolve_path(path)
    folder = None if shared else Path(on_root(comm, lambda: str(new_shard_dir(target))))

    def replan() -> list[Task]:
        def split() -> list[Task]:
            with BenchmarkDatabase(target) as database:
                return split_tasks(problems, sizes_for, cap, database, device, backends)
        return on_root(comm, split)

    def run_round(tasks: list[Task], alive: list[int]) -> dict[int, str]:
        mine = partition(tasks, len(alive))[alive.index(rank)] if rank in alive else []
        tracker = KernelProgress(mine, progress if rank == 0 else None)
        failure = None
        try:
            if mine:
                assert benchmarker is not None  # a rank with tasks is alive: it has one
                where = target if folder is None else shard_path(folder, hosts[rank], pid=rank)
                with BenchmarkDatabase(where) as database:
                    measure_share(mine, benchmarker, database, cap, lambda p, n: tracker.advance(p.key, n))
                tracker.finish()
        except Exception as exc:  # this rank's tasks are retried by the others
            failure = f"failed ({type(exc).__name__}: {exc})"
        failed = {r: why for r, why in enumerate(comm.allgather(failure)) if why}
        if folder is not None:
            on_root(comm, lambda: merge_shards(folder, target))
        return failed

    failed_to_start = {r: e for r, e in enumerate(errors) if e}
    try:
        sweep(replan(), alive, lambda t, a: {**failed_to_start, **run_round(t, a)}, replan,
              lambda r: labels[r], target, retries)
    finally:
        if folder is not None and rank == 0:
            remove_if_empty(folder)
    return device if rank == 0 else None
