"""Kernels whose runs flushed the framework's cache (ucudnn.plan.memory: a flush costs a step more
than a smaller plan, up to FLUSH_MS): watched in the steps the FlushWatch opens once no layer
waits for its plan, and planned within less, or put back to the framework's own kernel's place,
as the next step starts."""
from __future__ import annotations

from collections.abc import Callable

from ..core.budget import Slice
from ..core.problem import ConvKind
from .framework import PLANNING_SLICE_S, UCUDNN, Framework, Site, scopes
from .kernels import AsForward, Kernels
from .memory import FLUSH_MS, FlushWatch
from .pending import Pending


class Flushes:
    """The flush watch of a planner's kernels: which steps are watched (`watch`), and the
    (site, kind, kernel) of ucudnn's that flushed in the last one (`flushed`), weighed as the
    next starts (weigh)."""

    def __init__(self, framework: Framework, kernels: Kernels, pending: Pending) -> None:
        self.framework, self.kernels, self.pending = framework, kernels, pending
        self.watch = FlushWatch()
        self.flushed: dict[tuple, None] = {}

    def watching(self, site: Site, kind: ConvKind, kernel) -> bool:
        """Whether this run of `kernel` at the site's moment is watched for flushes: in a step the
        FlushWatch opens (with `auto`, once no layer waits for a plan: planning gives the
        framework's cache back between its slices, so the pool a step runs in is not yet the
        steady one), a ucudnn kernel that borrows a workspace, or the framework's own kernel put
        in place of ucudnn's plan (Kernels.set_aside), unless kept; kernels shared by sites run at
        moments that differ."""
        if not self.watch.open or len(self.pending):
            return False
        if kernel.via == UCUDNN and not kernel.assignment.workspace_size:
            return False
        set_aside = self.kernels.set_aside
        if kernel.via != UCUDNN and not (set_aside and self.kernels.key(site, kind) in set_aside):
            return False
        return (site, kind, kernel) not in self.watch.kept

    def saw_flush(self, site: Site, kind: ConvKind, kernel) -> None:
        """A watched run of `kernel` flushed the framework's cache. The framework's own kernel
        gives way to ucudnn's plan it was put in place of where that plan is predicted to take
        less than its own time plus a flush (Kernels.put_back), else it stays and is watched no
        more; ucudnn's kernel is weighed as the next step starts (weigh)."""
        if kernel.via == UCUDNN:
            self.flushed[site, kind, kernel] = None
            self.pending.lead.steady = False  # the lead's next call starts the step that weighs it
        elif not self.kernels.put_back(site, kind, FLUSH_MS):
            self.watch.kept.add((site, kind, kernel))

    def weigh(self) -> None:
        """ucudnn's kernels that flushed in the last step, weighed as this one starts, when the
        step's activations are gone and sizes the kernel's sweep did not need can be measured
        (in the middle of the step its moment leaves little free, and the sizes at hand there gave
        slower plans: docs/results-archive.md, "The flush watch by step"): planned within less
        (Kernels.shrink) where the plan within half is predicted to take at most FLUSH_MS longer,
        else kept as planned and watched no more. Oldest first, for about PLANNING_SLICE_S (at
        least one); the rest wait for the next step. One planning scope a device (scopes)."""
        budget = Slice.lasting(PLANNING_SLICE_S)
        with scopes(self.framework) as enter:
            while self.flushed and not budget.spent():
                site, kind, kernel = key = next(iter(self.flushed))
                del self.flushed[key]
                if site.kernels.get(kind) is not kernel:  # another site's flush shrank it already
                    continue
                enter(site.call.device)
                if not isinstance(kernel, AsForward) and self.kernels.half_slower_ms(site.call, kernel) > FLUSH_MS:
                    self.watch.kept.add(key)
                else:
                    self.kernels.shrink(site, kind, kernel, flushed=True)
                budget.worked = True

    def step(self, flushes: Callable[[], int]) -> None:
        """A step starts (FlushWatch.step); `flushes()` reads the framework's count."""
        self.watch.step(flushes)

    def reset(self) -> None:
        self.watch = FlushWatch()
        self.flushed.clear()
