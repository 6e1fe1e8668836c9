"""Benchmarking t(a, b) and ws(a, b): every algorithm at every micro-batch size of a policy."""
from __future__ import annotations

import contextlib
import functools
import math
import statistics
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ..core.accumulation import accumulates
from ..core.budget import OutOfTime, current
from ..core.device import TIMING_PRESETS, Provenance, check_execution, check_timing
from ..core.errors import ConfigError, DeviceMemoryError, GraphCaptureError
from ..core.measurements import FAILED, OK, OUT_OF_MEMORY, OVER_CAP, PRUNED, KernelTable, Measurement, failure_status
from ..core.problem import ConvProblem
from ..execute import gpu
from ..execute.backends import frontend_version, open_backends
from ..execute.bindings import cudnn
from ..execute.dispatch import Program, Step, compile_program, step
from ..execute.graphs import GraphCapturer, GraphedProgram
from ..optimizers.search import FULL, Search


class Benchmarker(Protocol):
    """Measures kernels on one device. The GPU implementation is `CudnnBenchmarker`; tests use fakes."""

    device: Provenance
    backends: Any  # .names: the backends it measures (ucudnn.execute.backends)

    def measure(self, problem: ConvProblem, sizes: Iterable[int], cap: int | None,
                backend: str | None = None, best: int | None = None,
                skip: Collection[str] = ()) -> list[Measurement]:
        """One Measurement per (candidate, size) of `backend` (None: every backend it has):
        time only for candidates whose workspace is <= cap bytes (None: any that can be
        allocated); the others are recorded OVER_CAP. `best`: per backend and size, measure only
        the first `best` of the backend's ranking (and on to the first that runs within the cap,
        where none of them does); record the rest PRUNED (ucudnn.optimizers.search), and so those in `skip`."""


@dataclass(frozen=True)
class TimingSettings:
    """How each (algorithm, micro-batch) is timed: `warmup` untimed calls, then enough timed
    calls to fill `target_ms` (at least `min_repeats`, at most `max_repeats`); the median counts."""

    warmup: int = 1
    min_repeats: int = 3
    max_repeats: int = 10
    target_ms: float = 20.0
    name: str = "default"  # stored with its measurements (device.TIMING_PRESETS): quick never replaces default

    def __post_init__(self):
        check_timing(self.name)
        if self.warmup < 1 or self.min_repeats < 1 or self.max_repeats < self.min_repeats:
            raise ConfigError(f"{self}: need warmup >= 1 and 1 <= min_repeats <= max_repeats")

    def repeats(self, estimate_ms: float) -> int:
        wanted = math.ceil(self.target_ms / max(estimate_ms, 1e-3))
        return max(self.min_repeats, min(self.max_repeats, wanted))


# The timing presets by name (device.TIMING_PRESETS, best first), what `ucudnn bench --timing` takes
TIMINGS = {
    "default": TimingSettings(),
    # one warm-up, then 1 to 3 timed calls: sweeps of the `all` policy in minutes, noisier times
    "quick": TimingSettings(warmup=1, min_repeats=1, max_repeats=3, target_ms=3.0, name="quick"),
}
assert tuple(TIMINGS) == TIMING_PRESETS, "a timing preset is named in device.TIMING_PRESETS, best first"


class Scratch:
    """Device memory for measuring: random operands at a kernel's largest size (never zeros),
    sliced along N for smaller micro-batches, and one workspace that grows as needed."""

    def __init__(self):
        self._key, self._operands, self._workspace = None, {}, None

    def operands(self, p: ConvProblem) -> dict[str, int]:
        """Addresses of x, w, y for `p` (reallocated only when the kernel changes)."""
        if self._key != p.key:
            self._operands, self._key = {}, None  # free before allocating the next kernel's
            try:
                self._operands = {role: gpu.random_array(shape, p.dtype, seed) for seed, (role, shape) in
                                  enumerate((("x", p.x_shape), ("w", p.w_shape), ("y", p.y_shape)))}
            except gpu.cupy().cuda.memory.OutOfMemoryError:
                raise DeviceMemoryError(f"the operands to benchmark {p.describe()}", p.operand_bytes(),
                                        "free GPU memory, or benchmark this kernel ahead of time "
                                        "(`ucudnn bench`) so that a warm cache needs no operands") from None
            self._key = p.key
        return {role: gpu.pointer(array) for role, array in self._operands.items()}

    def workspace(self, nbytes: int) -> int:
        if self._workspace is None or self._workspace.mem.size < nbytes:
            self._workspace = None  # free the old buffer before asking for a larger one
            self._workspace = gpu.alloc(nbytes)
        return self._workspace.ptr

    def release(self) -> None:
        """Give every buffer back to the device, not only to CuPy's pool: benchmarking touches
        the largest workspaces of all, which a training run must not keep paying for."""
        self._key, self._operands, self._workspace = None, {}, None
        gpu.free_pool()


