"""Parallel benchmarking (paper, section III-D): the sweep of (kernel, micro-batch size) tasks
spread over the GPUs of a node, one worker process per GPU, or over the ranks of an MPI job,
and recorded in one database as a single-GPU run would record it. See docs/parallel.md.

A task is one kernel at one micro-batch size: measuring it times every algorithm at that size.
Tasks are what the database lacks (so a second run measures nothing), split by `partition`,
which is deterministic: every MPI rank computes the same shares. Workers write their own shard
files, merged into the target when they are done; a worker that dies loses nothing it recorded,
and what it had left is measured again once by the workers that survived, or reported missing.

`python -m ucudnn.parallel ARGS` is `ucudnn bench ARGS`.
"""
from __future__ import annotations

import functools
import heapq
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import socket
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Hashable, Iterable, Sequence, TypeVar

from .benchmark import Benchmarker, TimingSettings, ensure_tables
from .cache.database import BenchmarkDatabase, merge
from .cache.memo import Cache, resolve_path
from .cache.paths import shard_path
from .device import DeviceInfo
from .errors import ConfigError, GpuUnavailableError, MissingMeasurementsError, UcudnnError
from .problem import ConvProblem

W = TypeVar("W", bound=Hashable)
SizesFor = Callable[[ConvProblem], Sequence[int]]
Progress = Callable[[int, int, ConvProblem], None]
Factory = Callable[[int], Benchmarker]

DEVICES_VARIABLE = "UCUDNN_BENCH_DEVICES"
TIMINGS = {
    "default": TimingSettings(),
    # one warm-up, then 1 to 3 timed calls: sweeps of the `all` policy in minutes, noisier times
    "quick": TimingSettings(warmup=1, min_repeats=1, max_repeats=3, target_ms=3.0),
}
SIZES_PER_CALL = 8  # sizes of one kernel measured (and recorded, in one transaction) together
TASK_OVERHEAD_FLOPS = 10**11  # the fixed cost of a task (descriptors, queries, launches) in flops
EXIT_GRACE_S = 60  # how long a worker that closed its pipe may take to exit before it is terminated
RETRIES = 1  # rounds that re-measure what failed workers left, on the workers that survived
# Variables by which launchers tell a process how many were started (to catch a mismatched mpi4py).
LAUNCHER_SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MV2_COMM_WORLD_SIZE")


# ---- tasks and their partition


@dataclass(frozen=True)
class Task:
    """One kernel at one micro-batch size: every algorithm is measured at that size."""

    problem: ConvProblem
    batch: int

    @property
    def cost(self) -> int:
        """Relative cost estimate: the flops of the micro-batch plus a fixed overhead."""
        return _sample_flops(self.problem) * self.batch + TASK_OVERHEAD_FLOPS


@functools.lru_cache(maxsize=4096)
def _sample_flops(problem: ConvProblem) -> int:
    return problem.with_batch(1).flops()  # flops are linear in the batch


def plan_tasks(problems: Iterable[ConvProblem], sizes_for: SizesFor, cap: int | None, database,
               device: DeviceInfo) -> list[Task]:
    """The tasks a single-GPU `ensure_tables` would measure: for each kernel (in order of first
    appearance) the sizes `sizes_for` asks for whose measurements `database` (a Cache or
    BenchmarkDatabase) lacks on `device`'s GPU model within `cap`, each (shape, size) once."""
    problems = list({p.key: p for p in problems}.values())
    tables = database.tables(problems, device)
    tasks: dict[tuple[str, int], Task] = {}
    for p in problems:
        for b in tables[p.shape_key()].missing(sizes_for(p), cap):
            tasks.setdefault((p.shape_key(), b), Task(p, b))
    return list(tasks.values())


def partition(tasks: Sequence[Task], parts: int) -> list[list[Task]]:
    """`tasks` in `parts` disjoint shares that cover them all, balanced by estimated cost (the
    costliest task first to the least loaded share, ties to the lower index) and each in the
    order of `tasks`. Deterministic, so processes that compute it agree without talking."""
    if parts < 1:
        raise ConfigError(f"cannot split benchmarking among {parts} workers; need at least 1")
    costs = [task.cost for task in tasks]
    loads = [(0, share) for share in range(parts)]
    chosen: list[list[int]] = [[] for _ in range(parts)]
    for index in sorted(range(len(tasks)), key=lambda i: (-costs[i], i)):
        load, share = heapq.heappop(loads)
        chosen[share].append(index)
        heapq.heappush(loads, (load + costs[index], share))
    return [[tasks[i] for i in sorted(indices)] for indices in chosen]


