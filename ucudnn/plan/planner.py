"""Planning a framework's convolution layers as they are called: what a framework integration
(ucudnn.integrations.torch) builds its layers on, with no framework in it.

A layer call is a `site`: its `call` (hashable; `.device` and `.problem(kind)`, the ConvProblem of
each kernel it runs), its `kinds` (F, BD, BF), the kernels planned for it (`kernels`, by kind),
whether it runs the framework's own convolution (`delegated`; None: not decided yet), whether its
calls may skip route() (`steady`, set by route: see Planner.steady) and, with
limits from the memory timeline (`auto`, ucudnn.plan.memory), the bytes free as each of its kernels
started (`free`, by kind: the least seen) and the calls it made waiting for its plan (`observed`). The
framework's side is a `framework` object (ucudnn.integrations.torch.kernels.TorchFramework): one
ucudnn.Handle per device, its own convolution (timed, and run where ucudnn does not), ucudnn's
kernels over its tensors, its memory, devices and streams.

The Planner decides per layer, on its first call or between iterations (settings.planning):
- WD: every kernel through ucudnn, in one workspace divided among them (`record`, `finalize`);
- WR with delegation on: the framework's own kernels are judged first, as they ran in the step
  (`observe`, `observed_end`) or else timed apart; where they settle the layer
  (delegation.settled_by_own) it runs them with no sweep; else ucudnn's candidates are swept and
  the layer runs the framework's convolution where ucudnn would not speed it up
  (delegation.worth_delegating), or group by group where the framework's is faster
  (delegation.own_kernels_faster);
- a kernel whose workspace cannot be had is planned again within less (`run`, `_shrink`); a data
  gradient run as a forward convolution goes back to its own BD kernel first.

Each kernel's workspace limit is the per-kernel setting, or with `auto` what its moment in the
step leaves free (ucudnn.plan.memory): a layer then runs the framework's convolution for
RECORDED_CALLS calls while its moments are observed (`observe`), the framework's own kernels are
judged as they ran there, and the same shape at two moments may get two plans.
"""
from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterator
from typing import Any, Protocol, runtime_checkable

from ..core.errors import DeviceMemoryError
from ..core.fallback import UNPLANNABLE, fall_back, say_once
from ..core.measurements import OK
from ..core.problem import ConvKind, ConvProblem
from ..core.progress import Progress
from ..core.transposition import as_forward, faster
from ..measure.cache import Cache
from .assignment import NO_MEMORY
from .config import Settings
from .delegation import (
    OwnTiming,
    as_fast_as_favourites,
    keep_timing,
    own_kernels_faster,
    pressed,
    settled_by_own,
    stored_timing,
    worth_delegating,
)
from .memory import (
    FLUSH_MS,
    RECORDED_CALLS,
    WATCHED_STEPS,
    FlushWatch,
    Memory,
    graph_budget,
    quantized,
    workspace_limit,
)
from .moments import Moments

UCUDNN = "ucudnn"  # how ucudnn's kernels count in Planner.runs: (UCUDNN, kind)
LAYER = "layer"  # (framework.own, LAYER): layer calls that ran the framework's own convolution
FLUSHED = "flushing the framework's cache to borrow"  # Planner._shrink's reason after a flush
PLANNING_SLICE_S = 1.0  # planning="between_iterations": planning at the start of an iteration, at most about this
Device = Any  # what a framework names a device by (hashable): its own type, torch.device for torch


@runtime_checkable
class Framework(Protocol):
    """What a framework integration gives the Planner (ucudnn.integrations.torch.kernels.TorchFramework
    for torch): a second framework implements this, and its layers call Planner.route and
    Planner.run. Devices are whatever the framework names them by (hashable)."""

    own: str  # the framework's name: its own convolution's kernels count as (own, kind) in runs
    cudnn_handles: dict  # device -> whose cuDNN handle its ucudnn.Handle runs on (for summary())

    def make_handle(self, settings: Settings, cache, device: Device) -> Any:
        """A ucudnn.Handle for `device` (assignment, favourite, program, shrink, finalize, reset)."""

    def kernel(self, problem: ConvProblem, handle, assignment) -> Any:
        """A callable kernel(x, w, y) running `assignment` on the framework's tensors, into the
        one it writes (problem.written), with `via` == UCUDNN, `counted`, `problem` and
        `assignment`; DeviceMemoryError where its workspace cannot be had."""

    def own_kernel(self, problem: ConvProblem) -> Any:
        """A callable kernel(x, w, y) running the framework's own convolution (`via` == own),
        returning what it writes: into the written operand where one is given, else a tensor
        of its own."""

    def result_for(self, problem: ConvProblem, like: Any) -> Any:
        """A new tensor for what `problem`'s kernel writes, like `like` (dtype, device)."""

    def flushes(self, device: Device) -> int:
        """How often the framework's allocator has given its whole cache back to serve an allocation."""

    def grown(self, device: Device) -> int:
        """How often the framework's allocator has taken memory from the device (allocated, or pages mapped)."""

    def time_own(self, problem: ConvProblem, device: Device, free: int | None = None) -> OwnTiming:
        """The framework's own convolution of `problem` timed on new operands; with `free`, with
        only that many bytes free beyond its result (the rest held while it runs)."""

    def own_candidate(self) -> str:
        """The database's name of the framework's own convolution ('torch:2.11.0+cu130')."""

    def device_guard(self, device: Device) -> contextlib.AbstractContextManager:
        """Inside, `device` is the current device."""

    def planning(self, device: Device) -> contextlib.AbstractContextManager:
        """Inside, planning's device memory comes from the framework; on the way out of the
        outermost such scope what it cached goes back to the device."""

    def settled_memory(self, device: Device) -> Memory:
        """The device's free memory and the bytes tensors hold, the framework's cache given back."""

    def free_bytes(self, device: Device) -> int:
        """What the framework could allocate now in one block, at the least."""

    def outside_bytes(self, device: Device) -> int:
        """What the process holds on the device outside the framework's pool (code, handles)."""

    def synchronize(self, device: Device) -> None:
        """Wait for the device's work."""

    def release(self, device: Device) -> int:
        """Give back what ucudnn holds beside the framework's pool that it can make again (CUDA
        graphs, cached blocks), and the framework's cached blocks; the graphs' bytes."""

    def bound_beside(self, nbytes: int | None) -> None:
        """What ucudnn may hold beside the framework's pool in CUDA graphs from now on (None: unbounded)."""

    def mark(self, device: Device, hold_s: float = 0.0) -> Any:
        """A point in the device's work queued so far (a recorded CUDA event); with `hold_s`, the
        device is first kept busy about that long, so that what the host queues next runs back
        to back after the mark rather than at the host's pace."""

    def elapsed_ms(self, start: Any, end: Any) -> float:
        """The device's milliseconds between two marks, once both are reached (waiting for them)."""

    def transposed_weights(self, w: Any, groups: int, layout: str) -> Any:
        """A new tensor of the weights `w` (K, C/groups, *kernel) with K and C swapped per group,
        (C, K/groups, *kernel), and the kernel flipped, stored in `layout`, the kernel's
        (ucudnn.core.transposition)."""