class CudnnBenchmarker:
    """Times every candidate of a kernel's backends at each micro-batch size, on one GPU and
    stream, as `execution` will run it: `direct`, each call as the host issues it; `graph`,
    calls replayed from a CUDA graph, GPU time alone (see _time).

    Coarse, then precise: each candidate is first timed on one call, its first, or its second
    where it is short (COLD_WEIGHS_MS); only those that can still be chosen at that size
    (`worth_timing_again`) are then timed with the full TimingSettings. No warm-up call precedes
    a slow candidate: the slow ones, run once each, are most of a sweep's GPU time. The engine
    backend lists dozens of candidates per kernel, most of them dominated by far. A
    backward-filter micro-batch smaller than the kernel's batch is timed accumulating, as
    dispatch runs all of a configuration's BF calls but the first (legacy: beta = 1, which can
    cost a multiple of beta = 0, docs/results.md, "Many small micro-batches are host-bound,
    unless replayed as a graph"; engines: the partial and its sum). Failures (unsupported,
    errors, out of memory) are recorded, not raised."""

    def __init__(self, handle=None, timing: TimingSettings = TimingSettings(), stream: int | None = None,
                 execution: str = "graph", backend: str = "", make_room: Callable[[], None] | None = None):
        self.handle, self.stream, self.backends = _open(handle, stream, backend)
        self.timing = timing
        frontend = frontend_version() if "engines" in self.backends.names else ""  # the engines run through it
        self.device = gpu.device_info(frontend_version=frontend).for_execution(execution).for_timing(timing.name)
        self.calls = 0  # (candidate, size) pairs measured: what a warm cache saves
        self.scratch = Scratch()
        self.pace = gpu.HostPace()  # of one candidate's call: sizes the coarse timings' spins
        self.capturer = _capturer(execution, self.backends, self.stream, make_room)

    def measure(self, problem: ConvProblem, sizes: Iterable[int], cap: int | None,
                backend: str | None = None, best: int | None = None,
                skip: Collection[str] = ()) -> list[Measurement]:
        sizes = sorted(set(sizes))
        results = []
        with _stream_kept(self.handle):
            self.backends.set_stream(self.stream)
            try:
                ptrs = self.scratch.operands(problem.with_batch(sizes[-1]))
                for name in [backend] if backend else self.backends.names:
                    for b in sizes:
                        results += self._measure_size(self.backends[name], problem, problem.with_batch(b), ptrs,
                                                      cap, best, skip)
            finally:
                self.scratch.release()
                self.backends.release()
        return results

    def _measure_size(self, backend, problem: ConvProblem, micro: ConvProblem, ptrs: dict,
                      cap: int | None, best: int | None, skip: Collection[str] = ()) -> list[Measurement]:
        runs: dict[str, Callable[[], None]] = {}
        measured: dict[str, Measurement] = {}
        for rank, algo in enumerate(backend.ranked(micro)):
            if (best is not None and rank >= best and runs) or algo in skip:
                measured[algo] = Measurement(algo, micro.batch, None, 0, PRUNED,
                                             accumulates=accumulates(problem, micro.batch))
                continue
            self.calls += 1
            measured[algo], run = self._coarse(problem, micro, backend.candidate(micro, algo), ptrs, cap)
            if run is not None:
                runs[algo] = run
        for algo in worth_timing_again(list(measured.values())):
            m = measured[algo]
            try:
                times = _time(runs[algo], self.timing, self.stream, self.capturer, estimate=m.time_ms)
            except GraphCaptureError:  # graph execution would run it directly, host-paced: not a candidate
                measured[algo] = replace(m, time_ms=None, status=FAILED, repeats=0)
                continue
            except Exception as exc:
                measured[algo] = replace(m, time_ms=None, status=failure_status(exc), repeats=0)
                continue
            measured[algo] = replace(m, time_ms=statistics.median(times), repeats=len(times))
        return list(measured.values())

    def _coarse(self, problem: ConvProblem, micro: ConvProblem, candidate, ptrs: dict,
                cap: int | None) -> tuple[Measurement, Callable[[], None] | None]:
        """The candidate's one-call measurement, and how to run it again (None: it cannot run)."""
        step = timing_step(problem, micro.batch, candidate.id, self.backends.blends)
        b, ws, summed = micro.batch, step.buffer_bytes + candidate.workspace, step.accumulates
        if candidate.status != OK:
            return Measurement(candidate.id, b, None, ws, candidate.status, accumulates=summed), None
        if cap is not None and ws > cap:
            return Measurement(candidate.id, b, None, ws, OVER_CAP, accumulates=summed), None
        try:
            workspace = self.scratch.workspace(ws)
        except gpu.cupy().cuda.memory.OutOfMemoryError:
            return Measurement(candidate.id, b, None, ws, OUT_OF_MEMORY, accumulates=summed), None
        try:
            call = self.backends.prepare(step)
            run = functools.partial(call, ptrs["x"], ptrs["w"], ptrs["y"], workspace, ws)
            time_ms = gpu.time_calls(run, 1, self.stream, hide_host=self.pace)[0]
            if time_ms < COLD_WEIGHS_MS:
                time_ms = gpu.time_calls(run, 1, self.stream, hide_host=self.pace)[0]
        except Exception as exc:  # a candidate that fails to build or run is data
            return Measurement(candidate.id, b, None, ws, failure_status(exc), accumulates=summed), None
        return Measurement(candidate.id, b, time_ms, ws, OK, 1, accumulates=summed), run