def calls(share: Sequence[Task]) -> list[tuple[ConvProblem, list[int]]]:
    """Consecutive tasks of one kernel grouped into measure() calls of at most SIZES_PER_CALL sizes."""
    grouped: list[tuple[ConvProblem, list[int]]] = []
    for task in share:
        if grouped and grouped[-1][0].key == task.problem.key and len(grouped[-1][1]) < SIZES_PER_CALL:
            grouped[-1][1].append(task.batch)
        else:
            grouped.append((task.problem, [task.batch]))
    return grouped


def measure_share(share: Sequence[Task], benchmarker: Benchmarker, database, cap: int | None,
                  done: Callable[[ConvProblem, int], None] | None = None) -> None:
    """Measure `share` and record it call by call (one short transaction each), so a process
    that dies keeps everything recorded before; done(problem, sizes) after each call."""
    for problem, sizes in calls(share):
        database.record(problem, benchmarker.device, benchmarker.measure(problem, sizes, cap))
        if done:
            done(problem, len(sizes))


class KernelProgress:
    """Adapts task completions to the `progress(done, total, problem)` of `ensure_tables`,
    counted in kernels: a kernel is done when all its tasks are."""

    def __init__(self, tasks: Sequence[Task], progress: Progress | None):
        self.left = Counter(t.problem.key for t in tasks)
        self.problems = {t.problem.key: t.problem for t in tasks}
        self.total, self.done, self.progress = len(self.left), 0, progress
        if progress and tasks:
            progress(0, self.total, tasks[0].problem)

    def advance(self, key: str, sizes: int) -> None:
        self.left[key] -= sizes
        if self.left[key] == 0:
            self.done += 1
            if self.progress and self.done < self.total:
                self.progress(self.done, self.total, self.problems[key])

    def finish(self) -> None:
        if self.progress and self.total:
            self.progress(self.total, self.total, next(reversed(self.problems.values())))


# ---- devices


def timing_settings(timing: str | TimingSettings) -> TimingSettings:
    if isinstance(timing, TimingSettings):
        return timing
    if timing not in TIMINGS:
        raise ConfigError(f"timing {timing!r} is unknown; use one of {', '.join(TIMINGS)}")
    return TIMINGS[timing]


def cuda_benchmarker(device: int, timing: TimingSettings = TIMINGS["default"]) -> Benchmarker:
    """A CudnnBenchmarker on GPU `device` (made current first), the workers' default."""
    from . import gpu
    from .benchmark import CudnnBenchmarker

    gpu.cupy().cuda.Device(device).use()
    return CudnnBenchmarker(timing=timing)


def default_factory(timing: str | TimingSettings) -> Factory:
    """cuda_benchmarker with these timing settings, picklable for the workers."""
    return functools.partial(cuda_benchmarker, timing=timing_settings(timing))


def cuda_device_count() -> int:
    from . import gpu

    return gpu.cupy().cuda.runtime.getDeviceCount()


def cuda_probe(device: int) -> DeviceInfo:
    """What GPU `device` is, without making a context on it."""
    from . import gpu

    count = cuda_device_count()
    if not 0 <= device < count:
        raise ConfigError(f"GPU {device} does not exist: this node has {count} visible GPU(s), "
                          f"0 to {count - 1}; fix --devices or {DEVICES_VARIABLE}")
    return gpu.device_info(device)


def check_devices(devices: Sequence[int]) -> list[int]:
    devices = list(devices)
    if not devices:
        raise ConfigError(f"no GPUs to benchmark on; list some, e.g. --devices 0,1 or {DEVICES_VARIABLE}=0,1")
    twice = sorted(d for d, n in Counter(devices).items() if n > 1)
    if twice:
        raise ConfigError(f"GPU(s) {', '.join(map(str, twice))} listed more than once in {devices}; "
                          "list each GPU once (two workers on one GPU would distort each other's times)")
    return devices


