"""Assignments: the configuration and workspace of every kernel a handle has seen, at run time.

- WR: each kernel is optimized on first sight (memoized) and gets a workspace of its own.
- WD: kernels are only recorded until `finalize()` (the handle calls it at the first
  convolution); then one ILP divides one buffer into a segment per kernel. A kernel first seen
  after that is optimized by WR within what the total limit has left, in a buffer of its own, so
  no segment in use ever moves. `reset()` forgets every assignment so that the next use solves all
  known kernels again as one network: call it between iterations, never during one.
- Out of memory: where a workspace cannot be allocated (the allocator raises MemoryError), the
  kernel (WD: the network) is planned again within half of it, and so on; `shrink()` does the
  same for a workspace its caller failed to allocate. Each step warns and is kept in `shrinks`.
  A kernel planned again for lack of memory is planned from the measurements at hand where they
  hold a plan within the new limit: measuring needs the operands' memory, which is what is short.

Pure logic over a cache, a benchmarker and an allocator, so the CPU tests drive it with fakes.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from ..core.errors import DeviceMemoryError, InfeasibleError, NoAlgorithmError
from ..core.fallback import say_once
from ..core.log import say_plan
from ..core.measurements import KernelTable
from ..core.problem import ConvProblem, Kernel
from ..measure.benchmark import Benchmarker, ensure_tables
from ..optimizers import PER_KERNEL
from ..optimizers.configuration import Configuration
from ..optimizers.wd import WDResult
from .config import Settings
from .solve import Measure, plan

# The step by which device memory is handed out for large blocks: torch's caching allocator
# rounds them up to it, and the driver maps memory in pages of it. A workspace below the bytes
# free does not fit where it rounds up above them (docs/results.md, "both limits in one run, and a
# shrink that steps below the allocator's rounding").
ALLOCATION_GRANULE = 2 * 2**20
NO_MEMORY = "no GPU memory for"  # shrink()'s reason where a workspace could not be allocated


class Shrink(NamedTuple):
    """One step down of a kernel's workspace (Assignments.shrinks)."""

    what: str  # the kernel
    failed: int  # the workspace bytes that could not be had (or only at the cost `why` says)
    limit: int  # the bytes planned within next
    why: str  # NO_MEMORY, or the caller's reason (a flush of its framework's cache)


@dataclass(frozen=True)
class Assignment:
    """How one kernel runs: its configuration and the workspace it may use."""

    configuration: Configuration
    workspace: int  # device address (0 when no workspace is needed)
    workspace_size: int


