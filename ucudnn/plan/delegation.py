"""When a layer runs its framework's own convolution instead (delegation), and the timings of
that convolution kept in the benchmark database.

A converted call costs host time that the framework's own does not (in torch: a Python autograd
Function, the site lookup, a graph launch per kernel). In a training step that the host paces
(ResNet-50 in AMP: 53 short convolutions) that time is the step's time. So ucudnn takes a layer
only where it buys something: where the framework's own kernels need more workspace than the
limit allows (the reason ucudnn exists: they are not allowed to run), or where ucudnn's kernels
are faster than the framework's by more than the host time a converted step costs. Otherwise the
layer runs the framework's own convolution, with no cost beyond one lookup. Both sides are
measured in this process: ucudnn's kernels by its benchmark, the framework's as they ran in the
layer's observed calls (InStep: the forward kernel, the backward kernels together), or by timing
its own convolution once per kernel under the memory its moment in the step leaves free (a
blocker allocation holds the rest while it is timed), as torch's benchmark mode meets it there.
ucudnn's kernels are weighed against them group by group: the forward kernel, and the backward
kernels together where they were seen in the step (one autograd node), one by one where timed.

A timing is kept in the database only where the framework chose its plan with nothing out of
reach (ROOMY_BYTES free at the kernel's moment in the step, ucudnn.plan.memory), and read only where
as much is free at its moment again: then it describes the
framework's unconstrained pick (named by the framework's version, e.g. 'torch:2.11.0+cu130', a
candidate of the database's `torch` backend, ucudnn.core.measurements.TORCH) on that GPU model and
cuDNN version, not the moment. A later process then decides delegation as the first did.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from ..core.measurements import Measurement
from ..core.problem import ConvProblem

# What a converted F+BD+BF step costs the host beyond torch's own layer, in ms: 0.35-0.49 ms
# synced vs torch's 0.04-0.17 ms per AlexNet layer, and 4.6 ms over ResNet-50's 53 layers in AMP
# (~0.09 ms a layer) on the H100's host (docs/torch.md); about 0.2-0.3 ms a layer under cProfile
# in r3d_18's host-paced step on the H200's, where layers taken for savings of 0.1-0.15 ms made
# the step slower than torch's (docs/results.md, "Forty steps"). A layer is kept where its
# kernels save more than this.
HOST_COST_MS = 0.15


# Free memory (device free plus the framework's cached blocks) beyond which torch's benchmark mode
# is taken to have had every plan cuDNN offers within reach. A judgment, not a measured bound: a
# plan asking more than this for one convolution would be kept from torch unnoticed
# (docs/results.md, "Cold start on models nobody planned", says what is not yet measured).
ROOMY_BYTES = 4 * 2**30


class OwnTiming(NamedTuple):
    """The framework's own convolution of a kernel, as measured in this process: its median GPU
    time, the bytes it allocates beyond its result (the workspace of the plan it chose) and the
    bytes that could be had when it chose (device free plus its cached blocks; 0: unknown)."""

    ms: float
    workspace: int
    free: int = 0


class AllocatorCounts(NamedTuple):
    """What the framework's allocator has done so far (Framework.flushes, Framework.grown): how
    often it gave its whole cache back to serve an allocation, and how often it took memory from
    the device (a cudaMalloc, or pages mapped); one minus another is what it did between them."""

    flushes: int = 0
    grown: int = 0

    def __sub__(self, other: AllocatorCounts) -> AllocatorCounts:
        return AllocatorCounts(self.flushes - other.flushes, self.grown - other.grown)


class Window(NamedTuple):
    """One observed call of a group of kernels (InStep.each): its milliseconds, and the
    allocator's flushes and memory taken from the device inside it."""

    ms: float
    flushes: int = 0
    grown: int = 0


# A window's start mark first holds the device this long (Framework.mark's hold_s): where the step
# is host-paced the device would otherwise wait between the mark and the kernel, and the window
# would time the host. Unheld, densenet121's 1x1 convolutions took 0.19-0.41 ms a window against
# 0.03-0.05 ms timed apart, and 102 of its 298 kernels were swept for it (docs/results-archive.md, "Six
# models"). A window's host time (a mark, torch's dispatch, an autograd node) is 0.05-0.3 ms.
IN_STEP_HOLD_S = 0.5e-3


