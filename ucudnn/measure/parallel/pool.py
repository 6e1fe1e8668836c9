"""Within a node: one worker process per GPU (spawned), each measuring its share into a shard
file of its own, merged into the target database after each round."""
from __future__ import annotations

import glob
import multiprocessing
import multiprocessing.connection
import os
import re
import signal
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...core.device import Provenance
from ...core.errors import ConfigError
from ...core.log import LOGGER
from ...core.problem import ConvProblem
from ...execute.backends import resolve as resolve_backends
from ..benchmark import Benchmarker, TimingSettings, ensure_tables
from ..cache.database import BenchmarkDatabase
from ..cache.files import leftovers
from ..cache.memo import Cache, resolve_path
from ..cache.merging import merge
from ..cache.paths import shard_path
from .devices import (
    DEVICES_VARIABLE,
    Factory,
    backend_setting,
    check_devices,
    check_one_model,
    cuda_probe,
    default_factory,
)
from .tasks import RETRIES, KernelProgress, Progress, SizesFor, Task, measure_share, partition, split_tasks, sweep

EXIT_GRACE_S = 60  # how long a worker that closed its pipe may take to exit before it is terminated


# ---- shards


def new_shard_dir(target: Path) -> Path:
    """A fresh folder next to the target for the shards of one run, named by this host and
    process (`<db>.shards-<host>-<pid>-XXXX`), so that a later run can tell a dead run's."""
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{target.name}.shards-{_host()}-{os.getpid()}-", dir=target.parent))


def recover_shards(target: Path) -> int:
    """Merge into `target` the shards a killed run on this host left beside it (its process gone:
    SIGKILL, the out-of-memory killer, a node's reboot) and remove their folders; measurements
    merged. Folders of live processes and of other hosts are left to their owners."""
    merged, own = 0, re.compile(rf"{re.escape(target.name)}\.shards-{re.escape(_host())}-(\d+)-\w+")
    for folder in sorted(target.parent.glob(f"{glob.escape(target.name)}.shards-*")):
        found = own.fullmatch(folder.name)  # not host "node-12"'s folder, seen from host "node"
        if found and folder.is_dir() and not _alive(int(found[1])):
            merged += merge_shards(folder, target)
            remove_if_empty(folder)
    if merged:
        LOGGER.info(f"merged {merged} measurements that a killed run left beside {target}")
    return merged


def _host() -> str:
    return shard_path(".").stem  # this host's name as shard files spell it


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # no signal: whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        pass
    return True


def merge_shards(folder: Path, target: Path) -> int:
    """Merge every shard in `folder` into `target` and delete them (a shard that a killed
    process left mid-transaction is read as it was before, merge rolls back its journal in a
    copy), and what a worker killed while it made its shard left; returns measurements merged."""
    shards = sorted(folder.glob("*.db"))
    count = merge(shards, target) if shards else 0
    for shard in shards:
        for leftover in (shard, shard.with_name(shard.name + "-journal")):
            leftover.unlink(missing_ok=True)
    for leftover in leftovers(folder):  # of a worker killed while it made its shard
        leftover.unlink()
    return count


def remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:  # shards left by an interrupted merge: docs/parallel.md says how to merge them
        LOGGER.warning(f"shards left in {folder}; merge them with `ucudnn cache merge {folder}/*.db "
                       f"--into TARGET`")


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

    def __init__(self, expected: Provenance, tracker: KernelProgress, worker: Callable = run_worker):
        self.expected, self.tracker, self.worker = expected, tracker, worker
        self.devices: dict[int, Provenance] = {}  # what each worker measured on
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
                for ready in multiprocessing.connection.wait(list(readers)):
                    self._receive(ready, readers)
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

    def _check(self, device: int, info: Provenance) -> None:
        if info.reuse_key != self.expected.reuse_key:
            raise ConfigError(f"the worker on GPU {device} measures on {info.describe()}, but the GPUs were "
                              f"probed as {self.expected.describe()}; list GPUs of one model only "
                              f"(--devices or {DEVICES_VARIABLE})")
        self.devices[device] = info


def bench_on_devices(problems: Iterable[ConvProblem], sizes_for: SizesFor, cap: int | None, path,
                     devices: Sequence[int], *, progress: Progress | None = None,
                     timing: str | TimingSettings = "default", execution: str = "graph", backend: str = "",
                     benchmarker_factory: Factory | None = None, probe: Callable[[int], Provenance] | None = None,
                     worker: Callable | None = None, retries: int = RETRIES) -> Provenance:
    """Measure what the database at `path` lacks of `problems` (the sizes `sizes_for` gives,
    within `cap` bytes of workspace, for each backend the `backend` setting selects) on the
    GPUs `devices` of this node, one worker process each, and merge the results into it;
    returns the GPU measured on. One GPU is measured in this process, exactly as `ucudnn bench`
    on one GPU. GPUs of different models are refused. Times are taken for `execution`
    (ucudnn.core.device.EXECUTIONS).

    `benchmarker_factory(gpu)` (picklable: it runs in the workers), `probe(gpu)` and
    `worker(job, events)` replace the GPU parts in tests. Raises MissingMeasurementsError if
    measurements are still missing after `retries` rounds on the workers that survived."""
    problems, devices, backends = list(problems), check_devices(devices), resolve_backends(backend)
    factory = benchmarker_factory or default_factory(timing, execution, backend_setting(backends))
    infos = [(probe or cuda_probe)(d).for_execution(execution) for d in devices]
    check_one_model([(f"GPU {d}", info) for d, info in zip(devices, infos)])
    target = resolve_path(path)
    recover_shards(target)
    if len(devices) == 1:
        return _bench_in_process(problems, sizes_for, cap, target, factory(devices[0]), backends, progress)

    def replan() -> list[Task]:
        with BenchmarkDatabase(target) as database:
            return split_tasks(problems, sizes_for, cap, database, infos[0], backends)

    tasks = replan()
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

    try:
        sweep(tasks, devices, run_round, replan, lambda d: f"the worker on GPU {d}", target, retries)
    finally:
        remove_if_empty(folder)
    pool.tracker.finish()
    return next(iter(pool.devices.values()), infos[0])


def _bench_in_process(problems, sizes_for: SizesFor, cap: int | None, target: Path, benchmarker: Benchmarker,
                      backends: Sequence[str], progress: Progress | None) -> Provenance:
    cache = Cache(target)
    try:
        ensure_tables(problems, sizes_for, cap, cache, benchmarker, progress, backends=backends)
    finally:
        cache.close()
    return benchmarker.device
