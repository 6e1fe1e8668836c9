"""Where kernels run: torch's CUDA tensors and streams (CudaBackend), a planned ucudnn kernel
(one graph launch per call), and torch's own convolution for what ucudnn cannot plan."""
from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch
from torch import Tensor

from ...config import Settings
from ...problem import ConvKind, ConvProblem

F_, BD, BF = ConvKind.FORWARD, ConvKind.BACKWARD_DATA, ConvKind.BACKWARD_FILTER

# The current stream's address without building a torch.cuda.Stream: ~10x cheaper per call.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _no_persistent_workspace(nbytes: int) -> int:
    """WR plans get no buffer of their own (address 0): each call borrows its workspace from
    torch's caching allocator instead, as torch's own convolutions do, so workspaces of
    different layers share memory rather than add up."""
    return 0


class CudaBackend:
    """Runs kernels on CUDA tensors through ucudnn.Handle, on torch's current stream."""

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

    def make_handle(self, settings: Settings, cache, device: torch.device):
        from ...handle import Handle

        torch.backends.cudnn.version()  # loads torch's libcudnn, so ucudnn's bindings use the same one
        if settings.optimizer == "wd":  # one persistent buffer for the network, divided (and late kernels)
            allocator = functools.partial(self.borrow, device=device)
        else:
            allocator = _no_persistent_workspace
        return Handle(settings, cache=cache, allocator=allocator, stream=self.stream(device))

    def borrow(self, nbytes: int, device: torch.device) -> Tensor:
        """Workspace for one call from torch's caching allocator, on the current stream."""
        return torch.empty(nbytes, dtype=torch.uint8, device=device)

    def operand(self, tensor: Tensor) -> Any:
        return tensor.data_ptr()

    def synchronize(self, device: torch.device) -> None:
        torch.cuda.synchronize(device)


class UcudnnKernel:
    """A planned kernel, compiled for its handle's executor: one call runs every micro-batch."""

    via = "ucudnn"

    def __init__(self, problem: ConvProblem, handle, assignment, backend: CudaBackend):
        self.problem, self.handle, self.assignment, self.backend = problem, handle, assignment, backend
        self.program = handle.program(problem, assignment.configuration)
        self.counted = (self.via, problem.kind.value)  # its key in Context.runs

    def __call__(self, x: Tensor, w: Tensor, y: Tensor) -> None:
        backend, device = self.backend, x.device
        stream = backend.stream(device)
        if stream is not None and stream != self.handle.stream:
            self.handle.set_stream(stream)
        workspace, size, borrowed = self.assignment.workspace, self.assignment.workspace_size, None
        if size and not workspace:
            borrowed = backend.borrow(size, device)  # released after the call: stream-ordered reuse is safe
            workspace = backend.operand(borrowed)
        self.program(backend.operand(x), backend.operand(w), backend.operand(y), workspace, size)
        del borrowed


class TorchKernel:
    """A kernel ucudnn cannot plan, run by torch's own convolution into the same output tensor."""

    via = "torch"

    def __init__(self, problem: ConvProblem):
        self.problem = problem
        self.counted = (self.via, problem.kind.value)

    def __call__(self, x: Tensor, w: Tensor, y: Tensor) -> None:
        p = self.problem
        args = (list(p.strides), list(p.pads), list(p.dilations), False, [0, 0], p.groups)
        if p.kind is F_:
            y.copy_(torch.ops.aten.convolution(x, w, None, *args))
            return
        dx, dw, _ = torch.ops.aten.convolution_backward(y, x, w, None, *args, [p.kind is BD, p.kind is BF, False])
        (x if p.kind is BD else w).copy_(dx if p.kind is BD else dw)
