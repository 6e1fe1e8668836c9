"""What converted layers share: settings, a ucudnn.Handle per GPU, planned kernels by call site."""
from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from typing import Any, Callable, Iterator

import torch
from torch import Tensor, nn

from ...config import Settings, choice, format_size
from ...errors import ConfigError, DeviceMemoryError
from ...measurements import OK
from ...optimizers import DIVIDING, OPTIMIZERS
from ...problem import ConvKind, ConvProblem
from ...progress import Progress
from .call import Call
from .fallback import UNPLANNABLE, warn_once
from .delegation import settled_by_torch, torch_kernel_faster, worth_delegating
from .kernels import CudaBackend, TorchKernel, TorchTiming, UcudnnKernel
from .memory import AUTO, auto_total
from .sites import Site, Sites
from .timings import keep_timing, stored_timing

DELEGATED = ("torch", "layer")  # Context.runs' key of layer calls delegated to torch
_UNCHANGED = contextlib.nullcontext()  # reusable: entering it does nothing
_SERIAL = contextlib.nullcontext(lambda *tensors: _UNCHANGED)  # Context.beside with one stream
PLANNING_SLICE_S = 1.0  # planning="between_iterations": planning at the start of an iteration, at most about this


def _assigned(handle, problem: ConvProblem):
    """Context._planned's first plan of a kernel: the handle's assignment."""
    return handle.assignment(problem)


def _settings(workspace_limit=None, optimizer=None, policy=None, total_limit=None, cache_path=None,
              execution=None, planning=None, verbose=None) -> Settings:
    try:
        return Settings.load(workspace_limit=workspace_limit, optimizer=optimizer, batch_size_policy=policy,
                             total_workspace_limit=total_limit, cache_path=cache_path, execution=execution,
                             planning=planning, verbose=verbose)
    except ConfigError as exc:  # name the keywords convert() takes, not the settings they set
        message = str(exc)
        for setting, keyword in (("batch_size_policy=", "policy="), ("total_workspace_limit=", "total_limit=")):
            message = message.replace(setting, keyword)
        raise ConfigError(message) from None