def check_one_model(labelled: Sequence[tuple[str, DeviceInfo]]) -> None:
    """Refuse GPUs of different models (or cuDNN versions): measurements are kept per model."""
    if len({info.reuse_key for _, info in labelled}) > 1:
        listing = "; ".join(f"{label}: {info.describe()}" for label, info in labelled)
        raise ConfigError(f"one benchmarking run needs GPUs of one model and cuDNN version, since "
                          f"measurements are kept per model, but it has {listing}. List GPUs of one "
                          f"model only (--devices or {DEVICES_VARIABLE}) and run once per model")


# ---- shards and rounds


def new_shard_dir(target: Path) -> Path:
    """A fresh folder next to the target for the shards of one run."""
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{target.name}.shards-", dir=target.parent))


def merge_shards(folder: Path, target: Path) -> int:
    """Merge every shard in `folder` into `target` and delete them (a shard that a killed
    process left mid-transaction is rolled back when opened); returns measurements merged."""
    shards = sorted(folder.glob("*.db"))
    count = merge(shards, target) if shards else 0
    for shard in shards:
        for leftover in (shard, shard.with_name(shard.name + "-journal")):
            leftover.unlink(missing_ok=True)
    return count


def remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:  # shards left by an interrupted merge: docs/parallel.md says how to merge them
        print(f"ucudnn: shards left in {folder}; merge them with `ucudnn cache merge {folder}/*.db "
              f"--into TARGET`", file=sys.stderr)


def sweep(tasks: list[Task], workers: Sequence[W], run_round: Callable[[list[Task], list[W]], dict[W, str]],
          replan: Callable[[], list[Task]], label: Callable[[W], str], target: Path,
          retries: int = RETRIES) -> None:
    """Measure `tasks` on `workers`; after a round in which workers failed, measure what is
    still missing on those that did not, up to `retries` times. run_round(tasks, workers)
    returns {worker: why it failed}; replan() what the target still lacks."""
    alive, failures, rounds = list(workers), {}, 0
    while tasks and rounds <= retries:
        rounds += 1
        failed = run_round(tasks, alive)
        failures.update(failed)
        tasks = replan()
        alive = [w for w in alive if w not in failed]
        if not alive:
            break
    if not tasks:
        return
    raise MissingMeasurementsError(missing_message(tasks, {label(w): why for w, why in failures.items()},
                                                   rounds, target))


def missing_message(tasks: Sequence[Task], failures: dict[str, str], rounds: int, target: Path) -> str:
    kernels = len({t.problem.key for t in tasks})
    why = "; ".join(f"{who} {reason}" for who, reason in failures.items()) or "no worker reported a failure"
    example = tasks[0]
    return (f"{len(tasks)} measurement task(s) of {kernels} kernel(s) are missing after {rounds} round(s) "
            f"of measuring, e.g. {example.problem.describe()} at micro-batch {example.batch}: {why}. "
            f"Everything measured is kept in {target}: run the same command again to measure only what "
            "is missing (with fewer GPUs if one keeps failing)")


# ---- within a node: one worker process per GPU


@dataclass(frozen=True)
class WorkerJob:
    """What one worker process is given: its GPU, its share of the tasks and its shard file."""

    device: int
    share: tuple[Task, ...]
    shard: str
    cap: int | None
    factory: Factory


def run_worker(job: WorkerJob, events) -> None:
    """The body of a worker process: make the benchmarker on the job's GPU (before anything
    touches CUDA), say which GPU it is, then measure the share into the shard, reporting each
    call through `events` (its own pipe). Errors are reported, then raised (exit status 1)."""
    try:
        benchmarker = job.factory(job.device)
        events.send(("device", job.device, benchmarker.device))
        with BenchmarkDatabase(job.shard) as shard:
            measure_share(job.share, benchmarker, shard, job.cap,
                          lambda problem, sizes: events.send(("done", job.device, problem.key, sizes)))
    except BaseException as exc:
        events.send(("error", job.device, f"{type(exc).__name__}: {exc}"))
        raise


