"""What the Planner works with: a framework integration (`Framework`: its tensors, its own
convolution, its memory) and one engine per device (`Engine`: ucudnn.Handle as planning uses it),
and a stretch of planning's scopes (`scopes`; its time budget is ucudnn.core.budget.Slice)."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator
from typing import Any, NamedTuple, Protocol, runtime_checkable

from ..core.problem import ConvKind, ConvProblem
from ..execute.backends import Candidate
from .assignment import Assignment, Assignments, Shrink
from .config import Settings
from .memory import Memory

UCUDNN = "ucudnn"  # how ucudnn's kernels count in Planner.runs: (UCUDNN, kind)
LAYER = "layer"  # (framework.own, LAYER): layer calls that ran the framework's own convolution
# planning="between_iterations": planning at the start of an iteration, at most about this (core.budget.Slice)
PLANNING_SLICE_S = 1.0
Device = Any  # what a framework names a device by (hashable): its own type, torch.device for torch


class OwnTiming(NamedTuple):
    """The framework's own convolution of a kernel, as measured in this process: its median GPU
    time, the bytes it allocates beyond its result (the workspace of the plan it chose) and the
    bytes that could be had when it chose (device free plus its cached blocks; 0: unknown)."""

    ms: float
    workspace: int
    free: int = 0


class Engine(Protocol):
    """What the Planner asks of one device's ucudnn.Handle (Framework.make_handle): plans of a
    kernel (the handle's assignment, within a limit, shrunk, cuDNN's heuristic favourite), cuDNN's
    favourite, WD's recording and solve; the assignments hold what was measured."""

    assignments: Assignments

    def query(self, problem: ConvProblem) -> tuple[int, int]: ...
    def assignment(self, problem: ConvProblem) -> Assignment: ...
    def within(self, problem: ConvProblem, limit: int) -> Assignment: ...
    def shrink(self, problem: ConvProblem, available: int | None = None, failed: Assignment | None = None,
               why: str = ...) -> Assignment: ...
    def heuristic(self, problem: ConvProblem, limit: int) -> Assignment: ...
    def favourite(self, problem: ConvProblem) -> Candidate: ...
    def favourite_ms(self, problem: ConvProblem) -> float: ...
    def finalize(self, total: int | None = None) -> None: ...
    def reset(self) -> None: ...
    @property
    def wd_result(self) -> Any: ...
    @property
    def wd_limit(self) -> int | None: ...
    @property
    def shrinks(self) -> list[Shrink]: ...


class Call(Protocol):
    """One layer call's convolution as the Planner plans it (hashable: equal calls share plans):
    its device and the ConvProblem of each kernel it runs."""

    @property
    def device(self) -> Device: ...

    def problem(self, kind: ConvKind) -> ConvProblem: ...

    def __hash__(self) -> int: ...


class Site(Protocol):
    """A layer call the Planner routes and runs (hashable by identity): its `call`, the kernels it
    runs (`kinds`), those planned for it (`kernels`, by kind), whether it runs the framework's own
    convolution (`delegated`; None: not decided yet), whether its calls may skip route()
    (`steady`), and with limits from the memory timeline the least bytes free as each kernel
    started (`free`, by kind) and the calls it made waiting for its plan (`observed`)."""

    kinds: tuple[ConvKind, ...]
    kernels: dict
    delegated: bool | None
    steady: bool
    free: dict
    observed: int

    @property
    def call(self) -> Call: ...


class Pool(Protocol):
    """The framework's memory as the Planner reads it: its allocator's pool (what can be had,
    its flushes and growth), the device beyond it, what ucudnn holds beside it, and the scope in
    which planning allocates from it."""

    def free_bytes(self, device: Device) -> int:
        """What the framework could allocate now in one block, at the least."""

    def outside_bytes(self, device: Device) -> int:
        """What the process holds on the device outside the framework's pool (code, handles)."""

    def settled_memory(self, device: Device) -> Memory:
        """The device's free memory and the bytes tensors hold, the framework's cache given back."""

    def flushes(self, device: Device) -> int:
        """How often the framework's allocator has given its whole cache back to serve an allocation."""

    def grown(self, device: Device) -> int:
        """How often the framework's allocator has taken memory from the device (allocated, or pages mapped)."""

    def release(self, device: Device) -> int:
        """Give back what ucudnn holds beside the framework's pool that it can make again (CUDA
        graphs, cached blocks), and the framework's cached blocks; the graphs' bytes."""

    def bound_beside(self, nbytes: int | None) -> None:
        """What ucudnn may hold beside the framework's pool in CUDA graphs from now on (None: unbounded)."""

    def planning_scope(self, device: Device) -> contextlib.AbstractContextManager:
        """Inside, planning's device memory comes from the framework; on the way out of the
        outermost such scope what it cached goes back to the device."""


@runtime_checkable
class Framework(Protocol):
    """What a framework integration gives the Planner (ucudnn.integrations.torch.kernels.TorchFramework
    for torch): a second framework implements this, and its layers call Planner.route and
    Planner.run. Devices are whatever the framework names them by (hashable)."""

    own: str  # the framework's name: its own convolution's kernels count as (own, kind) in runs
    cudnn_handles: dict  # device -> whose cuDNN handle its ucudnn.Handle runs on (for summary())

    @property
    def pool(self) -> Pool:
        """Its memory."""

    def make_handle(self, settings: Settings, cache, device: Device) -> Engine:
        """A ucudnn.Handle for `device`: the Planner's engine there."""

    def kernel(self, problem: ConvProblem, handle: Engine, assignment: Assignment) -> Any:
        """A callable kernel(x, w, y) running `assignment` on the framework's tensors, into the
        one it writes (problem.written), with `via` == UCUDNN, `counted`, `problem` and
        `assignment`; DeviceMemoryError where its workspace cannot be had."""

    def own_kernel(self, problem: ConvProblem) -> Any:
        """A callable kernel(x, w, y) running the framework's own convolution (`via` == own),
        returning what it writes: into the written operand where one is given, else a tensor
        of its own."""

    def result_for(self, problem: ConvProblem, like: Any) -> Any:
        """A new tensor for what `problem`'s kernel writes, like `like` (dtype, device)."""

    def time_own(self, problem: ConvProblem, device: Device, free: int | None = None) -> OwnTiming:
        """The framework's own convolution of `problem` timed on new operands; with `free`, with
        only that many bytes free beyond its result (the rest held while it runs)."""

    def own_candidate(self) -> str:
        """The database's name of the framework's own convolution ('torch:2.11.0+cu130')."""

    def device_guard(self, device: Device) -> contextlib.AbstractContextManager:
        """Inside, `device` is the current device."""

    def synchronize(self, device: Device) -> None:
        """Wait for the device's work."""

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


@contextlib.contextmanager
def scopes(framework: Framework) -> Iterator[Callable[[Hashable], None]]:
    """One planning scope a device (Pool.planning_scope) for a stretch of planning, entered by
    the function yielded as the stretch first meets the device, all left at its end: the
    framework's cache is given back once a stretch, not after every kernel."""
    with contextlib.ExitStack() as stack:
        devices: set = set()

        def planning(device: Hashable) -> None:
            if device not in devices:
                devices.add(device)
                stack.enter_context(framework.pool.planning_scope(device))
        yield planning