def timing_step(kernel: ConvProblem, batch: int, algo: str, blends) -> Step:
    """The call a measurement of `batch` samples of `kernel` times: a backward-filter micro-batch
    smaller than the kernel's batch as a middle part of a sum (ucudnn.core.accumulation), every other
    one as a whole call."""
    summed = accumulates(kernel, batch)
    return step(kernel, algo, 0, batch, 1 if summed else 0, 3 if summed else 1, 1.0, 0.0, blends)


COLD_WEIGHS_MS = 1.0  # a first call runs on cold caches, which weighs on short calls only
SLACK = 1.25  # coarse times are single calls: a candidate within this factor may still win


def worth_timing_again(coarse: Iterable[Measurement], slack: float = SLACK) -> list[str]:
    """The candidates that can still be chosen after a coarse sweep: those no candidate with at
    most their workspace beats by more than `slack` (the time-workspace front, widened)."""
    best, keep = math.inf, []
    for m in sorted((m for m in coarse if m.available), key=lambda m: (m.workspace, m.available_ms)):
        if m.available_ms <= slack * best:
            keep.append(m.algo)
        best = min(best, m.available_ms)
    return keep


class ConfigurationTimer:
    """Executes whole configurations as a ucudnn.Handle of `execution` runs them (the real
    dispatch; `graph`: replayed CUDA graphs) and times them as a caller sees them, host
    included: what the optimizers' predictions are checked against."""

    def __init__(self, handle=None, timing: TimingSettings = TimingSettings(warmup=2, min_repeats=10,
                                                                            max_repeats=10),
                 stream: int | None = None, execution: str = "graph", backend: str = "",
                 make_room: Callable[[], None] | None = None):
        self.handle, self.stream, self.backends = _open(handle, stream, backend)
        self.timing, self.scratch = timing, Scratch()
        self.capturer = _capturer(execution, self.backends, self.stream, make_room)

    def time_ms(self, problem: ConvProblem, configuration) -> float:
        """Median milliseconds of one run of `configuration` on `problem` (all micro-batches)."""
        with _stream_kept(self.handle):
            self.backends.set_stream(self.stream)
            return self._time_ms(problem, configuration)

    def _time_ms(self, problem: ConvProblem, configuration) -> float:
        ptrs = self.scratch.operands(problem)
        workspace = self.scratch.workspace(configuration.workspace)
        program: Program | GraphedProgram = compile_program(problem, configuration, self.backends)
        if self.capturer is not None:  # the warm-up runs it directly, then captures it
            program = GraphedProgram(program, self.capturer, problem.describe())

        def run():
            program(ptrs["x"], ptrs["w"], ptrs["y"], workspace, configuration.workspace)

        return statistics.median(_time(run, self.timing, self.stream))


def _open(handle, stream: int | None, backend: str) -> tuple[Any, int, Any]:
    """(cuDNN handle, stream, backends) to measure with: on `handle` where one is given (a
    ucudnn.Handle's own: one handle, not two, as each holds device memory of its own)."""
    handle = handle if handle is not None else cudnn.create_handle()
    stream = gpu.current_stream() if stream is None else stream
    with _stream_kept(handle):
        return handle, stream, open_backends(backend, handle, stream)


@contextlib.contextmanager
def _stream_kept(handle):
    """Inside, measuring may point `handle` at its own stream; on the way out the handle is back
    on the stream it was on (its owner, a ucudnn.Handle, queues its calls there)."""
    before = cudnn.get_stream(handle)
    try:
        yield
    finally:
        cudnn.set_stream(handle, before)