class Context:
    """What converted layers share: settings, one ucudnn.Handle per GPU, planned kernels and,
    for WD, the recording of the network's kernels before the one solve.

    Keyword arguments as `convert` takes them (None: UCUDNN_* variables, then defaults)."""

    def __init__(self, settings: Settings | None = None, *, backend=None, cache=None, workspace_limit=None,
                 optimizer=None, policy=None, total_limit=None, cache_path=None, execution=None,
                 planning=None, delegate: bool = True):
        self.total_auto = total_limit == AUTO  # WD's total: a share of the memory left free (memory.py)
        if self.total_auto:
            optimizer, total_limit = _dividing(optimizer), None
        keywords = (workspace_limit, optimizer, policy, total_limit, cache_path, execution, planning)
        if settings is not None and any(v is not None for v in keywords):
            raise ConfigError("pass either settings= or keyword settings (workspace_limit, ...) to Context, not both")
        self.settings = settings or _settings(*keywords)
        # WR layers that ucudnn would not speed up run torch's own convolution (delegation.py)
        self.delegate = delegate
        self.backend = backend or CudaBackend()
        self._cache = cache
        self._handles: dict[torch.device, Any] = {}
        self._kernels: dict[tuple[ConvKind, Call], UcudnnKernel | TorchKernel] = {}
        self._torch_timings: dict[tuple[ConvKind, Call], TorchTiming] = {}
        self._delegated: dict[tuple[Call, tuple[ConvKind, ...]], bool] = {}  # what sites decided
        self.sites = Sites()  # what layer calls resolve to, by signature (see sites.py)
        self._lock = threading.RLock()
        self._recording = False
        # WD without a sample input: the first pass runs through torch while recording (see learn_call()).
        self._learn_first_pass = self.wd
        self._seen: set[int] = set()
        # (via, kind) -> kernel calls: ("ucudnn", "F"), ("torch", "BF"), ...; DELEGATED: layer calls
        self.runs: Counter = Counter()
        self.fallbacks: Counter = Counter()  # reason -> layer calls that went to torch entirely
        self.progress = Progress(self.settings.progress)
        self._planning_s: Counter = Counter()  # (kind, call) -> seconds spent planning it, torch's timing included
        self._unswept: set[Call] = set()  # delegated with no sweep (delegation.settled_by_torch)
        # planning="between_iterations": (call, kinds) -> its sites, running torch's convolution
        # until planned; planned from the start of an iteration (the first site's call) on
        self._pending: dict[tuple[Call, tuple[ConvKind, ...]], list[Site]] = {}
        self._lead: Site | None = None

    @property
    def wd(self) -> bool:
        return self.settings.optimizing.divides

    # Converted models share their context when deep-copied, and rebuild it when unpickled.
    def __deepcopy__(self, memo) -> "Context":
        return self

    def __reduce__(self):
        return (_rebuild_context, (self.settings, self.delegate, self.total_auto))

    def run(self, site: Site, kind: ConvKind, x: Tensor, w: Tensor, y: Tensor) -> None:
        """Run kernel `kind` of the site's Call on x, w, y (F writes y, BD writes x, BF writes w).
        Where its workspace cannot be borrowed, the kernel is planned within less (_shrink)."""
        kernel = site.kernels.get(kind)
        if kernel is None:
            kernel = self._site_kernel(site, kind)
        elif self.progress.open:
            self.progress.idle(self._planned_so_far)
        self.runs[kernel.counted] += 1
        with self.backend.device_guard(site.call.device):
            while True:
                try:
                    return kernel(x, w, y)
                except DeviceMemoryError:
                    kernel = self._shrink(site, kind, kernel)

    def beside(self, device: torch.device) -> contextlib.AbstractContextManager[Callable[..., Any]]:
        """For a layer's backward: inside, `with aside(*tensors):` runs its kernels on a side
        stream that first waits for the current one (settings.concurrent_backward; else on the
        current stream, at no cost beyond two reused no-op contexts), the tensors kept from reuse
        until that stream is done with them; on the way out the current stream waits for it."""
        if not self.settings.concurrent_backward:
            return _SERIAL
        return self.backend.side_stream(device)

    def _shrink(self, site: Site, kind: ConvKind, failed: UcudnnKernel) -> UcudnnKernel | TorchKernel:
        """The kernel planned for the site after `failed` could not borrow its workspace: within
        the bytes the device has free once torch's cached blocks went back (cached blocks in odd
        sizes cannot give one workspace), or half (Assignments.shrink; another site may have
        shrunk it already), and where no plan is left, torch's own convolution."""
        call = site.call
        with self._lock:
            kernel = self._kernels.get((kind, call))
            if kernel is failed:
                available = self.backend.settled_memory(call.device).free
                with self.backend.planning(call.device):
                    kernel = self._kernels[kind, call] = self._planned(
                        call, kind, lambda handle, problem: handle.shrink(problem, available))
            site.kernels[kind] = kernel
            return kernel

    def route(self, site: Site) -> bool:
        """Route a call of the site's layer: True where it runs torch's own convolution. Its first
        call plans it (the decision, and the sweep where one is needed), or with planning
        'between_iterations' queues it; the first site's call starts an iteration, and layers
        waiting for a plan get PLANNING_SLICE_S of planning there."""
        if site is self._lead and self._pending:
            self.plan_pending(PLANNING_SLICE_S)
        delegated = site.delegated
        if delegated is None:
            self._lead = self._lead or site
            delegated = self._decide(site)
            if (site.call, site.kinds) not in self._pending:
                site.delegated = delegated
        elif self.progress.open:
            self.progress.idle(self._planned_so_far)
        if delegated:
            self.runs[DELEGATED] += 1
        return delegated

    def _decide(self, site: Site) -> bool:
        """Whether the site's layer runs torch's own convolution, decided on its first call:
        - WD: never (one workspace divided among ucudnn's kernels);
        - with planning 'between_iterations', torch's own until plan_pending() plans the layer,
          so that the first iteration runs as torch's own would, with nothing timed;
        - else the layer is planned now (_planned_layer)."""
        if self.wd:
            return False
        deferred = self.settings.planning == "between_iterations"
        if not deferred and not self.delegate:
            return False
        key = (site.call, site.kinds)
        if key in self._pending:
            if all(s is not site for s in self._pending[key]):
                self._pending[key].append(site)
            return True
        if key not in self._delegated:
            if deferred:
                self._pending[key] = [site]
                return True
            self._delegated[key] = self._planned_layer(site)
        return self._delegated[key]

    def _planned_layer(self, site: Site) -> bool:
        """Plan the site's layer; whether it runs torch's own convolution. With delegation on,
        torch's own kernels are timed first, and where torch settles the layer
        (delegation.settled_by_torch) it runs them with no sweep; else its kernels are swept."""
        call = site.call
        if self.delegate and settled_by_torch([self._torch_timing(call, kind) for kind in site.kinds],
                                              self.settings.workspace_limit,
                                              lambda: all(self._favourite_fits(call, kind) for kind in site.kinds)):
            self._unswept.add(call)
            return True
        return self._swept(site)

    def _swept(self, site: Site) -> bool:
        """Plan the site's kernels; whether its layer runs torch's own convolution after all
        (delegation.worth_delegating, on torch's timings; never with delegation off). Where the
        layer stays, a kernel whose torch kernel is faster runs that (torch_kernel_faster)."""
        kernels = [self._site_kernel(site, kind) for kind in site.kinds]
        if not self.delegate or not all(isinstance(k, UcudnnKernel) for k in kernels):
            return False
        ucudnn_ms = [k.assignment.configuration.time_ms for k in kernels]
        torch_timings = [self._torch_timing(site.call, kind) for kind in site.kinds]
        limit = self.settings.workspace_limit
        if worth_delegating(ucudnn_ms, torch_timings, limit):
            return True
        for kind, kernel, ms, timing in zip(site.kinds, kernels, ucudnn_ms, torch_timings):
            if torch_kernel_faster(ms, timing, limit):
                self._kernels[kind, site.call] = site.kernels[kind] = TorchKernel(kernel.problem)
        return False

    def plan_pending(self, budget_s: float | None = None) -> int:
        """Plan the layers waiting for a plan (planning='between_iterations'), oldest first, until
        `budget_s` seconds have gone (None: all of them; at least one either way); each runs as
        planned from its next call. Returns how many still wait. Between iterations only."""
        started = time.perf_counter()
        while self._pending:
            key, sites = next(iter(self._pending.items()))
            self._delegated[key] = self._planned_layer(sites[0])
            del self._pending[key]
            for site in sites:
                site.delegated = None
            if budget_s is not None and time.perf_counter() - started >= budget_s:
                break
        return len(self._pending)

    def _torch_timing(self, call: Call, kind: ConvKind) -> TorchTiming:
        """torch's own kernel as the database keeps it (timings.py), else timed now and kept."""
        if (kind, call) not in self._torch_timings:
            problem, assignments = call.problem(kind), self.handle(call.device).assignments
            with self._lock, self.backend.device_guard(call.device):
                timing = stored_timing(assignments, problem, self.backend.free_bytes(call.device))
                if timing is None:
                    # in the planning scope: its operands (~190 MiB for AlexNet's conv2) go back to the
                    # device afterwards rather than staying cached in odd sizes in the pool the step runs in
                    with self.backend.planning(call.device), self._planning(kind, call, "timing torch's own"):
                        timing = self.backend.time_torch(problem, call.device)
                        keep_timing(assignments, problem, timing)
                self._torch_timings[kind, call] = timing
        return self._torch_timings[kind, call]

    def _favourite_fits(self, call: Call, kind: ConvKind) -> bool:
        """Whether cuDNN's heuristic favourite for the kernel (Handle.favourite) can run within
        the per-kernel limit."""
        with self._lock, self.backend.device_guard(call.device), self._planning(kind, call, "asking cuDNN's favourite of"):
            favourite = self.handle(call.device).favourite(call.problem(kind))
        return favourite.status == OK and favourite.workspace <= self.settings.workspace_limit

    @contextlib.contextmanager
    def _planning(self, kind: ConvKind, call: Call, doing: str) -> Iterator[None]:
        """A planning step of the kernel: shown by the progress line, its seconds kept for summary()."""
        self.progress.step(f"{doing} {_brief(call.problem(kind))}", self._planned_so_far())
        started = time.perf_counter()
        try:
            yield
        finally:
            self._planning_s[kind, call] += time.perf_counter() - started
            self.progress.finished()

    def _planned_so_far(self) -> str:
        delegated = sum(self._delegated.values())
        return (f"{len(self._kernels)} kernels planned, {delegated} layers left to torch's own convolution "
                f"({len(self._unswept)} with no sweep)")

    def _site_kernel(self, site: Site, kind: ConvKind) -> UcudnnKernel | TorchKernel:
        kernel = site.kernels[kind] = self._kernels.get((kind, site.call)) or self._kernel(site.call, kind)
        return kernel

    def _kernel(self, call: Call, kind: ConvKind) -> UcudnnKernel | TorchKernel:
        with self._lock, self.backend.device_guard(call.device):
            if (kind, call) not in self._kernels:
                with self.backend.planning(call.device), self._planning(kind, call, "timing ucudnn's candidates of"):
                    self._kernels[kind, call] = self._planned(call, kind, _assigned)
            return self._kernels[kind, call]

    def _planned(self, call: Call, kind: ConvKind, assign: Callable[[Any, ConvProblem], Any]) -> UcudnnKernel | TorchKernel:
        """The kernel as `assign(handle, problem)` plans it (_assigned, or a shrink after its
        workspace could not be borrowed); torch's own convolution where ucudnn cannot plan it."""
        problem, handle = call.problem(kind), self.handle(call.device)
        try:
            return UcudnnKernel(problem, handle, assign(handle, problem), self.backend)
        except UNPLANNABLE as exc:
            warn_once(f"{problem.describe()}: {exc}")
            return TorchKernel(problem)

    def handle(self, device: torch.device):
        """The ucudnn.Handle of `device`, made on first use."""
        with self._lock:
            if device not in self._handles:
                if self._cache is None:
                    from ...cache import Cache

                    self._cache = Cache(self.settings.cache_path)
                with self.backend.device_guard(device):
                    self._handles[device] = self.backend.make_handle(self.settings, self._cache, device)
            return self._handles[device]

    # WD: learning the network first
    def learn_call(self, module: nn.Module) -> bool:
        """Take this call of `module` while the network is learned: True where it only records its
        kernels (and runs through torch): inside `recording()`, and for WD without a sample input
        through the first pass, which ends, and the network is solved, when a layer is called a
        second time."""
        if self._recording:
            return True
        if not self._learn_first_pass:
            return False
        if id(module) not in self._seen:
            self._seen.add(id(module))
            return True
        self._learn_first_pass = False
        self._seen.clear()
        self.finalize()
        return False

    def record(self, call: Call, kinds: tuple[ConvKind, ...]) -> None:
        """Learn kernels ahead of their first run: WD records them for the solve, WR plans
        (benchmarks) them now."""
        for kind in kinds:
            if self.wd:
                with self.backend.device_guard(call.device):
                    self.handle(call.device).query(call.problem(kind))
            else:
                self._kernel(call, kind)

    @contextlib.contextmanager
    def recording(self) -> Iterator["Context"]:
        """Layers only record their kernels inside; on a clean exit the kernels are planned (WD:
        the network, known kernels included, is solved once)."""
        if self.wd and any(h.wd_result is not None for h in self._handles.values()):
            self.reset()  # learning again: solve the known kernels and the new ones together
        self._learn_first_pass, self._recording = False, True
        try:
            yield self
        finally:
            self._recording = False
        self.finalize()

    def finalize(self) -> None:
        """WD: solve every recorded kernel as one network now (total_limit='auto': within a share
        of the memory left free, see memory.py)."""
        with self._lock:
            for device, handle in self._handles.items():
                with self.backend.device_guard(device), self.backend.planning(device):
                    handle.finalize(self._auto_total(device) if self.total_auto else None)

    def _auto_total(self, device: torch.device) -> int:
        return auto_total(self.backend.settled_memory(device), self.backend.peak_allocated(device))

    def reset(self) -> None:
        """Forget every assignment: kernels are planned again on next use (WD: as one network).
        Waits for the GPUs first, since running kernels may still use the old workspaces."""
        with self._lock:
            for device, handle in self._handles.items():
                self.backend.synchronize(device)
                handle.reset()
            self._kernels.clear()
            self._delegated.clear()
            self._unswept.clear()
            self._pending.clear()
            self._lead = None
            self.sites.clear()

    def summary(self) -> dict:
        """Settings, every kernel planned or timed: its configuration and workspace, or torch's
        (delegated, `swept` False where no sweep was needed), and the seconds its planning took;
        calls, fallbacks and (WD) the solve: what benchmarks report."""
        s = self.settings
        delegated = {call for (call, _), yes in self._delegated.items() if yes}
        keys = dict.fromkeys([*self._kernels, *self._torch_timings])
        out = dict(optimizer=s.optimizer, policy=s.batch_size_policy, search=s.search,
                   workspace_limit=s.workspace_limit, delegate=self.delegate,
                   planning_s=sum(self._planning_s.values()), planning=s.planning, pending=len(self._pending),
                   kernels=[_describe(kind, call, self._kernels.get((kind, call)), self._torch_timings.get((kind, call)),
                                      call in delegated, self._planning_s[kind, call])
                            for kind, call in keys],
                   runs={f"{via}:{kind}": n for (via, kind), n in self.runs.items()},
                   fallbacks=dict(self.fallbacks))
        if self.wd:
            out["wd"] = [dict(total_limit=h.wd_limit, total_workspace=r.total_workspace, auto=self.total_auto,
                              variables=r.variables, solve_seconds=r.solve_seconds, solver=r.solver)
                         for h in self._handles.values() if (r := h.wd_result) is not None]
        out["cudnn_handles"] = dict(self.backend.cudnn_handles)  # device -> whose handle: torch's, or why not
        out["shrinks"] = [dict(kernel=what, failed=failed, limit=limit)
                          for h in self._handles.values() for what, failed, limit in h.shrinks]
        return out

    def __repr__(self) -> str:
        s = self.settings
        limit = format_size(s.workspace_limit)
        return f"ucudnn.torch.Context(optimizer={s.optimizer!r}, workspace_limit={limit}, policy={s.batch_size_policy!r})"


