"""Where kernels run: torch's CUDA tensors and streams (TorchFramework), a planned ucudnn kernel
(one graph launch per call), and torch's own convolution for what ucudnn cannot plan."""
from __future__ import annotations

import contextlib
import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ...core.errors import CudnnError
from ...core.fallback import say_once
from ...core.measurements import TORCH
from ...core.problem import ConvKind, ConvProblem
from ...execute.backends.base import candidate_id
from ...plan.config import Settings
from ...plan.framework import UCUDNN, OwnTiming
from .call import memory_format
from .pool import TorchPool, out_of_memory_as
from .torch_handle import torch_cudnn_handle

F_, BD, BF = ConvKind.FORWARD, ConvKind.BACKWARD_DATA, ConvKind.BACKWARD_FILTER

# The current stream's address without building a torch.cuda.Stream: far cheaper per call.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)

TORCH_REPEATS = 10  # timed calls of torch's own convolution per kernel, after warm-up ...
TORCH_TIMING_BUDGET_MS = 50.0  # ... fewer where one call is long (a slow plan torch fell back to)
SPIN_CYCLES_PER_S = 2e9  # GPU clock cycles a second, from above (the H100's boost clock is 1.98 GHz)


def _allocated_total(device: torch.device) -> int:
    """Bytes the caching allocator has handed out since the process started (never decreases)."""
    return torch.cuda.memory_stats(device)["allocated_bytes.all.allocated"]


def _event_times(run: Callable[[], Any], repeats: int) -> list[float]:
    """GPU milliseconds of each of `repeats` calls of run(), by CUDA events on the current stream.
    A spinning kernel holds the GPU while the host queues the calls, so that a short kernel is
    timed at the GPU's pace rather than its host call's, as ucudnn's own candidates are
    (ucudnn.execute.gpu.time_calls with hide_host)."""
    began = time.perf_counter()
    run()
    host_s = time.perf_counter() - began
    torch.cuda._sleep(int(min(SPIN_CYCLES_PER_S * 2 * host_s * (repeats + 1), SPIN_CYCLES_PER_S)))
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    for start, end in pairs:
        start.record()
        run()
        end.record()
    pairs[-1][1].synchronize()
    return [start.elapsed_time(end) for start, end in pairs]


def _no_persistent_workspace(nbytes: int) -> int:
    """WR plans get no buffer of their own (address 0): each call borrows its workspace from
    torch's caching allocator instead, as torch's own convolutions do, so workspaces of
    different layers share memory rather than add up."""
    return 0


# Context.beside's side streams, by (device, current stream), for the whole process: torch's allocator
# keeps the stream a tensor was recorded on (record_stream) and records an event on it when the
# tensor is freed, so a side stream must outlive every tensor recorded there, the layers and
# contexts that made it included (torch.cuda.ExternalStream's contract); torch never destroys its
# own streams either. The CuPy streams behind them are kept alive here.
_SIDE_STREAMS: dict[tuple[torch.device, int], Any] = {}
_MADE_STREAMS: list[Any] = []