class InStep:
    """A layer's own kernels as they ran in its observed calls (ucudnn.plan.memory): per group of
    kernels (the forward kernel; the backward kernels together, one autograd node), the marks
    (Planner.Framework.mark) where it started, after holding the device (IN_STEP_HOLD_S), and
    ended in each call, and what the framework's allocator did between them (AllocatorCounts: its
    flushes and the memory it took from the device), read beside them. What the step itself paid,
    at its moment."""

    def __init__(self) -> None:
        self._open: dict[tuple, tuple[Any, AllocatorCounts]] = {}
        self._windows: dict[tuple, list[tuple[Any, Any, AllocatorCounts]]] = {}

    def start(self, kinds: tuple, mark: Any, counts: AllocatorCounts | None = None) -> None:
        self._open[kinds] = mark, counts or AllocatorCounts()

    def end(self, kinds: tuple, mark: Any, counts: AllocatorCounts | None = None) -> None:
        """A window from the group's open start to `mark`, with what the allocator did between;
        none where either mark is missing (None: no mark could be taken, e.g. while a CUDA graph
        is captured)."""
        start, before = self._open.pop(kinds, (None, AllocatorCounts()))
        if start is not None and mark is not None:
            self._windows.setdefault(kinds, []).append((start, mark, (counts or AllocatorCounts()) - before))

    def each(self, elapsed_ms: Callable[[Any, Any], float]) -> dict[tuple, list[Window]]:
        """Per group of kinds, each call's window in call order: its milliseconds and what the
        allocator did in it (a flush is a cost the step pays each time its moment comes; memory
        taken from the device, as the pool grows to the step's peak, is paid once)."""
        return {kinds: [Window(elapsed_ms(a, b), *counts) for a, b, counts in windows]
                for kinds, windows in self._windows.items()}


def least(windows: dict[tuple, list[Window]]) -> dict[tuple, float]:
    """Per group of kinds, the least milliseconds of its windows (InStep.each)."""
    return {kinds: min(w.ms for w in each) for kinds, each in windows.items()}


# Under pressure, torch's benchmark mode may settle for a slow plan although cuDNN's favourite
# fits what is free (wav2vec2's second layer on an H200 with 704 MiB free: a 4.65 ms data gradient
# whose favourite fitted), so there the favourite is no evidence: a layer whose own kernels take
# this long together is swept. A sweep costs 0.1-3 s of planning per kernel (docs/results.md,
# "Whole models where memory is short"); shorter layers can save little and keep their own.
SWEPT_UNDER_PRESSURE_MS = 0.5


def settled_by_own(own: Sequence[OwnTiming], rooms: Sequence[int], favourites_fit: Callable[[], bool]) -> bool:
    """Whether a layer runs the framework's own convolution with no sweep of ucudnn's candidates:
    each of its own kernels was timed (its operands fit) and fits its workspace room (`rooms`,
    per kernel: the per-kernel limit, or what its moment leaves free), and the framework chose it
    with nothing out of reach: with ROOMY_BYTES free, or else
    where cuDNN's heuristic favourite of each kernel fits the limit too (`favourites_fit()`, asked
    only then: it costs a heuristics query per kernel). Then no plan is kept out by the limit,
    which is all micro-batching can let in, and torch's benchmark mode has timed what cuDNN rates
    best. Under memory pressure with a favourite that does not fit (the framework settled for a
    slow plan), the sweep decides."""
    if not own or any(t.ms == math.inf or t.workspace > room for t, room in zip(own, rooms)):
        return False
    return all(t.free >= ROOMY_BYTES for t in own) or favourites_fit()


# Under pressure a long layer is swept only where torch's kernels in the step ran slower than
# cuDNN's favourites (fitting their rooms) timed once at the whole batch by more than this factor:
# a sweep costs 0.3-6.7 s a kernel, and fcn_resnet50's 15 such sweeps all ended delegated
# (docs/results-archive.md, "Torch's kernels judged as they ran in the step"), where wav2vec2's found
# plans 5-10x faster than torch's kernels in the step.
FAVOURITE_SLACK = 1.25


