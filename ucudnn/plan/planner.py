"""Planning a framework's convolution layers as they are called: what a framework integration
(ucudnn.integrations.torch) builds its layers on, with no framework in it.

A layer call is a `site`: its `call` (hashable; `.device` and `.problem(kind)`, the ConvProblem of
each kernel it runs), its `kinds` (F, BD, BF), the kernels planned for it (`kernels`, by kind),
whether it runs the framework's own convolution (`delegated`; None: not decided yet), whether its
calls may skip route() (`steady`, set by route: see Planner.steady) and, with limits from the
memory timeline (`auto`, ucudnn.plan.memory), the bytes free as each of its kernels started
(`free`, by kind: the least seen) and the calls it made waiting for its plan (`observed`). The
framework's side is a `Framework` (ucudnn.plan.framework; for torch,
ucudnn.integrations.torch.kernels.TorchFramework): one Engine (ucudnn.Handle) per device, its own
convolution (timed, and run where ucudnn does not), ucudnn's kernels over its tensors, its
memory, devices and streams.

The Planner decides per layer, on its first call or between iterations (settings.planning), and
runs each kernel call. Its collaborators each own their state:
- `kernels` (plan/kernels.py): the kernels planned by (kind, call, room), shrunk within less
  where a workspace cannot be had, rescued on cuDNN's heuristic where memory ran out;
- `delegation` (plan/delegation.py): whether a layer runs the framework's own convolution, on the
  framework's own kernels as they ran in the step (`moments`, plan/moments.py) or timed apart,
  and ucudnn's swept kernels;
- `pending` (plan/pending.py): the layers waiting for their plan, planned in slices as iterations
  start, and the lead site whose calls start them;
- `flushes` (plan/flushes.py): kernels whose runs flushed the framework's cache, weighed as the
  next step starts.
WD records every kernel and solves them as one network (`record`, `finalize`).

What a framework's integration calls, and nothing else: route, run, settle, waits, observing,
observe, observed_end, is_lead, record, finalize, solved, reset, plan_pending, handle, and `runs`,
`pressed`, `wd`, `settings` (docs/architecture.md).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from typing import Any

from ..core.errors import DeviceMemoryError
from ..core.fallback import say_once
from ..core.problem import ConvKind
from ..core.progress import Progress
from ..measure.cache import Cache
from .config import Settings
from .delegation import Delegation
from .flushes import Flushes
from .framework import LAYER, PLANNING_SLICE_S, UCUDNN, Call, Engine, Framework, Site
from .kernels import Kernels, borrows
from .memory import RECORDED_CALLS, graph_budget, workspace_limit
from .moments import Moments
from .pending import Pending


class Planner:
    """The kernels run for a framework's layer calls, planned on one Engine per device; `auto`:
    each kernel's limit from what its moment in the step leaves free (ucudnn.plan.memory), else
    the settings' per-kernel limit. `runs` counts kernel calls by (via, kind) and delegated layer
    calls by (framework.own, LAYER); `pressed`: whether the device ran out of memory in a kernel."""

    def __init__(self, settings: Settings, framework: Framework, cache: Cache | None = None) -> None:
        self.settings, self.framework = settings, framework
        self.auto, self.delegate = settings.auto, settings.delegate
        self.runs: Counter = Counter()
        self._delegated_run = (framework.own, LAYER)
        self.progress = Progress(settings.progress)
        self.moments = Moments(framework)  # what the observed calls saw (with `auto`)
        self.kernels = Kernels(settings, framework, cache, self.progress, self._so_far)
        self.delegation = Delegation(self.kernels, self.moments)
        self.pending = Pending(framework, self.delegation, self.moments, RECORDED_CALLS if self.auto else 0)
        self.flushes = Flushes(framework, self.kernels, self.pending)
        self.pressed = False
        self._graphs_bounded: bool | None = None  # with `auto`: False while planning, True once graph_budget is set

    @property
    def wd(self) -> bool:
        return self.settings.optimizing.divides

    def run(self, site: Site, kind: ConvKind, x, w, y) -> Any:
        """Run kernel `kind` of the site's call on x, w, y and return what it wrote: F writes y,
        BD x, BF w. The written operand may be None: the framework's own kernel then makes its
        result itself (no second tensor of its size at that moment), ucudnn's gets a new one.
        A site waiting for its plan runs the framework's own kernel (Pending.stand_in). Where
        memory runs out, a smaller kernel runs (_out_of_memory); so it does where borrowing a
        workspace flushed the framework's cache (_run, Flushes)."""
        if site in self.pending:  # counted as its layer's call (route)
            kernel = self.pending.stand_in(site, kind)
        else:
            kernel = site.kernels.get(kind)
            if kernel is None:
                kernel = self.kernels.site_kernel(site, kind)
            elif self.progress.open:
                self.progress.idle(self._so_far)
            self.runs[kernel.counted] += 1
        with self.framework.device_guard(site.call.device):
            released = self.pressed  # what ucudnn held beside the pool went back already
            while True:
                try:
                    return self._run(site, kind, kernel, x, w, y)
                except DeviceMemoryError as exc:
                    if not released and not borrows(kernel):
                        released = self._release(site.call.device, exc)
                    else:
                        kernel = self._out_of_memory(site, kind, kernel, exc)

    def _run(self, site: Site, kind: ConvKind, kernel, x, w, y) -> Any:
        """One run of `kernel`, watched for flushes of the framework's cache where the flush
        watch says so (Flushes.watching)."""
        operands, written, ours = [x, w, y], kernel.problem.written, kernel.via == UCUDNN
        if ours and operands[written] is None:  # made before the watch: only borrowing the workspace counts
            operands[written] = self.framework.result_for(kernel.problem, x if x is not None else y)
        watched = self.flushes.watching(site, kind, kernel)
        before = self.framework.pool.flushes(site.call.device) if watched else 0
        result = kernel(*operands)
        if watched and self.framework.pool.flushes(site.call.device) > before:
            self.flushes.saw_flush(site, kind, kernel)
        return operands[written] if ours else result

    def _release(self, device: Hashable, exc: DeviceMemoryError) -> bool:
        """Memory ran out with no workspace to shrink: what ucudnn holds beside the framework's
        pool (CUDA graphs, cached blocks) goes back, and no graph is captured from then on."""
        held = self.framework.pool.release(device)
        self.framework.pool.bound_beside(0)
        self.pressed = True
        say_once(f"ucudnn: {exc}; gave back {held / 2**20:.1f} MiB of CUDA graphs and the cached blocks, "
                 "and runs every kernel directly from now on")
        return True

    def _out_of_memory(self, site: Site, kind: ConvKind, failed, exc: DeviceMemoryError):
        """The kernel that runs after `failed` ran out of memory (what ucudnn held beside the pool
        already given back, _release): a planned kernel of ucudnn's within less (Kernels.shrink);
        else ucudnn's kernel within what is free, chosen by cuDNN's heuristic with nothing timed
        (Kernels.rescued). `exc` where no smaller kernel exists: the zero-workspace kernel itself
        cannot run."""
        waiting = site in self.pending
        if borrows(failed) and not waiting and failed not in self.kernels.rescues:
            return self.kernels.shrink(site, kind, failed)
        if failed.via == UCUDNN and not failed.assignment.workspace_size:
            raise exc
        limit = 0 if failed.via == UCUDNN else workspace_limit(self.framework.pool.settled_memory(site.call.device).free)
        kernel = self.kernels.rescued(site.call, kind, limit, exc)
        if waiting:
            self.pending.rescue(site, kind, kernel)
        else:
            self.kernels.replace(site, kind, kernel)
        return kernel

    def route(self, site: Site) -> bool:
        """Route a call of the site's layer: True where it runs the framework's own convolution.
        Its first call plans it (the decision, and the sweep where one is needed), or with planning
        'between_iterations' queues it; the lead site's call (Pending.leads) starts an iteration,
        and layers waiting for a plan get PLANNING_SLICE_S of planning there, and once none waits
        the flush watch learns that a step starts."""
        if site is self.pending.lead:
            self._starts_step(site)
        delegated = site.delegated
        if delegated is None:
            if self.pending.leads(site):
                self.pending.lead = site
            delegated = self._decide(site)
            if site not in self.pending:
                site.delegated = delegated
            elif self.auto:
                site.observed += 1  # calls waiting; the first RECORDED_CALLS are observed (observing)
                if site.observed <= RECORDED_CALLS:
                    self.observe(site, site.kinds[:1])
        elif self.progress.open:
            self.progress.idle(self._so_far)
        if delegated:
            self.runs[self._delegated_run] += 1
        site.steady = self.steady(site)
        return delegated

    def _starts_step(self, lead: Site) -> None:
        """An iteration starts at the lead site's call: planning where layers wait, else the
        CUDA graphs' budget set once (with `auto`), the kernels that flushed in the last step
        weighed, and the flush watch's step (with `auto`, until it is spent)."""
        if len(self.pending):
            self.plan_pending(PLANNING_SLICE_S)
        if len(self.pending):
            return
        if self.auto and self._graphs_bounded is False and not self.pressed:
            self._graphs_bounded = True
            self.framework.pool.bound_beside(graph_budget([room for _, _, rooms in self.delegation.decided for room in rooms]))
        if self.flushes.flushed:
            self.flushes.weigh()
        if self.auto:  # read after weighing: its measuring may flush
            self.flushes.step(lambda: self.framework.pool.flushes(lead.call.device))

    def steady(self, site: Site) -> bool:
        """Whether the site's calls may skip route() while their signature holds: decided as
        delegated, where route() has nothing else to do (no stretch of planning to close, and not
        the lead site, whose calls start planning, while it has work: _lead_has_work). A layer
        then runs the framework's own convolution at once, counting the call in `runs` itself;
        _wait and a reset of the sites take the flag back."""
        return site.delegated is True and not self.progress.open and not (site is self.pending.lead and self._lead_has_work())

    def waits(self, site: Site) -> bool:
        """Whether `site` waits for its plan (planning 'between_iterations'): its layer runs the
        framework's own kernels through run(), which runs ucudnn's where they run out of memory."""
        return site in self.pending

    def is_lead(self, site: Site) -> bool:
        """Whether `site` is the lead: the site whose calls start iterations (Pending.leads)."""
        return site is self.pending.lead

    def _lead_has_work(self) -> bool:
        """Whether the lead site's calls have work as a step starts: layers wait for a plan, or
        the flush watch follows steps."""
        return bool(len(self.pending) or self.flushes.flushed) or (self.auto and not self.flushes.watch.spent)

    def settle(self, site: Site) -> bool:
        """Decide the site's layer now, whatever settings.planning says: True where it runs the
        framework's own convolution. A decided layer keeps its decision; else it is planned as
        on its first call with planning 'first_call' (with `auto`, within the moments observed so
        far, else what is free now). What a traced graph holds: it is decided once, when traced."""
        if site.delegated is None:
            site.delegated = False if self.wd or not self.delegate else self.delegation.decide(site)
            self.pending.drop(site)
            self.moments.forget(site)
        return site.delegated

    def _decide(self, site: Site) -> bool:
        """Whether the site's layer runs the framework's own convolution, decided on its first call:
        - WD: never (one workspace divided among ucudnn's kernels);
        - with planning 'between_iterations', its own until plan_pending() plans the layer, so
          that the first iteration runs as the framework's own would, with nothing timed;
        - else the layer is planned now (Delegation.decide)."""
        if self.wd:
            return False
        deferred = self.settings.planning == "between_iterations"
        if not deferred and not self.delegate:
            return False
        if site in self.pending:
            return True
        if deferred and (site.observed < self.pending.observations or self.delegation.key(site) not in self.delegation.decided):
            self._wait(site)
            return True
        return self.delegation.decide(site)

    def _wait(self, site: Site) -> None:
        """Queue the site for plan_pending(). With `auto`, CUDA graphs hold nothing new until
        planning is done and graph_budget is known."""
        self.pending.wait(site)
        if self.auto and not self.pressed and self._graphs_bounded is not False:
            self._graphs_bounded = False
            self.framework.pool.bound_beside(0)

    def observing(self, site: Site) -> bool:
        """Whether this call's moments are observed: with `auto`, in the first RECORDED_CALLS calls
        of a site that runs the framework's own convolution waiting for its plan (the layer then
        calls observe() as its backward starts). Later calls change no room, so that a layer
        whose planning spans several slices is planned for the moments it started with."""
        return site.delegated is None and self.auto and site in self.pending and site.observed <= RECORDED_CALLS

    def observe(self, site: Site, kinds: tuple[ConvKind, ...]) -> None:
        """The site's `kinds` start now (Moments.start: their rooms, their windows open)."""
        self.moments.start(site, kinds)

    def observed_end(self, site: Site, kinds: tuple[ConvKind, ...]) -> None:
        """The site's `kinds`, observed as they started (observe), have ended now."""
        self.moments.end(site, kinds)

    def plan_pending(self, budget_s: float | None = None) -> int:
        """Plan the layers waiting for a plan for about `budget_s` seconds (None: all of them,
        Pending.plan); how many still wait. Between iterations only."""
        return self.pending.plan(budget_s)

    def handle(self, device: Hashable) -> Engine:
        """The Engine (ucudnn.Handle) of `device`, made on first use."""
        return self.kernels.handle(device)

    def record(self, call: Call, kinds: tuple[ConvKind, ...]) -> None:
        """Learn kernels ahead of their first run: WD records them for the solve, WR plans
        (benchmarks) them now."""
        for kind in kinds:
            if self.wd:
                with self.framework.device_guard(call.device):
                    self.handle(call.device).query(call.problem(kind))
            elif not self.auto:  # with `auto`, a kernel's limit is known once its moments are
                self.kernels.kernel(call, kind, self.settings.workspace_limit)

    def finalize(self) -> None:
        """WD: solve every recorded kernel as one network now."""
        with self.kernels.lock:
            for device, handle in self.kernels.handles.items():
                with self.framework.device_guard(device), self.framework.pool.planning_scope(device):
                    handle.finalize()

    def reset(self) -> None:
        """Forget every assignment: kernels are planned again on next use (WD: as one network).
        Waits for the GPUs first, since running kernels may still use the old workspaces."""
        with self.kernels.lock:
            for device, handle in self.kernels.handles.items():
                self.framework.synchronize(device)
                handle.reset()
            for part in (self.kernels, self.delegation, self.pending, self.moments, self.flushes):
                part.reset()

    def solved(self) -> bool:
        """WD: whether a handle holds a solve of the network."""
        return any(h.wd_result is not None for h in self.kernels.handles.values())

    def _so_far(self) -> str:
        """The progress line's tail: what planning has done so far."""
        delegated = sum(self.delegation.decided.values())
        return (f"{len(self.kernels.planned)} kernels planned, {delegated} layers left to {self.framework.own}'s own "
                f"convolution ({len(self.delegation.unswept)} with no sweep)")
