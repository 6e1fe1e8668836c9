"""Benchmarking t(a, b) and ws(a, b): every algorithm at every micro-batch size of a policy."""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol, Sequence

from . import gpu
from .bindings.enums import algo_count, refuses_problem
from .device import DeviceInfo, check_execution, check_timing
from .dispatch import compile_program
from .errors import ConfigError, CudnnError, GraphCaptureError, MissingMeasurementsError
from .graphs import GraphCapturer, GraphedProgram, cudnn_capturer
from .measurements import (FAILED, OK, OUT_OF_MEMORY, OVER_CAP, UNSUPPORTED, KernelTable, Measurement,
                           describe_sizes)
from .problem import ConvKind, ConvProblem


class Benchmarker(Protocol):
    """Measures kernels on one device. The GPU implementation is `CudnnBenchmarker`; tests use fakes."""

    device: DeviceInfo

    def measure(self, problem: ConvProblem, sizes: Iterable[int], cap: int | None) -> list[Measurement]:
        """One Measurement per (algorithm, size): time only for algorithms whose workspace is
        <= cap bytes (None: any that can be allocated); the others are recorded OVER_CAP."""


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


class Scratch:
    """Device memory for measuring: random operands at a kernel's largest size (never zeros),
    sliced along N for smaller micro-batches, and one workspace that grows as needed."""

    def __init__(self):
        self._key, self._operands, self._workspace = None, {}, None

    def operands(self, p: ConvProblem) -> dict[str, int]:
        """Addresses of x, w, y for `p` (reallocated only when the kernel changes)."""
        if self._key != p.key:
            self._operands = {}  # free before allocating the next kernel's
            self._operands = {role: gpu.random_array(shape, p.dtype, seed) for seed, (role, shape) in
                              enumerate((("x", p.x_shape), ("w", p.w_shape), ("y", p.y_shape)))}
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
    """Times every cuDNN algorithm of a kernel at each micro-batch size, on one GPU and stream,
    as `execution` will run it: `direct`, each call as the host issues it; `graph`, calls
    replayed from a CUDA graph, GPU time alone (see _time). A backward-filter micro-batch
    smaller than the kernel's batch is timed accumulating (beta = 1), as dispatch runs all of a
    configuration's BF calls but the first: that can cost 2.8x (bench/beta_probe.py).
    Failures (unsupported, errors, out of memory) are recorded, not raised."""

    def __init__(self, handle=None, timing: TimingSettings = TimingSettings(), stream: int | None = None,
                 execution: str = "graph"):
        from .bindings import cudnn

        self.handle = handle if handle is not None else cudnn.create_handle()
        self.stream = gpu.current_stream() if stream is None else stream
        cudnn.set_stream(self.handle, self.stream)
        self.timing = timing
        self.device = gpu.device_info().for_execution(execution).for_timing(timing.name)
        self.calls = 0  # (algorithm, size) pairs measured: what a warm cache saves
        self.scratch = Scratch()
        self.capturer = _capturer(execution, self.handle, self.stream)

    def measure(self, problem: ConvProblem, sizes: Iterable[int], cap: int | None) -> list[Measurement]:
        from .bindings.descriptors import KernelDescriptors

        sizes = sorted(set(sizes))
        ptrs = self.scratch.operands(problem.with_batch(sizes[-1]))
        results = []
        try:
            for b in sizes:
                descs = KernelDescriptors(problem.with_batch(b))
                beta = 1.0 if problem.kind is ConvKind.BACKWARD_FILTER and b < problem.batch else 0.0
                results += [self._measure_one(descs, ptrs, algo, cap, beta) for algo in range(algo_count(problem.kind))]
        finally:
            self.scratch.release()
        return results

    def _measure_one(self, descs, ptrs: dict, algo: int, cap: int | None, beta: float) -> Measurement:
        from .bindings.convolution import convolve, workspace_size

        p = descs.problem
        self.calls += 1
        try:
            ws = workspace_size(self.handle, p.kind, descs, algo)
        except CudnnError as exc:
            return Measurement(algo, p.batch, None, 0, _failure(exc))
        if cap is not None and ws > cap:
            return Measurement(algo, p.batch, None, ws, OVER_CAP)
        try:
            workspace = self.scratch.workspace(ws)
        except gpu.cupy().cuda.memory.OutOfMemoryError:
            return Measurement(algo, p.batch, None, ws, OUT_OF_MEMORY)

        def run():
            convolve(self.handle, p.kind, descs, ptrs, algo, workspace, ws, 1.0, beta, p.dtype)

        try:
            times = _time(run, self.timing, self.stream, self.capturer)
        except CudnnError as exc:
            return Measurement(algo, p.batch, None, ws, _failure(exc))
        except GraphCaptureError:  # graph execution would run it directly, host-paced: not a candidate
            return Measurement(algo, p.batch, None, ws, FAILED)
        return Measurement(algo, p.batch, statistics.median(times), ws, OK, len(times))