def _assigned(handle, problem: ConvProblem):
    """Planner._planned's first plan of a kernel: the handle's assignment."""
    return handle.assignment(problem)


def _within(limit: int) -> Callable[[Any, ConvProblem], Any]:
    """Planner._planned's first plan of a kernel at one moment: within `limit` bytes."""
    return lambda handle, problem: handle.within(problem, limit)


class Planner:
    """The kernels planned for a framework's layer calls, by call, kind and limit, on one
    ucudnn.Handle per device; `auto`: each kernel's limit from what its moment in the step
    leaves free (ucudnn.plan.memory), else the settings' per-kernel limit. `runs` counts kernel calls
    by (via, kind) and delegated layer calls by (framework.own, LAYER)."""

    def __init__(self, settings: Settings, framework: Framework, cache: Cache | None = None, delegate: bool = True,
                 auto: bool = False) -> None:
        self.settings, self.framework, self.delegate, self.auto = settings, framework, delegate, auto
        self._cache = cache
        self._handles: dict[Hashable, Any] = {}
        # (kind, call, room) -> its kernel, its framework's own timing (_room: with `auto` by moment)
        self._kernels: dict[tuple[ConvKind, Hashable, int], Any] = {}
        self._own_timings: dict[tuple[ConvKind, Hashable, int], OwnTiming] = {}
        self._moments = Moments(framework)  # what the observed calls saw (with `auto`)
        self._favourites: dict[tuple[ConvKind, Hashable], float] = {}  # the workspace of cuDNN's favourite, asked once
        self._favourite_times: dict[tuple[ConvKind, Hashable], float] = {}  # ... and its time, where a layer is pressed
        self._delegated: dict[tuple[Hashable, tuple[ConvKind, ...], tuple[int, ...]], bool] = {}  # (call, kinds, rooms)
        # (kind, call, room) -> ucudnn's kernel that the framework's own, faster, replaced, and the own's ms
        self._set_aside: dict[tuple[ConvKind, Hashable, int], tuple[Any, float]] = {}
        self._watch = FlushWatch()  # which steps' runs are watched for flushes (_watching)
        self._flushed_kernels: dict[tuple, None] = {}  # (site, kind, kernel) that flushed, weighed as a step starts
        self._lock = threading.RLock()
        self.runs: Counter = Counter()
        self._delegated_run = (framework.own, LAYER)
        self.progress = Progress(self.settings.progress)
        self._planning_s: Counter = Counter()  # (kind, call) -> seconds spent planning it, own timing included
        self._unswept: set[Hashable] = set()  # delegated with no sweep (delegation.settled_by_own)
        # planning="between_iterations": the sites running the framework's convolution until
        # planned (an ordered set); planned from the start of an iteration (the first site's call) on
        self._pending: dict[Any, None] = {}
        self._lead: Any = None
        self._slice = _Slice(math.inf)  # plan_pending's budget while it runs; outside it, none
        self._stand_ins: dict[tuple[ConvKind, Hashable], Any] = {}  # what a site waiting for its plan runs
        self._rescues: set = set()  # kernels _rescued made: where their workspace cannot be had, none
        self.pressed = False  # whether the device has run out of memory in a kernel (_release)
        self._graphs_bounded: bool | None = None  # with `auto`: False while planning, True once graph_budget is set

    @property
    def wd(self) -> bool:
        return self.settings.optimizing.divides

    def run(self, site, kind: ConvKind, x, w, y) -> Any:
        """Run kernel `kind` of the site's call on x, w, y and return what it wrote: F writes y,
        BD x, BF w. The written operand may be None: the framework's own kernel then makes its
        result itself (no second tensor of its size at that moment), ucudnn's gets a new one.
        A site waiting for its plan runs the framework's own kernel (_stand_in). Where memory
        runs out (_out_of_memory), a smaller kernel runs; so it does where borrowing a workspace
        flushed the framework's cache (_run)."""
        if site in self._pending:  # counted as its layer's call (route)
            kernel = self._stand_in(site, kind)
        else:
            kernel = site.kernels.get(kind)
            if kernel is None:
                kernel = self._site_kernel(site, kind)
            elif self.progress.open:
                self.progress.idle(self._planned_so_far)
            self.runs[kernel.counted] += 1
        with self.framework.device_guard(site.call.device):
            released = self.pressed  # what ucudnn held beside the pool went back already
            while True:
                try:
                    return self._run(site, kind, kernel, x, w, y)
                except DeviceMemoryError as exc:
                    if not released and not _borrows(kernel):
                        released = self._release(site.call.device, exc)
                    else:
                        kernel = self._out_of_memory(site, kind, kernel, exc)

    def _stand_in(self, site, kind: ConvKind):
        """The kernel a site waiting for its plan runs: the framework's own, or where that ran out
        of memory, ucudnn's within what was free (_rescued); one per call and kind."""
        key = kind, site.call
        if key not in self._stand_ins:
            self._stand_ins[key] = self.framework.own_kernel(site.call.problem(kind))
        return self._stand_ins[key]

    def _release(self, device: Hashable, exc: DeviceMemoryError) -> bool:
        """Memory ran out with no workspace to shrink: what ucudnn holds beside the framework's
        pool (CUDA graphs, cached blocks) goes back, and no graph is captured from then on."""
        held = self.framework.release(device)
        self.framework.bound_beside(0)
        self.pressed = True
        say_once(f"ucudnn: {exc}; gave back {held / 2**20:.1f} MiB of CUDA graphs and the cached blocks, "
                 "and runs every kernel directly from now on")
        return True

    def _out_of_memory(self, site, kind: ConvKind, failed, exc: DeviceMemoryError):
        """The kernel that runs after `failed` ran out of memory (what ucudnn held beside the pool
        already given back, _release): a planned kernel of ucudnn's within less (_shrink); else
        ucudnn's kernel within what is free, chosen by cuDNN's heuristic with nothing timed
        (_rescued). `exc` where no smaller kernel exists: the zero-workspace kernel itself
        cannot run."""
        waiting = site in self._pending
        if _borrows(failed) and not waiting and failed not in self._rescues:
            return self._shrink(site, kind, failed)
        if failed.via == UCUDNN and not failed.assignment.workspace_size:
            raise exc
        limit = 0 if failed.via == UCUDNN else workspace_limit(self.framework.settled_memory(site.call.device).free)
        kernel = self._rescued(site.call, kind, limit, exc)
        if waiting:
            self._stand_ins[kind, site.call] = kernel
        else:
            key = kind, site.call, self._room(site, kind)
            if self._kernels.get(key) is site.kernels.get(kind):
                self._kernels[key] = kernel
            site.kernels[kind] = kernel
        return kernel

    def _rescued(self, call, kind: ConvKind, limit: int, exc: DeviceMemoryError):
        """ucudnn's kernel of the call undivided, on cuDNN's heuristic favourite within `limit`
        bytes of workspace (Handle.heuristic): nothing timed; `exc` where none runs there."""
        problem = call.problem(kind)
        try:
            assignment = self.handle(call.device).heuristic(problem, limit)
        except UNPLANNABLE:
            raise exc from None
        say_once(f"ucudnn: {exc}; {problem.describe()} runs on cuDNN's heuristic favourite within "
                 f"{limit / 2**20:.1f} MiB from now on")
        kernel = self.framework.kernel(problem, self.handle(call.device), assignment)
        self._rescues.add(kernel)
        return kernel

    def _run(self, site, kind: ConvKind, kernel, x, w, y) -> Any:
        """One run of `kernel`, watched for flushes of the framework's cache in the steps the
        FlushWatch opens (_watching, _flushed)."""
        operands, written, ours = [x, w, y], kernel.problem.written, kernel.via == UCUDNN
        if ours and operands[written] is None:  # made before the watch: only borrowing the workspace counts
            operands[written] = self.framework.result_for(kernel.problem, x if x is not None else y)
        watched = self._watching(site, kind, kernel)
        before = self.framework.flushes(site.call.device) if watched else 0
        result = kernel(*operands)
        if watched and self.framework.flushes(site.call.device) > before:
            self._flushed(site, kind, kernel)
        return operands[written] if ours else result

    def _watching(self, site, kind: ConvKind, kernel) -> bool:
        """Whether this run of `kernel` at the site's moment is watched for flushes (_run): in a
        step the FlushWatch opens (with `auto`, once no layer waits for a plan: planning gives the
        framework's cache back between its slices, so the pool a step runs in is not yet the
        steady one), a ucudnn kernel that borrows a workspace, or the framework's own kernel put
        in place of ucudnn's plan (_set_aside), unless kept; kernels shared by sites run at
        moments that differ."""
        if not self._watch.open or self._pending:
            return False
        if kernel.via == UCUDNN and not kernel.assignment.workspace_size:
            return False
        if kernel.via != UCUDNN and not (self._set_aside and (kind, site.call, self._room(site, kind)) in self._set_aside):
            return False
        return (site, kind, kernel) not in self._watch.kept

    def _flushed(self, site, kind: ConvKind, kernel) -> None:
        """A watched run of `kernel` flushed the framework's cache. The framework's own kernel
        gives way to ucudnn's plan it was put in place of where that plan is predicted to take
        less than its own time plus a flush (FLUSH_MS, ucudnn.plan.memory), else it stays and is
        watched no more; ucudnn's kernel is weighed as the next step starts (_weigh_flushed)."""
        if kernel.via == UCUDNN:
            self._flushed_kernels[site, kind, kernel] = None
            self._lead.steady = False  # the lead's next call starts the step that weighs it
        elif not self._instead_of_own(site, kind):
            self._watch.kept.add((site, kind, kernel))

    def _weigh_flushed(self) -> None:
        """ucudnn's kernels that flushed in the last step, weighed as this one starts, when the
        step's activations are gone and sizes the kernel's sweep did not need can be measured
        (in the middle of the step its moment leaves little free, and the sizes at hand within
        half gave wav2vec2's kernels plans up to 4 ms slower: docs/results-archive.md, "The flush
        watch by step"): planned within less (_shrink) where the plan within half is predicted to
        take at most FLUSH_MS longer, else kept as planned and watched no more. Oldest first, for
        about PLANNING_SLICE_S (at least one); the rest wait for the next step. One planning scope
        a device (_scopes)."""
        budget = _Slice(time.perf_counter() + PLANNING_SLICE_S)
        with self._scopes() as planning:
            while self._flushed_kernels and not budget.spent():
                site, kind, kernel = key = next(iter(self._flushed_kernels))
                del self._flushed_kernels[key]
                if site.kernels.get(kind) is not kernel:  # another site's flush shrank it already
                    continue
                planning(site.call.device)
                if not isinstance(kernel, _AsForward) and self._half_slower_ms(site.call, kernel) > FLUSH_MS:
                    self._watch.kept.add(key)
                else:
                    self._shrink(site, kind, kernel, flushed=True)
                budget.worked = True

    def _instead_of_own(self, site, kind: ConvKind) -> bool:
        """Put ucudnn's plan back in place of the framework's own kernel (_flushed); whether it is
        (another site may have put it back already)."""
        key = kind, site.call, self._room(site, kind)
        with self._lock:
            if key in self._set_aside:
                planned, own_ms = self._set_aside[key]
                if planned.assignment.configuration.time_ms - own_ms >= FLUSH_MS:
                    return False
                self._kernels[key] = planned
                del self._set_aside[key]
            site.kernels[kind] = self._kernels[key]
            return site.kernels[kind].via == UCUDNN

    def _half_slower_ms(self, call, kernel) -> float:
        """How much longer the kernel's plan within half its workspace is predicted to take
        (inf where none is left)."""
        try:
            half = self.handle(call.device).within(kernel.problem, kernel.assignment.workspace_size // 2)
        except UNPLANNABLE:
            return math.inf
        return half.configuration.time_ms - kernel.assignment.configuration.time_ms

    def _shrink(self, site, kind: ConvKind, failed, flushed: bool = False):
        """The kernel planned for the site after `failed` could not borrow its workspace (or,
        `flushed`, could only by flushing the framework's cache). A data gradient run as a forward convolution
        (_AsForward) goes back to the BD kernel it replaced, as planned: nothing shrinks. Else the
        kernel is planned within the bytes the device has free once the framework's cached
        blocks went back (cached blocks in odd sizes cannot give one workspace; not asked after
        a flush, which giving them back would repeat), or half (Assignments.shrink, from its own
        plan's workspace; another site may have shrunk it already), and where no plan is left,
        the framework's own convolution."""
        call, key = site.call, (kind, site.call, self._room(site, kind))
        with self._lock:
            kernel: Any = self._kernels.get(key)  # the framework's kernel, or None
            if kernel is failed and isinstance(failed, _AsForward):
                kernel = self._kernels[key] = failed.backward
            elif kernel is failed:
                available = None if flushed else self.framework.settled_memory(call.device).free
                why = FLUSHED if flushed else NO_MEMORY
                plan = failed.assignment if self.auto else None
                with self.framework.planning(call.device):
                    kernel = self._kernels[key] = self._planned(
                        call, kind, lambda handle, problem: handle.shrink(problem, available, plan, why))
            site.kernels[kind] = kernel
            return kernel

    def route(self, site) -> bool:
        """Route a call of the site's layer: True where it runs the framework's own convolution.
        Its first call plans it (the decision, and the sweep where one is needed), or with planning
        'between_iterations' queues it; the lead site's call (_leads) starts an iteration, and
        layers waiting for a plan get PLANNING_SLICE_S of planning there, and once none waits the
        FlushWatch learns that a step starts."""
        if site is self._lead:
            self._starts_step(site)
        delegated = site.delegated
        if delegated is None:
            if self._leads(site):
                self._lead = site
            delegated = self._decide(site)
            if site not in self._pending:
                site.delegated = delegated
            elif self.auto:
                site.observed += 1  # calls waiting; the first RECORDED_CALLS are observed (observing)
                if site.observed <= RECORDED_CALLS:
                    self.observe(site, site.kinds[:1])
        elif self.progress.open:
            self.progress.idle(self._planned_so_far)
        if delegated:
            self.runs[self._delegated_run] += 1
        site.steady = self.steady(site)
        return delegated

    def _starts_step(self, lead) -> None:
        """An iteration starts at the lead site's call: planning where layers wait, else the
        kernels that flushed in the last step weighed, and the flush watch's step (with `auto`,
        until it is spent)."""
        if self._pending:
            self.plan_pending(PLANNING_SLICE_S)
        if self._pending:
            return
        if self.auto and self._graphs_bounded is False and not self.pressed:
            self._graphs_bounded = True
            self.framework.bound_beside(graph_budget([room for _, _, rooms in self._delegated for room in rooms]))
        if self._flushed_kernels:
            self._weigh_flushed()
        if self.auto:  # read after weighing: its measuring may flush
            self._watch.step(lambda: self.framework.flushes(lead.call.device))

    def _leads(self, site) -> bool:
        """Whether a new site's calls start iterations from now on: the first site, or the first
        with backward kernels where the lead has none (a validation pass run before training,
        as PyTorch Lightning's sanity check does, would else start planning only at the next one)."""
        lead = self._lead
        return lead is None or (len(lead.kinds) == 1 and len(site.kinds) > 1)

    def steady(self, site) -> bool:
        """Whether the site's calls may skip route() while their signature holds: decided as
        delegated, where route() has nothing else to do (no stretch of planning to close, and not
        the first site, whose calls start planning, while layers wait for a plan). A layer then
        runs the framework's own convolution at once, counting the call in `runs` itself; _wait
        and a reset of the sites take the flag back. The lead's calls start steps (_starts_step)."""
        return site.delegated is True and not self.progress.open and not (site is self._lead and self._lead_has_work())

    def waits(self, site) -> bool:
        """Whether `site` waits for its plan (planning 'between_iterations'): its layer runs the
        framework's own kernels through run(), which runs ucudnn's where they run out of memory."""
        return site in self._pending

    def is_lead(self, site) -> bool:
        """Whether `site` is the lead: the site whose calls start iterations (_leads)."""
        return site is self._lead

    def _lead_has_work(self) -> bool:
        """Whether the lead site's calls have work as a step starts: layers wait for a plan, or
        the flush watch follows steps."""
        return bool(self._pending or self._flushed_kernels) or (self.auto and not self._watch.spent)

    def settle(self, site) -> bool:
        """Decide the site's layer now, whatever settings.planning says: True where it runs the
        framework's own convolution. A decided layer keeps its decision; else it is planned as
        on its first call with planning 'first_call' (with `auto`, within the moments observed so
        far, else what is free now). What a traced graph holds: it is decided once, when traced."""
        if site.delegated is None:
            if self.wd or not self.delegate:
                site.delegated = False
            else:
                key = self._layer_key(site)
                if key not in self._delegated:
                    self._delegated[key] = self._decided(site)
                site.delegated = self._delegated[key]
            self._pending.pop(site, None)
            self._moments.forget(site)
        return site.delegated

    def _decide(self, site) -> bool:
        """Whether the site's layer runs the framework's own convolution, decided on its first call:
        - WD: never (one workspace divided among ucudnn's kernels);
        - with planning 'between_iterations', its own until plan_pending() plans the layer, so
          that the first iteration runs as the framework's own would, with nothing timed;
        - else the layer is planned now (_planned_layer)."""
        if self.wd:
            return False
        deferred = self.settings.planning == "between_iterations"
        if not deferred and not self.delegate:
            return False
        if site in self._pending:
            return True
        if deferred and site.observed < self._observations:
            self._wait(site)
            return True
        key = self._layer_key(site)
        if key not in self._delegated:
            if deferred:
                self._wait(site)
                return True
            self._delegated[key] = self._decided(site)
        return self._delegated[key]

    def _wait(self, site) -> None:
        """Queue the site for plan_pending(); the first site's calls route again, to start it.
        With `auto`, CUDA graphs hold nothing new until planning is done and graph_budget is known."""
        self._pending[site] = None
        self._lead.steady = False
        if self.auto and not self.pressed and self._graphs_bounded is not False:
            self._graphs_bounded = False
            self.framework.bound_beside(0)

    def observing(self, site) -> bool:
        """Whether this call's moments are observed: with `auto`, in the first RECORDED_CALLS calls
        of a site that runs the framework's own convolution waiting for its plan (the layer then
        calls observe() as its backward starts). Later calls change no room, so that a layer
        whose planning spans several slices is planned for the moments it started with."""
        return site.delegated is None and self.auto and site in self._pending and site.observed <= RECORDED_CALLS

    def observe(self, site, kinds: tuple[ConvKind, ...]) -> None:
        """The site's `kinds` start now (Moments.start: their rooms, their windows open)."""
        self._moments.start(site, kinds)

    def observed_end(self, site, kinds: tuple[ConvKind, ...]) -> None:
        """The site's `kinds`, observed as they started (observe), have ended now."""
        self._moments.end(site, kinds)

    @property
    def _observations(self) -> int:
        """Calls of a layer observed before it is planned: RECORDED_CALLS with `auto`, else none."""
        return RECORDED_CALLS if self.auto else 0

    def _room(self, site, kind: ConvKind) -> int:
        """The bytes the kernel's own workspace may take: the per-kernel limit, or with `auto`
        what its moment leaves free beside its output (on ucudnn.plan.memory's grid). A kernel planned
        unobserved (planning 'first_call', a traced graph) takes what is free when first asked,
        kept as its moment, so that its plan, timing and decision are made for one room."""
        if not self.auto:
            return self.settings.workspace_limit
        if kind not in site.free:
            site.free[kind] = self.framework.free_bytes(site.call.device) - site.call.problem(kind).written_bytes()
        return quantized(site.free[kind])

    def _layer_key(self, site) -> tuple:
        """What a layer's decision depends on: its call, kernels and their rooms."""
        return site.call, site.kinds, tuple(self._room(site, kind) for kind in site.kinds)

    def _decided(self, site) -> bool:
        """_planned_layer outside plan_pending, where no slice runs out: whether the layer runs the
        framework's own convolution."""
        delegated = self._planned_layer(site)
        assert delegated is not None  # only plan_pending's slice runs out
        return delegated

    def _planned_layer(self, site) -> bool | None:
        """Plan the site's layer; whether it runs the framework's own convolution. With delegation
        on, its own kernels decide first, as they ran in the step (Moments.seen) or else timed
        now, and where they settle the layer (_settled) it runs them with no sweep; else its
        kernels are swept and weighed against the same timings. None: plan_pending's slice ran out
        between two of its kernels (the next slice goes on)."""
        rooms = [self._room(site, kind) for kind in site.kinds]
        seen = self._moments.seen(site, rooms)
        own = (seen or [self._own_timing(site, kind) for kind in site.kinds]) if self.delegate else []
        groups = [[0], list(range(1, len(site.kinds)))] if seen and len(site.kinds) > 1 else [[i] for i in range(len(own))]
        if self.delegate and self._settled(site, own, rooms, groups):
            self._unswept.add(site.call)
            return True
        return self._swept(site, own, rooms, groups)

    def _settled(self, site, own: list[OwnTiming], rooms: list[int], groups: list[list[int]]) -> bool:
        """Whether the framework's own kernels settle the layer with no sweep
        (delegation.settled_by_own). With `auto`, a layer whose own kernels took long under
        pressure (delegation.pressed; torch's benchmark mode may have settled for a slow plan
        there) only where they ran about as fast as cuDNN's favourites, timed once at the whole
        batch (delegation.as_fast_as_favourites)."""
        call = site.call
        if not settled_by_own(own, rooms, lambda: all(self._favourite(call, kind) <= room
                                                      for kind, room in zip(site.kinds, rooms))):
            return False
        if not (self.auto and pressed(own)):
            return True
        return as_fast_as_favourites(own, [self._favourite_ms(call, kind) for kind in site.kinds], groups)

    def _swept(self, site, own: list[OwnTiming], rooms: list[int], groups: list[list[int]]) -> bool | None:
        """Plan the site's kernels; whether its layer runs the framework's own convolution after
        all (delegation.worth_delegating, on its own timings `own`; never with delegation off,
        where `own` is empty). Where the layer stays, a group of kernels timed together (`groups`)
        whose own kernels are faster runs those (delegation.own_kernels_faster). None where
        plan_pending's slice ran out before one of its kernels."""
        kernels = []
        for kind in site.kinds:
            if (kind, site.call, self._room(site, kind)) not in self._kernels and self._slice.spent():
                return None
            kernels.append(self._site_kernel(site, kind))
        if not own or not all(k.via == UCUDNN for k in kernels):
            return False
        ucudnn_ms = [k.assignment.configuration.time_ms for k in kernels]
        if worth_delegating(ucudnn_ms, own, rooms):
            return True
        for i in own_kernels_faster(ucudnn_ms, own, rooms, groups):
            kind, room = site.kinds[i], rooms[i]
            self._set_aside[kind, site.call, room] = kernels[i], own[i].ms
            self._kernels[kind, site.call, room] = site.kernels[kind] = self.framework.own_kernel(kernels[i].problem)
        return False

    def plan_pending(self, budget_s: float | None = None) -> int:
        """Plan the layers waiting for a plan (planning='between_iterations'), oldest first, until
        `budget_s` seconds have gone (None: all of them), checked between kernels: each call plans
        something (a kernel, or a layer decided) either way, and a sweep is never cut. With `auto`
        only layers observed RECORDED_CALLS times are planned. A layer runs as planned from its
        next call once all its kernels are. Returns how many layers still wait. Between
        iterations only."""
        self._slice = _Slice(math.inf if budget_s is None else time.perf_counter() + budget_s)
        try:
            with self._scopes() as planning:
                for site in [s for s in self._pending if s.observed >= self._observations]:
                    if self._slice.spent():
                        break
                    planning(site.call.device)
                    if not self._planned_pending(site):
                        break
                    self._slice.worked = True
        finally:
            self._slice = _Slice(math.inf)
        return len(self._pending)

    def _planned_pending(self, site) -> bool:
        """Plan one waiting layer (plan_pending); whether it is planned (False: the slice ran out
        between two of its kernels)."""
        self._moments.lessen(site)
        key = self._layer_key(site)
        delegated: bool | None
        if key in self._delegated:  # decided for another layer of the same call and rooms
            delegated = self._delegated[key]
        else:
            delegated = self._planned_layer(site)
        if delegated is None:
            return False
        self._moments.forget(site)
        self._delegated[key] = delegated
        del self._pending[site]
        site.delegated = None
        return True

    @contextlib.contextmanager
    def _scopes(self) -> Iterator[Callable[[Hashable], None]]:
        """One planning scope a device (Framework.planning) for a stretch of planning, entered by
        the function yielded as the stretch first meets the device, all left at its end: the
        framework's cache is given back once a stretch, not after every kernel."""
        with contextlib.ExitStack() as stack:
            devices: set = set()

            def planning(device: Hashable) -> None:
                if device not in devices:
                    devices.add(device)
                    stack.enter_context(self.framework.planning(device))
            yield planning

    def _own_timing(self, site, kind: ConvKind) -> OwnTiming:
        """The framework's own kernel as the database keeps it (delegation.stored_timing), else
        timed now and kept; with `auto` under the pressure of its moment (the bytes its room
        leaves free), as it runs there."""
        call, room = site.call, self._room(site, kind)
        if (kind, call, room) not in self._own_timings:
            problem, assignments = call.problem(kind), self.handle(call.device).assignments
            candidate, free = self.framework.own_candidate(), room if self.auto else None
            with self._lock, self.framework.device_guard(call.device):
                timing = stored_timing(assignments, problem, self.framework.free_bytes(call.device) if free is None else free,
                                       candidate)
                if timing is None:
                    # in the planning scope: its operands (~190 MiB for AlexNet's conv2) go back to the
                    # device afterwards rather than staying cached in odd sizes in the pool the step runs in
                    with self.framework.planning(call.device), self._planning(kind, call, f"timing {self.framework.own}'s own"):
                        timing = self.framework.time_own(problem, call.device, free)
                        keep_timing(assignments, problem, timing, candidate)
                self._own_timings[kind, call, room] = timing
        return self._own_timings[kind, call, room]

    def _favourite(self, call, kind: ConvKind) -> float:
        """The workspace of cuDNN's heuristic favourite for the kernel (Handle.favourite);
        infinite where it cannot run."""
        if (kind, call) not in self._favourites:
            with self._lock, self.framework.device_guard(call.device), self._planning(kind, call, "asking cuDNN's favourite of"):
                favourite = self.handle(call.device).favourite(call.problem(kind))
            self._favourites[kind, call] = favourite.workspace if favourite.status == OK else math.inf
        return self._favourites[kind, call]

    def _favourite_ms(self, call, kind: ConvKind) -> float:
        """cuDNN's favourite for the kernel, run on the whole batch and timed (Handle.favourite_ms),
        once; inf where it cannot run."""
        if (kind, call) not in self._favourite_times:
            with self._lock, self.framework.device_guard(call.device), self.framework.planning(call.device), \
                    self._planning(kind, call, "timing cuDNN's favourite of"):
                self._favourite_times[kind, call] = self.handle(call.device).favourite_ms(call.problem(kind))
        return self._favourite_times[kind, call]

    @contextlib.contextmanager
    def _planning(self, kind: ConvKind, call, doing: str) -> Iterator[None]:
        """A planning step of the kernel: shown by the progress line, its seconds kept for summary()."""
        self.progress.step(f"{doing} {_brief(call.problem(kind))}", self._planned_so_far())
        started = time.perf_counter()
        try:
            yield
        finally:
            # typeshed's Counter counts in ints, Python's in any number
            self._planning_s[kind, call] += time.perf_counter() - started  # type: ignore[assignment]
            self.progress.finished()

    def _planned_so_far(self) -> str:
        delegated = sum(self._delegated.values())
        return (f"{len(self._kernels)} kernels planned, {delegated} layers left to {self.framework.own}'s own "
                f"convolution ({len(self._unswept)} with no sweep)")

    def _site_kernel(self, site, kind: ConvKind):
        room = self._room(site, kind)
        kernel = site.kernels[kind] = self._kernels.get((kind, site.call, room)) or self._kernel(site.call, kind, room)
        return kernel

    def _kernel(self, call, kind: ConvKind, room: int):
        """The call's kernel for a workspace `room` (_room), made once: the handle's assignment,
        or with `auto` a plan within the room less the margin (ucudnn.plan.memory.workspace_limit)."""
        key, limit = (kind, call, room), workspace_limit(room) if self.auto else None
        with self._lock, self.framework.device_guard(call.device):
            if key not in self._kernels:
                with self.framework.planning(call.device), self._planning(kind, call, "timing ucudnn's candidates of"):
                    kernel = self._planned(call, kind, _assigned if limit is None else _within(limit))
                    if kind is ConvKind.BACKWARD_DATA and self.settings.bd_as_forward and not self.wd:
                        kernel = self._as_forward(call, kernel, limit)
                    self._kernels[key] = kernel
                self._slice.worked = True
            return self._kernels[key]

    def _as_forward(self, call, backward, limit: int | None):
        """The call's data gradient as a forward convolution of dy (ucudnn.core.transposition), where
        one exists and its plan is faster than `backward`'s, the BD kernel planned; else `backward`.
        WR only: WD divides its total among the kernels it solved, and a forward convolution
        planned after the solve would be one outside that division."""
        problem = as_forward(call.problem(ConvKind.BACKWARD_DATA))
        if problem is None or backward.via != UCUDNN:
            return backward
        handle = self.handle(call.device)
        try:
            assignment = handle.assignment(problem) if limit is None else handle.within(problem, limit)
            if not faster(assignment.configuration.time_ms, backward.assignment.configuration.time_ms):
                return backward
            forward = self.framework.kernel(problem, handle, assignment)
        except UNPLANNABLE:  # no plan of the forward convolution: BD's own stands, nothing falls back
            return backward
        return _AsForward(backward, forward, self.framework.transposed_weights)

    def _planned(self, call, kind: ConvKind, assign: Callable[[Any, ConvProblem], Any]):
        """The kernel as `assign(handle, problem)` plans it (_assigned, or a shrink after its
        workspace could not be borrowed); the framework's own convolution where ucudnn cannot plan it."""
        problem, handle = call.problem(kind), self.handle(call.device)
        try:
            return self.framework.kernel(problem, handle, assign(handle, problem))
        except UNPLANNABLE as exc:
            fall_back(self.framework.own, f"{problem.describe()}: {exc}")
            return self.framework.own_kernel(problem)

    def handle(self, device: Hashable) -> Any:
        """The ucudnn.Handle of `device`, made on first use."""
        with self._lock:
            if device not in self._handles:
                if self._cache is None:
                    self._cache = Cache(self.settings.cache_path)
                with self.framework.device_guard(device):
                    self._handles[device] = self.framework.make_handle(self.settings, self._cache, device)
            return self._handles[device]

    def record(self, call, kinds: tuple[ConvKind, ...]) -> None:
        """Learn kernels ahead of their first run: WD records them for the solve, WR plans
        (benchmarks) them now."""
        for kind in kinds:
            if self.wd:
                with self.framework.device_guard(call.device):
                    self.handle(call.device).query(call.problem(kind))
            elif not self.auto:  # with `auto`, a kernel's limit is known once its moments are
                self._kernel(call, kind, self.settings.workspace_limit)

    def finalize(self) -> None:
        """WD: solve every recorded kernel as one network now."""
        with self._lock:
            for device, handle in self._handles.items():
                with self.framework.device_guard(device), self.framework.planning(device):
                    handle.finalize()

    def reset(self) -> None:
        """Forget every assignment: kernels are planned again on next use (WD: as one network).
        Waits for the GPUs first, since running kernels may still use the old workspaces."""
        with self._lock:
            for device, handle in self._handles.items():
                self.framework.synchronize(device)
                handle.reset()
            self._kernels.clear()
            self._delegated.clear()
            self._unswept.clear()
            self._pending.clear()
            self._own_timings.clear()
            self._moments = Moments(self.framework)
            self._set_aside.clear()
            self._watch = FlushWatch()
            self._flushed_kernels.clear()
            self._stand_ins.clear()
            self._lead = None

    def solved(self) -> bool:
        """WD: whether a handle holds a solve of the network."""
        return any(h.wd_result is not None for h in self._handles.values())

    def summary(self) -> dict:
        """Settings, every kernel planned, timed or seen in the step: its configuration and
        workspace, or the framework's own (delegated, `swept` False where no sweep was needed), and
        the seconds its planning took; calls and (WD) the solve: what benchmarks report."""
        s = self.settings
        delegated = {(kind, call, room) for (call, kinds, rooms), yes in self._delegated.items() if yes
                     for kind, room in zip(kinds, rooms)}
        keys = dict.fromkeys([*self._kernels, *self._own_timings, *self._moments.in_step_ms])
        out: dict[str, Any] = dict(optimizer=s.optimizer, policy=s.policy, search=s.search,
                   workspace_limit="auto" if self.auto else s.workspace_limit, delegate=self.delegate,
                   planning_s=sum(self._planning_s.values()), planning=s.planning, pending=len(self._pending),
                   kernels=[self._describe(kind, call, room, (kind, call, room) in delegated) for kind, call, room in keys],
                   runs={f"{via}:{kind}": n for (via, kind), n in self.runs.items()})
        if self.wd:
            out["wd"] = [dict(total_limit=h.wd_limit, total_workspace=r.total_workspace,
                              variables=r.variables, solve_seconds=r.solve_seconds, solver=r.solver)
                         for h in self._handles.values() if (r := h.wd_result) is not None]
        out["cudnn_handles"] = dict(self.framework.cudnn_handles)  # device -> whose handle: the framework's, or why not
        out["shrinks"] = [dict(kernel=s.what, failed=s.failed, limit=s.limit, why=s.why)
                          for h in self._handles.values() for s in h.shrinks]
        if self.auto:
            out["flush_watch"] = dict(steps=min(self._watch.steps, WATCHED_STEPS), watched=self._watch.watched,
                                      kept=[kernel.problem.describe() for _, _, kernel in self._watch.kept])
        return out

    def _describe(self, kind: ConvKind, call, room: int, delegated: bool) -> dict:
        """One kernel at one room (_room) for summary(): how it runs, its configuration and,
        where timed, the framework's own kernel (`delegated`: its layer runs that; no kernel: nor
        was it swept); with `auto` the room and ucudnn's limit within it."""
        kernel, own = self._kernels.get((kind, call, room)), self._own_timings.get((kind, call, room))
        out = dict(kind=kind.value, kernel=call.problem(kind).describe(),
                   via=self.framework.own if delegated or kernel is None else kernel.via, delegated=delegated,
                   swept=kernel is not None, planning_s=self._planning_s[kind, call])
        if self.auto:
            out.update(room=room, limit=workspace_limit(room))
        if own is not None:
            out.update(own_ms=own.ms, own_workspace=own.workspace)
        if (kind, call, room) in self._moments.in_step_ms:  # its group's time in the step, and its site's windows
            out["in_step_ms"] = self._moments.in_step_ms[kind, call, room]
            out["in_step_windows"] = [list(w) for w in self._moments.in_step_windows[kind, call, room]]  # ms, flushes, grown
        if (kind, call) in self._favourite_times:  # cuDNN's favourite, timed where its layer was pressed
            out["favourite_ms"] = self._favourite_times[kind, call]
        if kernel is not None and kernel.via == UCUDNN:
            configuration = kernel.assignment.configuration
            if isinstance(kernel, _AsForward):
                out["as_forward"] = kernel.inner.problem.describe()
            out.update(configuration=configuration.describe(),
                       parts=len(configuration.micro), workspace=kernel.assignment.workspace_size,
                       predicted_ms=configuration.time_ms)
        return out


def _borrows(kernel) -> bool:
    """Whether `kernel` is ucudnn's and borrows a workspace at each call (one it may do without),
    or runs a data gradient as a forward convolution (whose BD kernel may run instead)."""
    return kernel.via == UCUDNN and (bool(kernel.assignment.workspace_size) or isinstance(kernel, _AsForward))


class _AsForward:
    """A data gradient run as the forward convolution `inner` (of dy, into dx, with the weights
    transposed by `transposed(w, groups, layout)`; ucudnn.core.transposition): a BD kernel to the Planner.
    `backward` is the BD kernel it replaced, which runs instead where `inner` cannot borrow its
    workspace (Planner._shrink)."""

    via = UCUDNN

    def __init__(self, backward, inner, transposed: Callable[[Any, int, str], Any]):
        self.problem, self.backward, self.inner, self._transposed = backward.problem, backward, inner, transposed
        self.assignment = inner.assignment
        self.counted = (UCUDNN, self.problem.kind.value)

    def __call__(self, x, w, y) -> None:  # BD: x is dx (written), y is dy
        self.inner(y, self._transposed(w, self.problem.groups, self.problem.layout), x)


class _Slice:
    """plan_pending's budget: spent once its deadline has passed and something was planned in it
    (a kernel, or a layer decided), so that every slice makes progress; a deadline of math.inf
    is never spent."""

    def __init__(self, deadline: float):
        self.deadline, self.worked = deadline, False

    def spent(self) -> bool:
        return self.worked and time.perf_counter() >= self.deadline


def _brief(problem: ConvProblem) -> str:
    """A kernel in a few words, for the progress line: 'BF x=(32, 64, 56, 56) w=(64, 64, 3, 3) float16'."""
    return f"{problem.kind.value} x={problem.x_shape} w={problem.w_shape} {problem.dtype}"
