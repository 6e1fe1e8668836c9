"""Benchmark tasks: what the database lacks, per backend, split into shares by estimated cost,
measured share by share, and the sweep that retries what failed workers left on those that survived."""
from __future__ import annotations

import functools
import heapq
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, TypeVar

from ...core.accumulation import accumulates
from ...core.device import Provenance
from ...core.errors import ConfigError, MissingMeasurementsError
from ...core.problem import ConvProblem
from ...execute.backends import BACKENDS, module as backend_module
from ...optimizers.search import FULL
from ..benchmark import Benchmarker

W = TypeVar("W", bound=Hashable)
SizesFor = Callable[[ConvProblem], Sequence[int]]
Progress = Callable[[int, int, ConvProblem], None]

SIZES_PER_CALL = 8  # sizes of one kernel measured (and recorded, in one transaction) together
TASK_OVERHEAD_FLOPS = 10**11  # the fixed cost of a task (descriptors, queries, launches) in flops
RETRIES = 1  # rounds that re-measure what failed workers left, on the workers that survived
BACKEND_WEIGHTS = {name: backend_module(name).TASK_WEIGHT for name in BACKENDS}  # each backend module's
ENGINE_TASK_WEIGHT = BACKEND_WEIGHTS["engines"]


# ---- tasks and their partition


@dataclass(frozen=True)
class Task:
    """One kernel at one micro-batch size with one backend: every candidate of that backend
    (ucudnn.execute.backends) is measured at that size."""

    problem: ConvProblem
    batch: int
    backend: str

    @property
    def cost(self) -> int:
        """Relative cost estimate: the flops of the micro-batch plus a fixed overhead, times the
        backend's weight (BACKEND_WEIGHTS)."""
        weight = BACKEND_WEIGHTS[self.backend]
        return (_sample_flops(self.problem) * self.batch + TASK_OVERHEAD_FLOPS) * weight


@functools.lru_cache(maxsize=4096)
def _sample_flops(problem: ConvProblem) -> int:
    return problem.with_batch(1).flops()  # flops are linear in the batch


def split_tasks(problems: Iterable[ConvProblem], sizes_for: SizesFor, cap: int | None, database,
                device: Provenance, backends: Sequence[str]) -> list[Task]:
    """The tasks a single-GPU `ensure_tables` would measure: for each kernel (in order of first
    appearance) and each of `backends` (in their order) the sizes `sizes_for` asks for whose
    measurements of that backend `database` (a Cache or BenchmarkDatabase) lacks on `device`'s
    GPU model within `cap`, each (shape, size, backend) once."""
    problems = list({p.key: p for p in problems}.values())
    tables = database.tables(problems, device)
    tasks: dict[tuple[str, int, bool, str], Task] = {}
    for p in problems:
        for backend in backends:
            for b in FULL.missing(tables[p.key], sizes_for(p), cap, [backend]):
                tasks.setdefault((p.shape_key(), b, accumulates(p, b), backend), Task(p, b, backend))
    return list(tasks.values())


def partition(tasks: Sequence[Task], parts: int) -> list[list[Task]]:
    """`tasks` in `parts` disjoint shares that cover them all, balanced by estimated cost (the
    costliest task first to the least loaded share, ties to the lower index) and each in the
    order of `tasks`. Deterministic, so processes that compute it agree without talking.

    One rule for every backend, with no grouping of a kernel's sizes or backends on one worker:
    each task is an independent measurement (a backend lists and builds its candidates per
    micro-batch size, so a worker gains nothing from holding a kernel's other sizes), and a
    task, hence a (shape, size, backend), is in exactly one share."""
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


class MeasureCall(NamedTuple):
    """One measure() call: sizes of one kernel, measured with one backend."""

    problem: ConvProblem
    backend: str
    sizes: list[int]

    def takes(self, task: Task) -> bool:
        """Whether `task` can join this call."""
        return (self.problem.key, self.backend) == (task.problem.key, task.backend) and \
            len(self.sizes) < SIZES_PER_CALL


def calls(share: Sequence[Task]) -> list[MeasureCall]:
    """Consecutive tasks of one kernel and backend grouped into measure() calls of at most
    SIZES_PER_CALL sizes."""
    grouped: list[MeasureCall] = []
    for task in share:
        if grouped and grouped[-1].takes(task):
            grouped[-1].sizes.append(task.batch)
        else:
            grouped.append(MeasureCall(task.problem, task.backend, [task.batch]))
    return grouped


def measure_share(share: Sequence[Task], benchmarker: Benchmarker, database, cap: int | None,
                  done: Callable[[ConvProblem, int], None] | None = None) -> None:
    """Measure `share`, each task with its backend, and record it call by call (one short
    transaction each), so a process that dies keeps everything recorded before;
    done(problem, sizes) after each call."""
    for call in calls(share):
        measured = benchmarker.measure(call.problem, call.sizes, cap, backend=call.backend)
        database.record(call.problem, benchmarker.device, measured)
        if done:
            done(call.problem, len(call.sizes))


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


# ---- rounds


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
            f"of measuring, e.g. {example.problem.describe()} at micro-batch {example.batch} ({example.backend} "
            f"backend): {why}. "
            f"Everything measured is kept in {target}: run the same command again to measure only what "
            "is missing (with fewer GPUs if one keeps failing)")
