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
from collections.abc import Callable, Hashable, Sequence

from ..core.budget import OutOfTime, Slice
from ..core.measurements import OK, Measurement
from ..core.problem import ConvKind, ConvProblem
from .framework import UCUDNN, Call, OwnTiming, Site
from .kernels import Kernels, Key
from .moments import Moments

# What a converted F+BD+BF step costs the host beyond torch's own layer, in ms (docs/torch.md;
# docs/results.md, "Forty steps": in a host-paced step, layers taken for savings below it made the
# step slower than torch's). A layer is kept where its kernels save more than this.
HOST_COST_MS = 0.15


# Free memory (device free plus the framework's cached blocks) beyond which torch's benchmark mode
# is taken to have had every plan cuDNN offers within reach. A judgment, not a measured bound: a
# plan asking more than this for one convolution would be kept from torch unnoticed
# (docs/results.md, "Cold start on models nobody planned", says what is not yet measured).
ROOMY_BYTES = 4 * 2**30


# Under pressure, torch's benchmark mode may settle for a slow plan although cuDNN's favourite
# fits what is free, so there the favourite is no evidence: a layer whose own kernels take this
# long together is swept. A sweep costs seconds of planning per kernel (docs/results.md, "Whole
# models where memory is short"); shorter layers can save little and keep their own.
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
# sweeps of layers whose kernels ran as fast as the favourites ended delegated, where those of
# slower ones found faster plans (docs/results-archive.md, "Torch's kernels judged as they ran in
# the step").
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