def as_fast_as_favourites(own: Sequence[OwnTiming], favourite_ms: Sequence[float],
                          groups: Sequence[Sequence[int]], slack: float = FAVOURITE_SLACK) -> bool:
    """Whether a layer's own kernels ran about as fast as cuDNN's favourites of them: each group
    of kernels timed together (delegation.own_kernels_faster's `groups`) within `slack` of its
    favourites' time. Never where a favourite could not be timed (inf): then the sweep decides."""
    for group in groups:
        favourites = sum(favourite_ms[i] for i in group)
        if not math.isfinite(favourites) or sum(own[i].ms for i in group) > slack * favourites:
            return False
    return True


def pressed(own: Sequence[OwnTiming]) -> bool:
    """Whether a layer's own kernels, timed under the pressure of their moments, are long enough
    (SWEPT_UNDER_PRESSURE_MS together) that a plan torch's benchmark mode settled for there is
    checked by a sweep, whatever cuDNN's favourite needs."""
    return sum(t.ms for t in own) >= SWEPT_UNDER_PRESSURE_MS and any(t.free < ROOMY_BYTES for t in own)


def own_kernels_faster(ucudnn_ms: Sequence[float], own: Sequence[OwnTiming], rooms: Sequence[int],
                       groups: Sequence[Sequence[int]]) -> set[int]:
    """Which kernels of a layer ucudnn keeps run the framework's own convolution instead (by
    index): each group of kernels timed together (`groups`: one kernel each where timed apart;
    the forward kernel and the backward kernels together where seen in the step, InStep, whose
    timings are even shares of their group's) whose own kernels fit their workspace `rooms` and
    take less time together than ucudnn's plans of them (a plan the search could not find: a
    pruned search times cuDNN's best-ranked candidates, and torch's benchmark mode may find
    another that ranks lower)."""
    faster: set[int] = set()
    for group in groups:
        fits = all(own[i].workspace <= rooms[i] for i in group)
        if fits and sum(own[i].ms for i in group) < sum(ucudnn_ms[i] for i in group):
            faster.update(group)
    return faster


def worth_delegating(ucudnn_ms: Sequence[float], own: Sequence[OwnTiming], rooms: Sequence[int],
                     host_cost_ms: float = HOST_COST_MS) -> bool:
    """Whether a layer whose kernels take `ucudnn_ms` through ucudnn and `own` (time and
    workspace) through the framework runs the framework's own convolution: every own kernel fits
    its workspace room (`rooms`, per kernel), and ucudnn's kernels together save less than `host_cost_ms`."""
    if not own or any(t.workspace > room for t, room in zip(own, rooms)):
        return False
    saving_ms = sum(t.ms for t in own) - sum(ucudnn_ms)
    return saving_ms < host_cost_ms


def stored_timing(assignments, problem: ConvProblem, free: int, candidate: str) -> OwnTiming | None:
    """The kept timing of the framework's own `problem` (its database name `candidate`), where
    `free` bytes are at least ROOMY_BYTES and the database of `assignments` (a Handle's) holds
    one; else None."""
    if free < ROOMY_BYTES:
        return None
    found = [m for m in assignments.cache.table(problem, assignments.benchmarker.device).at(problem.batch)
             if m.algo == candidate and m.available]
    return OwnTiming(found[0].time_ms, found[0].workspace, free) if found else None


def keep_timing(assignments, problem: ConvProblem, timing: OwnTiming, candidate: str) -> None:
    """Keep `timing` of the framework's own `problem` (its database name `candidate`) in the
    database of `assignments`, where it was taken with ROOMY_BYTES free and the kernel ran."""
    if timing.free >= ROOMY_BYTES and math.isfinite(timing.ms):
        assignments.cache.record(problem, assignments.benchmarker.device,
                                 [Measurement(candidate, problem.batch, timing.ms, timing.workspace)])