def _describe(kind: ConvKind, call: Call, kernel: UcudnnKernel | TorchKernel | None,
              torch_timing: TorchTiming | None, delegated: bool, planning_s: float) -> dict:
    """One kernel for summary(): how it runs, its configuration and, where timed, torch's own
    kernel (`delegated`: its layer runs torch's convolution; no kernel: nor was it swept)."""
    out = dict(kind=kind.value, kernel=call.problem(kind).describe(),
               via="torch" if delegated or kernel is None else kernel.via, delegated=delegated,
               swept=kernel is not None, planning_s=planning_s)
    if torch_timing is not None:
        out.update(torch_ms=torch_timing.ms, torch_workspace=torch_timing.workspace)
    if isinstance(kernel, UcudnnKernel):
        configuration = kernel.assignment.configuration
        out.update(configuration=configuration.describe(),
                   parts=len(configuration.micro), workspace=kernel.assignment.workspace_size,
                   predicted_ms=configuration.time_ms)
    return out


def _brief(problem: ConvProblem) -> str:
    """A kernel in a few words, for the progress line: 'BF x=(32, 64, 56, 56) w=(64, 64, 3, 3) float16'."""
    return f"{problem.kind.value} x={problem.x_shape} w={problem.w_shape} {problem.dtype}"


def _dividing(optimizer: str | None) -> str:
    """The optimizer total_limit='auto' plans with: one that divides a total (WD), named or not."""
    if optimizer is None:
        return DIVIDING.name
    if not OPTIMIZERS[choice(optimizer, tuple(OPTIMIZERS), "optimizer")].divides:
        raise ConfigError(f"total_limit='auto' sizes WD's total, but optimizer={optimizer!r}; "
                          f"use optimizer={DIVIDING.name!r} or drop total_limit")
    return optimizer


def _rebuild_context(settings: Settings, delegate: bool = True, total_auto: bool = False) -> Context:
    context = Context(settings, delegate=delegate)
    context.total_auto = total_auto
    return context


_default: Context | None = None


def default_context() -> Context:
    """The context of Conv2d layers made directly rather than by convert(): settings from UCUDNN_*."""
    global _default
    if _default is None:
        _default = Context()
    return _default