def exit_reason(exitcode: int | None, error: str | None) -> str:
    """Why a worker process ended badly, in words."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (the out-of-memory killer sends SIGKILL)" if -exitcode == signal.SIGKILL else ""
        return f"was killed by {name}{hint}"
    return f"exited with status {exitcode}" + (f" ({error})" if error else "")


class PoolRound:
    """One round of worker processes (spawned: CUDA does not survive fork), one per GPU with a
    share, and what they send: device identity, progress and errors. Each worker has a pipe of
    its own, never a shared queue, whose lock a killed worker could take to its grave."""

    def __init__(self, expected: DeviceInfo, tracker: KernelProgress, worker: Callable = run_worker):
        self.expected, self.tracker, self.worker = expected, tracker, worker
        self.devices: dict[int, DeviceInfo] = {}  # what each worker measured on
        self.errors: dict[int, str] = {}

    def run(self, jobs: Sequence[WorkerJob]) -> dict[int, str]:
        """Run the jobs to the end; {GPU: why} for each worker that failed."""
        context = multiprocessing.get_context("spawn")
        processes, readers = {}, {}
        try:
            for job in jobs:
                reader, writer = context.Pipe(duplex=False)
                processes[job.device] = context.Process(target=self.worker, args=(job, writer), daemon=True,
                                                        name=f"ucudnn-bench-gpu{job.device}")
                processes[job.device].start()
                writer.close()  # the worker's copy stays open: its end (or death) is our end of file
                readers[reader] = job.device
            while readers:
                for reader in multiprocessing.connection.wait(list(readers)):
                    self._receive(reader, readers)
            for process in processes.values():  # pipes close before the interpreter has exited
                process.join(EXIT_GRACE_S)
        finally:
            for process in processes.values():
                if process.is_alive():
                    process.terminate()
                process.join()
            for reader in readers:
                reader.close()
        return {d: exit_reason(p.exitcode, self.errors.get(d)) for d, p in processes.items() if p.exitcode != 0}

    def _receive(self, reader, readers: dict) -> None:
        try:
            kind, device, *rest = reader.recv()
        except Exception:  # end of file: the worker ended, or died, maybe in the middle of a message
            del readers[reader]
            reader.close()
            return
        if kind == "device":
            self._check(device, rest[0])
        elif kind == "done":
            self.tracker.advance(*rest)
        else:
            self.errors[device] = rest[0]

    def _check(self, device: int, info: DeviceInfo) -> None:
        if info.reuse_key != self.expected.reuse_key:
            raise ConfigError(f"the worker on GPU {device} measures on {info.describe()}, but the GPUs were "
                              f"probed as {self.expected.describe()}; list GPUs of one model only "
                              f"(--devices or {DEVICES_VARIABLE})")
        self.devices[device] = info


def bench_on_devices(problems: Iterable[ConvProblem], sizes_for: SizesFor, cap: int | None, path,
                     devices: Sequence[int], *, progress: Progress | None = None,
                     timing: str | TimingSettings = "default", benchmarker_factory: Factory | None = None,
                     probe: Callable[[int], DeviceInfo] | None = None, worker: Callable | None = None,
                     retries: int = RETRIES) -> DeviceInfo:
    """Measure what the database at `path` lacks of `problems` (the sizes `sizes_for` gives,
    within `cap` bytes of workspace) on the GPUs `devices` of this node, one worker process
    each, and merge the results into it; returns the GPU measured on. One GPU is measured in
    this process, exactly as `ucudnn bench` on one GPU. GPUs of different models are refused.

    `benchmarker_factory(gpu)` (picklable: it runs in the workers), `probe(gpu)` and
    `worker(job, events)` replace the GPU parts in tests. Raises MissingMeasurementsError if
    measurements are still missing after `retries` rounds on the workers that survived."""
    problems, devices = list(problems), check_devices(devices)
    factory = benchmarker_factory or default_factory(timing)
    infos = [(probe or cuda_probe)(d) for d in devices]
    check_one_model([(f"GPU {d}", info) for d, info in zip(devices, infos)])
    target = resolve_path(path)
    if len(devices) == 1:
        return _bench_in_process(problems, sizes_for, cap, target, factory(devices[0]), progress)
    with BenchmarkDatabase(target) as database:
        tasks = plan_tasks(problems, sizes_for, cap, database, infos[0])
    if not tasks:
        return infos[0]
    folder = new_shard_dir(target)
    pool = PoolRound(infos[0], KernelProgress(tasks, progress), worker or run_worker)

    def run_round(tasks: list[Task], alive: list[int]) -> dict[int, str]:
        jobs = [WorkerJob(d, tuple(share), str(shard_path(folder, pid=d)), cap, factory)
                for d, share in zip(alive, partition(tasks, len(alive))) if share]
        try:
            return pool.run(jobs)
        finally:
            merge_shards(folder, target)

    def replan() -> list[Task]:
        with BenchmarkDatabase(target) as database:
            return plan_tasks(problems, sizes_for, cap, database, infos[0])

    try:
        sweep(tasks, devices, run_round, replan, lambda d: f"the worker on GPU {d}", target, retries)
    finally:
        remove_if_empty(folder)
    pool.tracker.finish()
    return next(iter(pool.devices.values()), infos[0])


def _bench_in_process(problems, sizes_for: SizesFor, cap: int | None, target: Path, benchmarker: Benchmarker,
                      progress: Progress | None) -> DeviceInfo:
    cache = Cache(target)
    try:
        ensure_tables(problems, sizes_for, cap, cache, benchmarker, progress)
    finally:
        cache.close()
    return benchmarker.device


# ---- across nodes: the ranks of an MPI job


def mpi_world():
    """mpi4py's COMM_WORLD (mpi4py is imported only here: it is the optional extra `mpi`)."""
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError) as exc:  # RuntimeError: mpi4py found no MPI library to load
        raise ConfigError(f"--mpi needs mpi4py and an MPI library ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0]}): pip install 'ucudnn[mpi]' and an MPI (Open MPI, MPICH; "
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
    outcome, error = (None, None), None
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
                   benchmarker_factory: Factory | None = None, device_count: Callable[[], int] | None = None,
                   retries: int = RETRIES) -> DeviceInfo | None:
    """`bench_on_devices` for the ranks of an MPI job (call it on every rank): the k-th rank of
    each host measures on the k-th GPU of `devices` (default: every GPU of the host), rank r
    takes share r of the same partition and writes its own shard, merged into `path` by rank 0
    after all are done, or with `shared` writes the database at `path` itself. Returns the GPU
    measured on at rank 0 and None at the others. `comm` defaults to mpi4py's COMM_WORLD."""
    comm = comm if comm is not None else mpi_world()
    problems, rank = list(problems), comm.Get_rank()
    check_world(comm.Get_size())
    hosts = comm.allgather(socket.gethostname())
    gpus = comm.allgather(list(devices) if devices else list(range((device_count or cuda_device_count)())))
    check_ranks_fit(hosts, gpus)
    local = [hosts[:r].count(h) for r, h in enumerate(hosts)]
    labels = [f"rank {r} (host {h}, GPU {gpus[r][local[r]]})" for r, h in enumerate(hosts)]
    factory = benchmarker_factory or default_factory(timing)
    benchmarker, error = _attempt(lambda: factory(gpus[rank][local[rank]]))
    infos, errors = zip(*comm.allgather((benchmarker.device if benchmarker else None, error)))
    alive = [r for r, info in enumerate(infos) if info is not None]
    if not alive:
        raise GpuUnavailableError("no rank could measure: " + "; ".join(f"{labels[r]} {e}" for r, e in enumerate(errors)))
    check_one_model([(labels[r], infos[r]) for r in alive])
    device, target = infos[alive[0]], resolve_path(path)
    folder = None if shared else Path(on_root(comm, lambda: str(new_shard_dir(target))))

    def replan() -> list[Task]:
        def plan() -> list[Task]:
            with BenchmarkDatabase(target) as database:
                return plan_tasks(problems, sizes_for, cap, database, device)
        return on_root(comm, plan)

    def run_round(tasks: list[Task], alive: list[int]) -> dict[int, str]:
        mine = partition(tasks, len(alive))[alive.index(rank)] if rank in alive else []
        tracker = KernelProgress(mine, progress if rank == 0 else None)
        failure = None
        try:
            if mine:
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


if __name__ == "__main__":
    from .cli import main

    sys.exit(main(["bench", *sys.argv[1:]]))