def _capturer(execution: str, backends, stream: int,
              make_room: Callable[[], None] | None = None) -> GraphCapturer | None:
    """What captures the backends' calls for graph execution (making room as GraphCapturer says);
    None for direct execution."""
    if check_execution(execution) != "graph":
        return None
    return GraphCapturer(backends.set_stream, lambda: stream, make_room)


SWEEP_MS, SWEEP_CALLS = 0.5, 16


def _time(run, timing: TimingSettings, stream: int, capturer: GraphCapturer | None = None,
          estimate: float | None = None) -> list[float]:
    """Warm up, then time enough calls to fill the target (see TimingSettings); the warm-up
    only sizes the repeats, and a call already run and timed (`estimate` ms, the coarse sweep's)
    stands in for it.

    With a `capturer` (graph execution), run() is timed as graph execution runs it: about
    SWEEP_MS of calls (at most SWEEP_CALLS) captured back to back into one CUDA graph, each
    launch timed with the host hidden and divided by the calls: single calls, and sweeps on a
    stream, overstate short calls, as graphs launch dependent kernels with shorter gaps
    (docs/results.md, "Many small micro-batches are host-bound, unless replayed as a graph")."""
    if estimate is None:
        estimate = min(gpu.time_calls(run, timing.warmup, stream))
    if capturer is None:
        return gpu.time_calls(run, timing.repeats(estimate), stream)
    calls = max(1, min(SWEEP_CALLS, round(SWEEP_MS / max(estimate, 1e-3))))

    def sweep():
        for _ in range(calls):
            run()

    graph = capturer.capture(sweep)
    times = gpu.time_calls(lambda: capturer.launch(graph), timing.repeats(estimate * calls), stream, hide_host=True)
    return [t / calls for t in times]


def ensure_tables(problems: Iterable[ConvProblem], sizes_for: Callable[[ConvProblem], Sequence[int]],
                  cap: int | None, cache, benchmarker: Benchmarker,
                  progress: Callable[[int, int, ConvProblem], None] | None = None, *,
                  backends: Sequence[str] | None = None, search: Search = FULL) -> dict[str, KernelTable]:
    """Tables (by problem.key) of the candidates of `backends` (default: the benchmarker's),
    complete as `search` needs them (ucudnn.optimizers.search) at the sizes the policy gives and
    within `cap`; only what the cache lacks is measured, backend by backend. (Tables read from a
    recording alone, with no GPU to measure: plan.sources.recorded_tables.)"""
    problems = list({p.key: p for p in problems}.values())
    tables = {}
    for done, p in enumerate(problems):
        if progress:
            progress(done, len(problems), p)
        tables[p.key] = _measured(p, sizes_for(p), cap, cache, benchmarker,
                                  benchmarker.backends.names if backends is None else backends, search)
    if progress and problems:
        progress(len(problems), len(problems), problems[-1])
    return tables


def _measured(p: ConvProblem, sizes: Sequence[int], cap: int | None, cache, benchmarker: Benchmarker,
              backends: Sequence[str], search: Search) -> KernelTable:
    """`p`'s table once what `search` finds missing is measured, backend by backend, asking again
    after each round (a pruned search walks down the sizes); each size of each backend is measured
    at most once, so one left out of memory ends the loop. Within a slice (core.budget), OutOfTime
    once it is spent after a round that completed a size: the table is the state, so a later call
    goes on where this one ended (a round that completed nothing, a size left out of memory, ends
    no call, which would else measure it again at every start)."""
    tried: set[tuple[str, int]] = set()
    done: dict[str, list[int]] = {}  # the last round's sizes, by backend
    while True:
        table = cache.table(p, benchmarker.device).only(backends)
        _spend(p, table, done, cap, search)
        wanted = search.sizes(table, sizes, cap, backends)
        todo = {name: missing for name in backends
                if (missing := [b for b in wanted if (name, b) not in tried
                                and not search.complete_at(table, b, cap, [name])])}
        if not todo:
            return table
        for name, missing in todo.items():
            tried.update((name, b) for b in missing)
            skip = search.skipped(table.only([name]), max(missing))
            cache.record(p, benchmarker.device,
                         benchmarker.measure(p, missing, cap, backend=name, best=search.best, skip=skip))
        done = todo


def _spend(p: ConvProblem, table: KernelTable, done: dict[str, list[int]], cap: int | None, search: Search) -> None:
    """After a round of _measured (`table` as it left it, `done` its sizes; none before the first):
    where a slice is in force (core.budget.current) and the round completed a size of a backend,
    the slice has worked; OutOfTime where it is spent."""
    budget = current()
    if budget is None or not any(search.complete_at(table, b, cap, [name]) for name, sizes in done.items() for b in sizes):
        return
    budget.worked = True
    if budget.spent():
        raise OutOfTime(f"{p.describe()}: the slice ended between two rounds of its sweep")