class TorchFramework:
    """torch's side of a ucudnn.plan.planner.Planner: kernels on CUDA tensors through ucudnn.Handle,
    on torch's current stream, and torch's own convolution (`own`)."""

    own = TORCH  # the framework whose own convolution runs where ucudnn does not

    def __init__(self) -> None:
        self.cudnn_handles: dict[str, str] = {}  # device -> whose cuDNN handle its ucudnn.Handle runs on
        self.pool = TorchPool()

    def runs_on(self, device: torch.device) -> bool:
        return device.type == "cuda"

    def device_guard(self, device: torch.device):
        """cuDNN handles are bound to a device: make it current where it is not."""
        if device.index is not None and device.index != torch.cuda.current_device():
            return torch.cuda.device(device)
        return contextlib.nullcontext()

    def stream(self, device: torch.device) -> int | None:
        if _raw_stream is None:  # pragma: no cover - torch builds without CUDA
            return torch.cuda.current_stream(device).cuda_stream
        return _raw_stream(torch.cuda.current_device() if device.index is None else device.index)

    def kernel(self, problem: ConvProblem, handle, assignment) -> UcudnnKernel:
        """The kernel ucudnn runs as `assignment` (a `handle`'s) plans it."""
        return UcudnnKernel(problem, handle, assignment, self)

    def own_kernel(self, problem: ConvProblem) -> TorchKernel:
        """torch's own convolution of `problem`, as a kernel."""
        return TorchKernel(problem)

    @staticmethod
    def own_candidate() -> str:
        """'torch:2.11.0+cu130': torch's own convolution as this torch runs it, named as the
        database names it (ucudnn.plan.delegation keeps its timings)."""
        return candidate_id(TORCH, torch.__version__)

    def make_handle(self, settings: Settings, cache, device: torch.device):
        """A ucudnn.Handle on torch's own cuDNN handle where it can be borrowed (torch_handle.py),
        else on one of its own (with a warning: it costs device memory, torch_handle.py)."""
        from ...handle import Handle

        torch.backends.cudnn.version()  # loads torch's libcudnn, so ucudnn's bindings use the same one
        allocator: Callable[[int], Any]
        if settings.optimizing.divides:  # one persistent buffer for the network, divided (and late kernels)
            allocator = functools.partial(self.pool.borrow, device=device)
        else:
            allocator = _no_persistent_workspace
        lent = torch_cudnn_handle(device)
        self.cudnn_handles[str(device)] = lent.source
        if lent.handle is None:
            say_once(f"ucudnn.torch makes a cuDNN handle of its own (~10 MiB of device memory) on "
                     f"{device}: torch's could not be borrowed ({lent.source})")
        make = functools.partial(Handle, settings, cache=cache, allocator=allocator, cudnn_handle=lent.handle,
                                 stream=self.stream(device), make_room=torch.cuda.empty_cache)
        try:
            return make()
        except CudnnError:
            # cudnnCreate takes device memory outside torch's pool: under memory pressure, give
            # torch's cached blocks back to the device and try once more
            torch.cuda.empty_cache()
            return make()

    @staticmethod
    def result_for(problem: ConvProblem, like: Tensor) -> Tensor:
        """A new tensor for what `problem`'s kernel writes: its shape, stored in its layout, with
        the dtype and device of `like` (one of its operands); DeviceMemoryError where it cannot be had."""
        shape = problem.written_shape
        with out_of_memory_as(f"the result of {problem.describe()}", problem.written_bytes()):
            return torch.empty(shape, dtype=like.dtype, device=like.device,
                               memory_format=memory_format(problem.layout, len(shape)))

    @contextlib.contextmanager
    def side_stream(self, device: torch.device):
        """Context.beside on CUDA: one side stream per device and current stream, made once for the
        process (_SIDE_STREAMS) and handed to no one else (_own_stream), so that the layers of
        branches on several streams (ucudnn.integrations.torch.streams) fork no dependencies into
        each other. `aside(*tensors)` runs its body on it after the current stream's work so far,
        and marks the tensors as used there (record_stream), so that the caching allocator does not
        hand their memory out again before the side stream is done; at the end the current stream
        waits for the side stream."""
        current = torch.cuda.current_stream(device)
        side = _SIDE_STREAMS.get((device, current.cuda_stream))
        if side is None:
            side = _SIDE_STREAMS[device, current.cuda_stream] = self._own_stream(device)

        @contextlib.contextmanager
        def aside(*tensors: Tensor):
            side.wait_stream(current)
            with torch.cuda.stream(side):
                yield
            for tensor in tensors:
                tensor.record_stream(side)
        try:
            yield aside
        finally:
            current.wait_stream(side)

    def _own_stream(self, device: torch.device) -> Any:
        """A new CUDA stream of the device, made by CuPy and kept alive here: torch.cuda.Stream()
        hands out a pool of 32 streams in turn, so one could be another branch's."""
        from ...execute import gpu

        cupy = gpu.cupy()
        index = torch.cuda.current_device() if device.index is None else device.index
        with cupy.cuda.Device(index):
            made = cupy.cuda.Stream(non_blocking=True)
        _MADE_STREAMS.append(made)
        return torch.cuda.ExternalStream(made.ptr, device=torch.device("cuda", index))

    def operand(self, tensor: Tensor) -> Any:
        return tensor.data_ptr()

    def synchronize(self, device: torch.device) -> None:
        torch.cuda.synchronize(device)

    @staticmethod
    def mark(device: torch.device, hold_s: float = 0.0) -> torch.cuda.Event | None:
        """A CUDA event recorded now on torch's current stream of `device`, after a kernel that
        spins `hold_s` seconds; None while that stream is being captured into a CUDA graph (a
        timing event is no part of a graph)."""
        if torch.cuda.is_current_stream_capturing():
            return None
        if hold_s:
            torch.cuda._sleep(int(SPIN_CYCLES_PER_S * hold_s))
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(device))
        return event

    @staticmethod
    def elapsed_ms(start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        end.synchronize()
        return start.elapsed_time(end)

    @staticmethod
    def transposed_weights(w: Tensor, groups: int, layout: str) -> Tensor:
        """A copy of `w` with K and C swapped per group, (C, K/groups, *kernel), and the kernel
        flipped, stored in `layout` (ucudnn.core.transposition). The layout is the kernel's, not read
        from w's strides: where w has one channel its strides fit either layout, and the copy,
        with K channels, fits only one."""
        swapped = w.unflatten(0, (groups, w.shape[0] // groups)).transpose(1, 2).flatten(0, 1)
        swapped = swapped.flip(list(range(2, w.dim())))
        fmt = memory_format(layout, w.dim())
        with out_of_memory_as("the transposed weights of a data gradient", w.nbytes):  # its own BD kernel runs instead
            return torch.empty(swapped.shape, dtype=w.dtype, device=w.device, memory_format=fmt).copy_(swapped)

    def time_own(self, problem: ConvProblem, device: torch.device, free: int | None = None) -> OwnTiming:
        """Time torch's own convolution of `problem` on new operands, on the current stream:
        warmed up first (torch's benchmark mode picks its plan on the first call, under the memory
        free then), then timed with CUDA events; its workspace is what it allocates beyond its
        result, read from the caching allocator's running total (peak statistics stay untouched).
        With `free`, a blocker holds all but `free` bytes beyond the result while it runs: torch
        meets the pressure of the kernel's moment in the step (ucudnn.plan.memory). Where the memory
        free cannot hold the operands, torch's kernel is taken as forever slow (the layer is not
        delegated) rather than failing the training step."""
        try:
            return self._time_own(problem, device, free)
        except torch.cuda.OutOfMemoryError:
            return OwnTiming(float("inf"), 0)

    def _time_own(self, problem: ConvProblem, device: torch.device, free: int | None) -> OwnTiming:
        dtype = getattr(torch, problem.dtype)
        fmt = memory_format(problem.layout, len(problem.x_shape))
        x, w, y = (torch.randn(shape, dtype=dtype, device=device).contiguous(memory_format=fmt)
                   for shape in (problem.x_shape, problem.w_shape, problem.y_shape))
        convolve = torch_convolution(problem)
        blocker = None
        if free is not None:
            blocker = torch.empty(max(0, self.pool.free_bytes(device) - free - problem.written_bytes()), dtype=torch.uint8,
                                  device=device)
        free = self.pool.free_bytes(device) - problem.written_bytes()
        with torch.no_grad(), torch.autocast(device.type, enabled=False):
            convolve(x, w, y)
            torch.cuda.synchronize(device)
            before = _allocated_total(device)
            result = convolve(x, w, y)
            workspace = max(0, _allocated_total(device) - before - result.nbytes)
            first = _event_times(lambda: convolve(x, w, y), 1)[0]
            repeats = max(1, min(TORCH_REPEATS, int(TORCH_TIMING_BUDGET_MS / max(first, 1e-3))))
            ms = statistics.median(_event_times(lambda: convolve(x, w, y), repeats))
        del blocker
        return OwnTiming(ms, workspace, free)


class UcudnnKernel:
    """A planned kernel, compiled for its handle's executor: one call runs every micro-batch."""

    via = UCUDNN

    def __init__(self, problem: ConvProblem, handle, assignment, framework: TorchFramework):
        self.problem, self.handle, self.assignment, self.framework = problem, handle, assignment, framework
        self.program = handle.program(problem, assignment.configuration)
        self.counted = (self.via, problem.kind.value)  # its key in Context.runs

    def __call__(self, x: Tensor, w: Tensor, y: Tensor) -> None:
        framework, device = self.framework, x.device
        stream = framework.stream(device)
        if stream is not None and stream != self.handle.stream:
            self.handle.set_stream(stream)
        workspace, size, borrowed = self.assignment.workspace, self.assignment.workspace_size, None
        if size and not workspace:
            borrowed = framework.pool.borrow(size, device)  # released after the call: stream-ordered reuse is safe
            workspace = framework.operand(borrowed)
        self.program(framework.operand(x), framework.operand(w), framework.operand(y), workspace, size)
        del borrowed


class TorchKernel:
    """A kernel ucudnn cannot plan, run by torch's own convolution into the same output tensor."""

    via = TORCH

    def __init__(self, problem: ConvProblem):
        self.problem = problem
        self.counted = (self.via, problem.kind.value)
        self._convolve = torch_convolution(problem)
        self._running = f"{TORCH}'s own {problem.describe()}", problem.written_bytes()  # out_of_memory_as's

    def __call__(self, x: Tensor | None, w: Tensor | None, y: Tensor | None) -> Tensor:
        """torch's result, written into the written operand where one is given (a copy), else
        as torch made it: no second tensor of its size at the kernel's moment."""
        p, written = self.problem, (x, w, y)[self.problem.written]
        # BD reads only x's shape and BF only w's: torch.nn.grad.conv2d_input passes them so. Only
        # the written operand is None: BD's x, whose dy is given
        if x is None:
            assert y is not None
            x = y.new_empty(1).expand(p.x_shape)
        w = x.new_empty(1).expand(p.w_shape) if w is None else w
        with out_of_memory_as(*self._running):
            result = self._convolve(x, w, y)
        return result if written is None else written.copy_(result)


def torch_convolution(problem: ConvProblem) -> Callable[[Tensor, Tensor, Tensor | None], Tensor]:
    """torch's own convolution of `problem`'s kind on (x, w, y): returns y for F, dx for BD (from
    dy = y) and dw for BF, each a new tensor, as torch's layer computes it."""
    p = problem
    args = (list(p.strides), list(p.pads), list(p.dilations), False, [0] * len(p.strides), p.groups)
    if p.kind is F_:
        return lambda x, w, y: torch.ops.aten.convolution(x, w, None, *args)
    mask, index = [p.kind is BD, p.kind is BF, False], 0 if p.kind is BD else 1
    return lambda x, w, y: torch.ops.aten.convolution_backward(y, x, w, None, *args, mask)[index]