class ConfigurationTimer:
    """Executes whole configurations as a ucudnn.Handle of `execution` runs them (the real
    dispatch; `graph`: replayed CUDA graphs) and times them as a caller sees them, host
    included: what the optimizers' predictions are checked against."""

    def __init__(self, handle=None, timing: TimingSettings = TimingSettings(warmup=2, min_repeats=10,
                                                                            max_repeats=10),
                 stream: int | None = None, execution: str = "graph"):
        from .bindings import cudnn
        from .bindings.executor import CudnnExecutor

        self.handle = handle if handle is not None else cudnn.create_handle()
        self.stream = gpu.current_stream() if stream is None else stream
        cudnn.set_stream(self.handle, self.stream)
        self.timing, self.scratch = timing, Scratch()
        self.executor = CudnnExecutor(self.handle)
        self.capturer = _capturer(execution, self.handle, self.stream)

    def time_ms(self, problem: ConvProblem, configuration) -> float:
        """Median milliseconds of one run of `configuration` on `problem` (all micro-batches)."""
        ptrs = self.scratch.operands(problem)
        workspace = self.scratch.workspace(configuration.workspace)
        program = compile_program(problem, configuration, self.executor)
        if self.capturer is not None:  # the warm-up runs it directly, then captures it
            program = GraphedProgram(program, self.capturer, problem.describe())

        def run():
            program(ptrs["x"], ptrs["w"], ptrs["y"], workspace, configuration.workspace)

        return statistics.median(_time(run, self.timing, self.stream))


def _capturer(execution: str, handle, stream: int) -> "GraphCapturer | None":
    """What captures `handle`'s calls for graph execution; None for direct execution."""
    return cudnn_capturer(handle, lambda: stream) if check_execution(execution) == "graph" else None


SWEEP_MS, SWEEP_CALLS = 0.5, 16


def _time(run, timing: TimingSettings, stream: int, capturer: "GraphCapturer | None" = None) -> list[float]:
    """Warm up, then time enough calls to fill the target (see TimingSettings); the warm-up
    only sizes the repeats.

    With a `capturer` (graph execution), run() is timed as graph execution runs it: about
    SWEEP_MS of calls (at most SWEEP_CALLS) captured back to back into one CUDA graph, each
    launch timed with the host hidden and divided by the calls. Timing single calls instead
    overstated 30 µs calls by 8-19%, and sweeps on a stream by up to 14%: graphs launch
    dependent kernels with shorter gaps (bench/results/2026-11-23/graph-single-call/)."""
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


def _failure(exc: CudnnError) -> str:
    return UNSUPPORTED if refuses_problem(exc.status) else FAILED


def ensure_tables(problems: Iterable[ConvProblem], sizes_for: Callable[[ConvProblem], Sequence[int]],
                  cap: int | None, cache, benchmarker: Benchmarker | None,
                  progress: Callable[[int, int, ConvProblem], None] | None = None, *,
                  device: DeviceInfo | None = None) -> dict[str, KernelTable]:
    """Tables (by problem.key) complete for every size the policy needs and every algorithm
    that fits `cap`; only what the cache lacks is measured. With no benchmarker, tables come
    from the cache's measurements on `device`, and missing ones raise MissingMeasurementsError."""
    problems = list({p.key: p for p in problems}.values())
    device = benchmarker.device if benchmarker else device
    if device is None:
        raise ValueError("ensure_tables needs a benchmarker or the device whose measurements to use")
    tables = {}
    for done, p in enumerate(problems):
        if progress:
            progress(done, len(problems), p)
        table = cache.table(p, device)
        missing = table.missing(sizes_for(p), cap)
        if missing and benchmarker is None:
            raise MissingMeasurementsError(
                f"no measurements of {p.describe()} at {describe_sizes(missing)} on "
                f"{device.describe()} in the cache, and no GPU to measure them; run `ucudnn bench` "
                "for this network on such a GPU, or point --cache at a database that has them",
                problem=p, missing=missing)
        if missing:
            cache.record(p, device, benchmarker.measure(p, missing, cap))
            table = cache.table(p, device)
        tables[p.key] = table
    if progress and problems:
        progress(len(problems), len(problems), problems[-1])
    return tables