class Assignments:
    """Every kernel's Assignment, made on first need (WR) or for the network at once (WD)."""

    def __init__(self, settings: Settings, cache, benchmarker: Callable[[], Benchmarker],
                 allocator: Callable[[int], Any], pointer: Callable[[Any], int]):
        self.settings = settings
        self.cache = cache
        self._make_benchmarker = benchmarker  # called on first need: creating one touches the GPU
        self._benchmarker: Benchmarker | None = None
        self._allocate, self._pointer = allocator, pointer
        self._assigned: dict[str, Assignment] = {}
        self._known: dict[str, ConvProblem] = {}  # every kernel seen, assigned or not
        self._pending: dict[str, ConvProblem] = {}  # WD: recorded, waiting for finalize()
        self._buffers: list[Any] = []  # keeps every workspace alive while its assignment is in use
        self._network_solved = False
        self._late_workspace = 0  # WD: bytes given to kernels that came after the solve
        self.wd_result: WDResult | None = None  # WD: the last solve's
        self.wd_limit: int | None = None  # WD: the total the last solve was given
        self.shrinks: list[Shrink] = []  # in order

    @property
    def wd(self) -> bool:
        return self.settings.optimizing.divides

    def record(self, problem: ConvProblem) -> None:
        """An algorithm query: WR assigns the kernel now; WD waits for the whole network."""
        self._known[problem.key] = problem
        if problem.key in self._assigned:
            return
        if self.wd and not self._network_solved:
            self._pending[problem.key] = problem
        else:
            self.get(problem)

    def get(self, problem: ConvProblem) -> Assignment:
        """The kernel's assignment, optimizing it (WD: solving the recorded network) if needed."""
        self._known[problem.key] = problem
        if problem.key not in self._assigned:
            if self.wd and not self._network_solved:
                self._pending[problem.key] = problem
                self.finalize()
            else:
                self._assign_alone(problem)
        return self._assigned[problem.key]

    def finalize(self, total: int | None = None) -> None:
        """WD: solve the ILP over every recorded kernel and divide one workspace among them, of at
        most `total` bytes (default: the settings' total limit). Where that buffer cannot be
        allocated, the network is solved again within half of it (see _smaller)."""
        if not self.wd or self._network_solved:
            return
        pending = list(self._pending.values())  # kept until solved: an error loses no kernel
        if not pending:
            return
        asked = limit = self.settings.total(len(pending)) if total is None else total
        kernels = [Kernel(p.key, p) for p in pending]
        while True:
            try:
                solution = plan(kernels, self.settings, self._tables, limit=limit).solution
            except InfeasibleError as exc:
                if limit == asked:  # the limit asked for: the caller's to raise
                    raise
                raise DeviceMemoryError(f"the smallest workspace of the network's {len(pending)} kernels",
                                        exc.smallest_feasible, "free GPU memory") from exc
            assert solution.wd is not None  # the settings divide (self.wd)
            try:
                base = self._buffer(solution.wd.total_workspace)
                break
            except MemoryError:
                limit = self._smaller(solution.wd.total_workspace, f"the network's {len(pending)} kernels")
        self._pending, self.wd_result, self.wd_limit = {}, solution.wd, limit
        described = {p.key: p.describe() for p in pending}
        for key, configuration in solution.configurations.items():
            segment = self.wd_result.segments[key]
            self._keep(key, described[key],
                       Assignment(configuration, segment.pointer(base) if segment.size else 0, segment.size))
        self._network_solved = True

    def shrink(self, problem: ConvProblem, available: int | None = None, failed: Assignment | None = None,
               why: str = NO_MEMORY) -> Assignment:
        """Assign `problem` again within less than its workspace, which the caller (borrowing it
        at each call) could not allocate, or could only at a cost it says in `why`: within the
        `available` bytes the caller can still have where that is less but at least half, else
        within half. `failed`: a plan the caller keeps itself (within()), planned again and
        returned, not kept; else the kernel's assignment."""
        kept = failed is None
        failed = self._assigned[problem.key] if failed is None else failed
        limit = self._smaller(failed.workspace_size, problem.describe(), available, why)
        try:
            assignment = self._within(problem, limit, self._tables_at_hand)
        except (NoAlgorithmError, InfeasibleError):
            assignment = self._within(problem, limit)
        if kept:
            self._keep(problem.key, problem.describe(), assignment)
        else:
            self._say(f"{problem.describe()} within {limit / 2**20:.1f} MiB", assignment)
        return assignment

    def within(self, problem: ConvProblem, limit: int) -> Assignment:
        """WR: the kernel's plan within `limit` bytes (the cache, and this GPU for what it
        lacks), and its workspace; the caller keeps it (a framework's kernel planned for one
        moment of its step, ucudnn.plan.memory), the handle does not."""
        assignment = self._within(problem, limit)
        self._say(f"{problem.describe()} within {limit / 2**20:.1f} MiB", assignment)
        return assignment

    def _within(self, problem: ConvProblem, limit: int, measure: Measure | None = None) -> Assignment:
        """The kernel's WR plan within `limit` from `measure` (default _tables), and its workspace."""
        while True:
            configuration = self._optimize_wr(problem, limit, measure)
            try:
                return Assignment(configuration, self._buffer(configuration.workspace), configuration.workspace)
            except MemoryError:
                limit = self._smaller(configuration.workspace, problem.describe())

    def reset(self) -> None:
        """Forget every assignment and workspace; known kernels are assigned again on next use (WD: as
        one network). The caller must make sure no convolution still uses the old workspaces."""
        self._assigned, self._buffers, self.wd_result = {}, [], None
        self._network_solved, self._late_workspace = False, 0
        if self.wd:
            self._pending = dict(self._known)

    def __len__(self) -> int:
        return len(self._assigned)

    def _assign_alone(self, problem: ConvProblem, limit: int | None = None, measure: Measure | None = None) -> None:
        """WR: the kernel's plan within `limit` (default _alone_limit), kept as its assignment."""
        assignment = self._within(problem, self._alone_limit() if limit is None else limit, measure)
        if self.wd:
            self._late_workspace += assignment.workspace_size
        self._keep(problem.key, problem.describe(), assignment)

    def _keep(self, key: str, what: str, assignment: Assignment) -> None:
        """`assignment` is kernel `key`'s (_say says so)."""
        self._assigned[key] = assignment
        self._say(what, assignment)

    def _say(self, what: str, assignment: Assignment) -> None:
        """With settings.verbose, the `ucudnn` logger says `what` is planned as `assignment`."""
        if self.settings.verbose:
            say_plan(what, assignment.configuration, assignment.workspace_size)

    def _alone_limit(self) -> int:
        """WR: the per-kernel limit. WD, a kernel that came after the network was solved: only
        what the total has left."""
        if not self.wd:
            return self.settings.workspace_limit
        used = self.wd_result.total_workspace if self.wd_result else 0
        return max(self.settings.total(len(self._assigned) + 1) - used - self._late_workspace, 0)

    def _smaller(self, nbytes: int, what: str, available: int | None = None, why: str = NO_MEMORY) -> int:
        """The limit to plan again within after `nbytes` of workspace for `what` could not be
        allocated: the `available` bytes where fewer than `nbytes`; one allocation granule less
        than `nbytes` where `available` seemed to hold it (the allocator rounded it above them),
        once: where that failed too, what is free is not what can be had; at least half of
        `nbytes`, and half where nothing is known of what is available. Out of memory with no
        workspace at all is the caller's to handle."""
        if nbytes == 0:
            raise DeviceMemoryError(f"a zero-byte workspace for {what}", 0, "free GPU memory")
        limit = nbytes // 2
        if available is not None and available < nbytes:
            limit = max(limit, available)
        elif available is not None and not self._stepped_a_granule(what):
            limit = max(limit, nbytes - ALLOCATION_GRANULE)
        self.shrinks.append(Shrink(what, nbytes, limit, why))
        free = "" if available is None else f" ({available / 2**20:.1f} MiB free)"
        say_once(f"ucudnn: {why} {nbytes / 2**20:.1f} MiB of workspace for {what}{free}; "
                 f"planning again within {limit / 2**20:.1f} MiB")
        return limit

    def _stepped_a_granule(self, what: str) -> bool:
        """Whether `what`'s last shrink stepped one allocation granule below what failed."""
        last = next((s for s in reversed(self.shrinks) if s.what == what), None)
        return last is not None and last.limit == last.failed - ALLOCATION_GRANULE

    def _optimize_wr(self, problem: ConvProblem, limit: int, measure: Measure | None = None) -> Configuration:
        """Planned alone: per kernel (WR), whatever divides the network's total. Plans from the
        complete tables (`measure` None) are remembered; plans from the tables at hand are not."""
        kernel, alone = Kernel(problem.describe(), problem), replace(self.settings, optimizer=PER_KERNEL.name)
        if measure is not None:
            return plan([kernel], alone, measure, limit=limit).solution.configurations[kernel.name]
        memo_key = (self.benchmarker.device.reuse_key, self.benchmarker.backends.names, problem.key,
                    self.settings.policy, self.settings.search, limit, PER_KERNEL.name)
        configuration = self.cache.configuration(memo_key)
        if configuration is None:
            configuration = plan([kernel], alone, self._tables, limit=limit).solution.configurations[kernel.name]
            self.cache.remember(memo_key, configuration)
        return configuration

    def _tables(self, problems: Sequence[ConvProblem], cap: int | None) -> dict[str, KernelTable]:
        return ensure_tables(problems, self.settings.sizes_for, cap, self.cache, self.benchmarker,
                             search=self.settings.searching)

    def _tables_at_hand(self, problems: Sequence[ConvProblem], cap: int | None) -> dict[str, KernelTable]:
        """The kernels' tables as the cache holds them for this GPU's benchmarker: nothing measured."""
        device, names = self.benchmarker.device, self.benchmarker.backends.names
        return {p.key: self.cache.table(p, device).only(names) for p in problems}

    @property
    def benchmarker(self) -> Benchmarker:
        if self._benchmarker is None:
            self._benchmarker = self._make_benchmarker()
        return self._benchmarker

    def _buffer(self, nbytes: int) -> int:
        if nbytes == 0:
            return 0
        buffer = self._allocate(nbytes)
        self._buffers.append(buffer)
        return self._pointer(buffer)
