"""The kernels planned for a framework's layer calls, by (kind, call, room), on one Engine
(ucudnn.Handle) a device, and the seconds each kernel's planning took.

A kernel's `room` is the bytes its workspace may take: the per-kernel limit, or with `auto` what
its moment in the step leaves free beside its output (ucudnn.plan.memory), kept per site and
kind so that its plan, timing and decision are made for one room. A kernel that cannot borrow its
workspace is planned again within less (`shrink`); one whose framework kernel ran out of memory
gets cuDNN's heuristic favourite within what is free (`rescued`). A data gradient may run as a
forward convolution of dy (`AsForward`, ucudnn.core.transposition)."""
from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterator
from typing import Any

from ..core.errors import DeviceMemoryError
from ..core.fallback import UNPLANNABLE, fall_back, say_once
from ..core.problem import ConvKind, ConvProblem
from ..core.progress import Progress
from ..core.transposition import as_forward, faster
from ..measure.cache import Cache
from .assignment import NO_MEMORY
from .config import Settings
from .framework import UCUDNN, Call, Engine, Framework, Site
from .memory import quantized, workspace_limit

FLUSHED = "flushing the framework's cache to borrow"  # shrink's reason after a flush
Key = tuple[ConvKind, Hashable, int]  # (kind, call, room): one kernel at one room