class Delegation:
    """Each layer's decision, by what it depends on (key(): its call, kernels and their rooms):
    whether it runs the framework's own convolution, made on the rules above. The framework's own
    kernels are judged first, as they ran in the step (Moments.seen) or else timed apart
    (`own_timings`, by (kind, call, room)), and where they settle the layer (settled_by_own) it
    runs them with no sweep (`unswept`); else ucudnn's kernels are swept (Kernels) and weighed
    against the same timings. With `delegate` off every layer is ucudnn's, and nothing is timed."""

    def __init__(self, kernels: Kernels, moments: Moments) -> None:
        self.kernels, self.moments = kernels, moments
        self.delegate = kernels.settings.delegate
        self.decided: dict[tuple, bool] = {}
        self.unswept: set[Hashable] = set()
        self.own_timings: dict[Key, OwnTiming] = {}
        self._favourites: dict[tuple[ConvKind, Hashable], float] = {}  # the workspace of cuDNN's favourite, asked once
        self.favourite_times: dict[tuple[ConvKind, Hashable], float] = {}  # ... and its time, where a layer is pressed

    def key(self, site: Site) -> tuple:
        """What a layer's decision depends on: its call, kernels and their rooms."""
        return site.call, site.kinds, tuple(self.kernels.room(site, kind) for kind in site.kinds)

    def decide(self, site: Site) -> bool:
        """Whether the site's layer runs the framework's own convolution: as decided for its key,
        else planned now, with no slice to run out (plan())."""
        delegated = self.plan(site, Slice())
        assert delegated is not None  # only a slice runs out
        return delegated

    def plan(self, site: Site, budget: Slice) -> bool | None:
        """Whether the site's layer runs the framework's own convolution: as decided for its key,
        else planned within `budget` and kept. With delegation on, its own kernels decide first,
        and where they settle the layer (_settled) it runs them with no sweep; else its kernels
        are swept (_sweep). None: the budget ran out between two of its kernels (the next slice
        goes on)."""
        key = self.key(site)
        if key in self.decided:  # decided for another layer of the same call and rooms
            return self.decided[key]
        rooms = list(key[2])
        seen = self.moments.seen(site, rooms)
        own = (seen or [self._own_timing(site, kind) for kind in site.kinds]) if self.delegate else []
        groups = [[0], list(range(1, len(site.kinds)))] if seen and len(site.kinds) > 1 else [[i] for i in range(len(own))]
        delegated: bool | None
        if self.delegate and self._settled(site, own, rooms, groups):
            self.unswept.add(site.call)
            delegated = True
        else:
            delegated = self._sweep(site, own, rooms, groups, budget)
        if delegated is not None:
            self.decided[key] = delegated
        return delegated

    def _settled(self, site: Site, own: list[OwnTiming], rooms: list[int], groups: list[list[int]]) -> bool:
        """Whether the framework's own kernels settle the layer with no sweep (settled_by_own).
        With `auto`, a layer whose own kernels took long under pressure (pressed; torch's benchmark
        mode may have settled for a slow plan there) only where they ran about as fast as cuDNN's
        favourites, timed once at the whole batch (as_fast_as_favourites)."""
        call = site.call
        if not settled_by_own(own, rooms, lambda: all(self._favourite(call, kind) <= room
                                                      for kind, room in zip(site.kinds, rooms))):
            return False
        if not (self.kernels.auto and pressed(own)):
            return True
        return as_fast_as_favourites(own, [self._favourite_ms(call, kind) for kind in site.kinds], groups)

    def _sweep(self, site: Site, own: list[OwnTiming], rooms: list[int], groups: list[list[int]], budget: Slice) -> bool | None:
        """Plan the site's kernels; whether its layer runs the framework's own convolution after
        all (worth_delegating, on its own timings `own`; never with delegation off, where `own` is
        empty). Where the layer stays, a group of kernels timed together (`groups`) whose own
        kernels are faster runs those (own_kernels_faster). None where the budget ran out before
        one of its kernels, or between two rounds of its sweep (OutOfTime: the rounds measured are
        kept, and the next budget goes on from there)."""
        kernels = []
        for kind in site.kinds:
            planned = self.kernels.key(site, kind) in self.kernels.planned
            if not planned and budget.spent():
                return None
            try:
                kernels.append(self.kernels.site_kernel(site, kind))
            except OutOfTime:
                return None
            budget.worked |= not planned
        if not own or not all(k.via == UCUDNN for k in kernels):
            return False
        ucudnn_ms = [k.assignment.configuration.time_ms for k in kernels]
        if worth_delegating(ucudnn_ms, own, rooms):
            return True
        for i in own_kernels_faster(ucudnn_ms, own, rooms, groups):
            self.kernels.put_aside(site, site.kinds[i], kernels[i], own[i].ms)
        return False

    def _own_timing(self, site: Site, kind: ConvKind) -> OwnTiming:
        """The framework's own kernel as the database keeps it (stored_timing), else timed now and
        kept; with `auto` under the pressure of its moment (the bytes its room leaves free), as it
        runs there."""
        kernels, framework = self.kernels, self.kernels.framework
        call, room = site.call, kernels.room(site, kind)
        if (kind, call, room) not in self.own_timings:
            problem, assignments = call.problem(kind), kernels.handle(call.device).assignments
            candidate, free = framework.own_candidate(), room if kernels.auto else None
            with kernels.lock, framework.device_guard(call.device):
                timing = stored_timing(assignments, problem, framework.pool.free_bytes(call.device) if free is None else free,
                                       candidate)
                if timing is None:
                    # in a planning scope: its operands go back to the device afterwards rather than
                    # staying cached in odd sizes in the pool the step runs in
                    with framework.pool.planning_scope(call.device), kernels.working(kind, call, f"timing {framework.own}'s own"):
                        timing = framework.time_own(problem, call.device, free)
                        keep_timing(assignments, problem, timing, candidate)
                self.own_timings[kind, call, room] = timing
        return self.own_timings[kind, call, room]

    def _favourite(self, call: Call, kind: ConvKind) -> float:
        """The workspace of cuDNN's heuristic favourite for the kernel (Handle.favourite);
        infinite where it cannot run."""
        if (kind, call) not in self._favourites:
            kernels = self.kernels
            with kernels.lock, kernels.framework.device_guard(call.device), \
                    kernels.working(kind, call, "asking cuDNN's favourite of"):
                favourite = kernels.handle(call.device).favourite(call.problem(kind))
            self._favourites[kind, call] = favourite.workspace if favourite.status == OK else math.inf
        return self._favourites[kind, call]

    def _favourite_ms(self, call: Call, kind: ConvKind) -> float:
        """cuDNN's favourite for the kernel, run on the whole batch and timed (Handle.favourite_ms),
        once; inf where it cannot run."""
        if (kind, call) not in self.favourite_times:
            kernels, device = self.kernels, call.device
            with kernels.lock, kernels.framework.device_guard(device), kernels.framework.pool.planning_scope(device), \
                    kernels.working(kind, call, "timing cuDNN's favourite of"):
                self.favourite_times[kind, call] = kernels.handle(device).favourite_ms(call.problem(kind))
        return self.favourite_times[kind, call]

    def delegated(self) -> set[Key]:
        """The kernels, at their rooms, of the layers decided to run the framework's own convolution."""
        return {(kind, call, room) for (call, kinds, rooms), yes in self.decided.items() if yes
                for kind, room in zip(kinds, rooms)}

    def reset(self) -> None:
        """Forget every decision and timing (cuDNN's favourites stay)."""
        self.decided.clear()
        self.unswept.clear()
        self.own_timings.clear()
