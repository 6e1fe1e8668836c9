"""A layer's observed calls, with limits from the memory timeline (ucudnn.plan.memory): the room
each of its kernels' moments left, and the framework's own kernels as they ran there
(InStep), judged on the least time any layer of the same call took. The Planner
observes through `Moments` while a layer waits for its plan and judges the layer on what it saw."""
from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, NamedTuple

from ..core.problem import ConvKind
from .framework import Call, OwnTiming, Site


class AllocatorCounts(NamedTuple):
    """What the framework's allocator has done so far (Pool.flushes, Pool.grown): how
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
# would time the host, and short kernels would be swept for it (docs/results-archive.md, "Six
# models"). The hold outlasts a window's host time (a mark, torch's dispatch, an autograd node).
IN_STEP_HOLD_S = 0.5e-3


class InStep:
    """A layer's own kernels as they ran in its observed calls (ucudnn.plan.memory): per group of
    kernels (the forward kernel; the backward kernels together, one autograd node), the marks
    (Framework.mark) where it started, after holding the device (IN_STEP_HOLD_S), and
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


Key = tuple[ConvKind, Hashable, int]  # (kind, call, room), as the Planner keys kernels


class Moments:
    """What the observed calls of the layers waiting for a plan saw, on `framework`
    (framework.Framework): the least room of each kernel (on the site: `site.free`), the windows
    of its own kernels, and what the process held outside the framework's pool at the latest
    observation of each device. `in_step_ms` and `in_step_windows` keep, per (kind, call, room),
    what a layer was judged on, for ucudnn.reports.summary."""

    def __init__(self, framework) -> None:
        self.framework = framework
        self.reset()

    def reset(self) -> None:
        """Forget every observation."""
        self._in_step: dict[Any, InStep] = {}  # site -> its own kernels' marks in its observed calls
        self._least: dict[tuple[Hashable, tuple], float] = {}  # (call, kinds) -> least ms of any of its sites
        self._outside_seen: dict[Hashable, int] = {}  # device -> Pool.outside_bytes at its latest start()
        self._lessened: set = set()  # sites whose rooms were lessened as their planning began (lessen)
        self.in_step_ms: dict[Key, float] = {}
        self.in_step_windows: dict[Key, list[Window]] = {}  # the site's own windows

    def start(self, site: Site, kinds: tuple[ConvKind, ...]) -> None:
        """The site's `kinds` start now: each one's room is what the framework could allocate
        less what those kernels write (their outputs, made before they run), the least seen kept;
        their window opens (the allocator's counts read before the mark: no host time inside the window)."""
        call = site.call
        room = self.framework.pool.free_bytes(call.device) - sum(call.problem(k).written_bytes() for k in kinds)
        for kind in kinds:
            site.free[kind] = min(site.free.get(kind, room), room)
        self._outside_seen[call.device] = self.framework.pool.outside_bytes(call.device)
        counts = self._counts(call.device)
        self._in_step.setdefault(site, InStep()).start(kinds, self.framework.mark(call.device, IN_STEP_HOLD_S), counts)

    def end(self, site: Site, kinds: tuple[ConvKind, ...]) -> None:
        """The site's `kinds`, observed as they started (start), have ended now."""
        if site in self._in_step:
            mark = self.framework.mark(site.call.device)
            self._in_step[site].end(kinds, mark, self._counts(site.call.device))

    def lessen(self, site: Site) -> None:
        """Once, as an observed site's planning begins: its rooms less what the process came to
        hold outside the framework's pool since the latest observation on its device (planning
        loads cuDNN's handle and the code of every kernel it times: a process that plans holds more
        there than torch's own, docs/results-archive.md, "Torch's kernels judged as they ran in
        the step"), which the step's moments no longer have free."""
        device = site.call.device
        if site in self._lessened or device not in self._outside_seen:
            return
        self._lessened.add(site)
        grown = max(0, self.framework.pool.outside_bytes(device) - self._outside_seen[device])
        for kind in site.free:
            site.free[kind] -= grown

    def seen(self, site: Site, rooms: Sequence[int]) -> list[OwnTiming]:
        """The site's own kernels as they ran in its observed calls: per kind (at its room in
        `rooms`, in site.kinds' order) its share of its group's least time (the forward kernel;
        the backward kernels together), within its room, since it ran there; kept for summary().
        The framework runs one plan for a call wherever its sites are (torch's benchmark mode
        keeps a plan per problem, not per moment), so a group's time is the least any site of the
        call took (_least_of_call): one window can hold a stall of the host's (r3d_18's first
        64-channel layer's forward took several times its steady time in its own window:
        docs/results.md, "Forty steps"). [] where a group was not seen whole (no backward
        ran in the observed calls) or a mark cannot be read: then they are timed apart."""
        windows, room_of = self._windows(site), dict(zip(site.kinds, rooms))
        groups = self._least_of_call(site, least(windows))
        for kinds, ms in groups.items():
            for kind in kinds:
                self.in_step_ms[kind, site.call, room_of[kind]] = ms
                self.in_step_windows[kind, site.call, room_of[kind]] = windows.get(kinds, [])
        shares = {kind: ms / len(kinds) for kinds, ms in groups.items() for kind in kinds}
        if set(shares) != set(site.kinds):
            return []
        return [OwnTiming(shares[kind], 0, room) for kind, room in zip(site.kinds, rooms)]

    def forget(self, site: Site) -> None:
        """The site is decided: its windows are no longer needed (the least of its call stays)."""
        self._in_step.pop(site, None)

    def _least_of_call(self, site: Site, own: dict[tuple, float]) -> dict[tuple, float]:
        """Per group of kinds the site saw whole in its observed calls (`own`: its least windows),
        the least time of that group over the sites of its call seen so far (those waiting now,
        and those decided before)."""
        for other in self._in_step:
            if other is not site and other.call == site.call:
                self._keep_least(other.call, least(self._windows(other)))
        self._keep_least(site.call, own)
        return {kinds: self._least[site.call, kinds] for kinds in own}

    def _counts(self, device: Hashable) -> AllocatorCounts:
        return AllocatorCounts(self.framework.pool.flushes(device), self.framework.pool.grown(device))

    def _windows(self, site: Site) -> dict[tuple, list[Window]]:
        """The site's windows per group of kinds (InStep.each); none where a mark cannot be read."""
        in_step = self._in_step.get(site)
        try:
            return {} if in_step is None else in_step.each(self.framework.elapsed_ms)
        except RuntimeError:  # a mark the device never reached
            return {}

    def _keep_least(self, call: Call, groups: dict[tuple, float]) -> None:
        for kinds, ms in groups.items():
            self._least[call, kinds] = min(self._least.get((call, kinds), ms), ms)