class Kernels:
    """The planned kernels (`planned`, by Key), ucudnn's plans the framework's own kernels
    replaced (`set_aside`: the plan and the own kernel's ms), the seconds planning each (kind,
    call) took (`seconds`, timings of the framework's own kernels included: working()); one Engine
    a device (`handles`). `progress` shows each planning step, with `so_far()` after it."""

    def __init__(self, settings: Settings, framework: Framework, cache: Cache | None, progress: Progress,
                 so_far: Callable[[], str]) -> None:
        self.settings, self.framework, self.progress, self.so_far = settings, framework, progress, so_far
        self.auto = settings.auto
        self._cache = cache
        self.handles: dict[Hashable, Engine] = {}
        self.planned: dict[Key, Any] = {}
        self.set_aside: dict[Key, tuple[Any, float]] = {}
        self.seconds: Counter = Counter()
        self.rescues: set = set()  # kernels rescued() made: where their workspace cannot be had, none
        self.lock = threading.RLock()

    def room(self, site: Site, kind: ConvKind) -> int:
        """The bytes the kernel's own workspace may take: the per-kernel limit, or with `auto`
        what its moment leaves free beside its output (on ucudnn.plan.memory's grid). A kernel
        planned unobserved (planning 'first_call', a traced graph) takes what is free when first
        asked, kept as its moment, so that its plan, timing and decision are made for one room."""
        if not self.auto:
            return self.settings.workspace_limit
        if kind not in site.free:
            site.free[kind] = self.framework.pool.free_bytes(site.call.device) - site.call.problem(kind).written_bytes()
        return quantized(site.free[kind])

    def key(self, site: Site, kind: ConvKind) -> Key:
        return kind, site.call, self.room(site, kind)

    def handle(self, device: Hashable) -> Engine:
        """The Engine (ucudnn.Handle) of `device`, made on first use."""
        with self.lock:
            if device not in self.handles:
                if self._cache is None:
                    self._cache = Cache(self.settings.cache_path)
                with self.framework.device_guard(device):
                    self.handles[device] = self.framework.make_handle(self.settings, self._cache, device)
            return self.handles[device]

    def site_kernel(self, site: Site, kind: ConvKind):
        """The site's kernel of `kind` at its room, planned where it is not yet (kernel())."""
        room = self.room(site, kind)
        kernel = site.kernels[kind] = self.planned.get((kind, site.call, room)) or self.kernel(site.call, kind, room)
        return kernel

    def kernel(self, call: Call, kind: ConvKind, room: int):
        """The call's kernel for a workspace `room`, made once: the handle's assignment, or with
        `auto` a plan within the room less the margin (ucudnn.plan.memory.workspace_limit)."""
        key, limit = (kind, call, room), workspace_limit(room) if self.auto else None
        with self.lock, self.framework.device_guard(call.device):
            if key not in self.planned:
                with self.framework.pool.planning_scope(call.device), self.working(kind, call, "timing ucudnn's candidates of"):
                    kernel = self._plan(call, kind, _assigned if limit is None else _within(limit))
                    if kind is ConvKind.BACKWARD_DATA and self.settings.bd_as_forward and not self.settings.optimizing.divides:
                        kernel = self._as_forward(call, kernel, limit)
                    self.planned[key] = kernel
            return self.planned[key]

    def _as_forward(self, call: Call, backward, limit: int | None):
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
        return AsForward(backward, forward, self.framework.transposed_weights)

    def _plan(self, call: Call, kind: ConvKind, assign: Callable[[Engine, ConvProblem], Any]):
        """The kernel as `assign(handle, problem)` plans it (_assigned, _within, or a shrink after
        its workspace could not be borrowed); the framework's own convolution where ucudnn cannot
        plan it."""
        problem, handle = call.problem(kind), self.handle(call.device)
        try:
            return self.framework.kernel(problem, handle, assign(handle, problem))
        except UNPLANNABLE as exc:
            fall_back(self.framework.own, f"{problem.describe()}: {exc}")
            return self.framework.own_kernel(problem)

    @contextlib.contextmanager
    def working(self, kind: ConvKind, call, doing: str) -> Iterator[None]:
        """A planning step of the kernel: shown by the progress line, its seconds kept."""
        self.progress.step(f"{doing} {_brief(call.problem(kind))}", self.so_far())
        started = time.perf_counter()
        try:
            yield
        finally:
            # typeshed's Counter counts in ints, Python's in any number
            self.seconds[kind, call] += time.perf_counter() - started  # type: ignore[assignment]
            self.progress.finished()

    def shrink(self, site: Site, kind: ConvKind, failed, flushed: bool = False):
        """The kernel planned for the site after `failed` could not borrow its workspace (or,
        `flushed`, could only by flushing the framework's cache). A data gradient run as a forward
        convolution (AsForward) goes back to the BD kernel it replaced, as planned: nothing shrinks.
        Else the kernel is planned within the bytes the device has free once the framework's cached
        blocks went back (cached blocks in odd sizes cannot give one workspace; not asked after
        a flush, which giving them back would repeat), or half (Assignments.shrink, from its own
        plan's workspace; another site may have shrunk it already), and where no plan is left,
        the framework's own convolution."""
        call, key = site.call, self.key(site, kind)
        with self.lock:
            kernel: Any = self.planned.get(key)  # the framework's kernel, or None
            if kernel is failed and isinstance(failed, AsForward):
                kernel = self.planned[key] = failed.backward
            elif kernel is failed:
                available = None if flushed else self.framework.pool.settled_memory(call.device).free
                why = FLUSHED if flushed else NO_MEMORY
                plan = failed.assignment if self.auto else None
                with self.framework.pool.planning_scope(call.device):
                    kernel = self.planned[key] = self._plan(
                        call, kind, lambda handle, problem: handle.shrink(problem, available, plan, why))
            site.kernels[kind] = kernel
            return kernel

    def half_slower_ms(self, call: Call, kernel) -> float:
        """How much longer the kernel's plan within half its workspace is predicted to take
        (inf where none is left)."""
        try:
            half = self.handle(call.device).within(kernel.problem, kernel.assignment.workspace_size // 2)
        except UNPLANNABLE:
            return math.inf
        return half.configuration.time_ms - kernel.assignment.configuration.time_ms

    def rescued(self, call: Call, kind: ConvKind, limit: int, exc: DeviceMemoryError):
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
        self.rescues.add(kernel)
        return kernel

    def replace(self, site: Site, kind: ConvKind, kernel) -> None:
        """`kernel` runs for the site's `kind` from now on, and for every site sharing its plan."""
        key = self.key(site, kind)
        if self.planned.get(key) is site.kernels.get(kind):
            self.planned[key] = kernel
        site.kernels[kind] = kernel

    def put_aside(self, site: Site, kind: ConvKind, planned, own_ms: float) -> None:
        """The framework's own kernel runs in place of ucudnn's `planned`, faster at `own_ms`."""
        key = self.key(site, kind)
        self.set_aside[key] = planned, own_ms
        self.planned[key] = site.kernels[kind] = self.framework.own_kernel(planned.problem)

    def put_back(self, site: Site, kind: ConvKind, flush_ms: float) -> bool:
        """Put ucudnn's plan set aside for the framework's own kernel back, where it is predicted to
        take less than the own kernel's time plus `flush_ms`; whether the site runs ucudnn's
        (another site may have put it back already)."""
        key = self.key(site, kind)
        with self.lock:
            if key in self.set_aside:
                planned, own_ms = self.set_aside[key]
                if planned.assignment.configuration.time_ms - own_ms >= flush_ms:
                    return False
                self.planned[key] = planned
                del self.set_aside[key]
            site.kernels[kind] = self.planned[key]
            return site.kernels[kind].via == UCUDNN

    def reset(self) -> None:
        """Forget every plan (the handles forget theirs: Planner.reset)."""
        self.planned.clear()
        self.set_aside.clear()


def borrows(kernel) -> bool:
    """Whether `kernel` is ucudnn's and borrows a workspace at each call (one it may do without),
    or runs a data gradient as a forward convolution (whose BD kernel may run instead)."""
    return kernel.via == UCUDNN and (bool(kernel.assignment.workspace_size) or isinstance(kernel, AsForward))


class AsForward:
    """A data gradient run as the forward convolution `inner` (of dy, into dx, with the weights
    transposed by `transposed(w, groups, layout)`; ucudnn.core.transposition): a BD kernel to the Planner.
    `backward` is the BD kernel it replaced, which runs instead where `inner` cannot borrow its
    workspace (Kernels.shrink)."""

    via = UCUDNN

    def __init__(self, backward, inner, transposed: Callable[[Any, int, str], Any]):
        self.problem, self.backward, self.inner, self._transposed = backward.problem, backward, inner, transposed
        self.assignment = inner.assignment
        self.counted = (UCUDNN, self.problem.kind.value)

    def __call__(self, x, w, y) -> None:  # BD: x is dx (written), y is dy
        self.inner(y, self._transposed(w, self.problem.groups, self.problem.layout), x)


def _assigned(handle: Engine, problem: ConvProblem):
    """Kernels.kernel's first plan of a kernel: the handle's assignment."""
    return handle.assignment(problem)


def _within(limit: int) -> Callable[[Engine, ConvProblem], Any]:
    """Kernels.kernel's first plan of a kernel at one moment: within `limit` bytes."""
    return lambda handle, problem: handle.within(problem, limit)


def _brief(problem: ConvProblem) -> str:
    """A kernel in a few words, for the progress line: 'BF x=(32, 64, 56, 56) w=(64, 64, 3, 3) float16'."""
    return f"{problem.kind.value} x={problem.x_shape} w={problem.w_shape} {problem.dtype}"
