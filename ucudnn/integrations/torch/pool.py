"""torch's memory as ucudnn reads and borrows it (TorchPool): the caching allocator's pool, what
the device has free beyond it, what the process holds outside it, and where running out of it
becomes ucudnn's DeviceMemoryError (out_of_memory_as), on which the Planner runs a smaller kernel."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from ...core.errors import DeviceMemoryError
from ...plan.memory import Memory

# How cuDNN, called by torch, says that it could not get device memory (torch raises them as RuntimeError)
CUDNN_OUT_OF_MEMORY = ("CUDNN_STATUS_ALLOC_FAILED", "CUDNN_STATUS_INTERNAL_ERROR")


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether torch ran out of device memory, or cuDNN failed for it (CUDNN_OUT_OF_MEMORY)."""
    return isinstance(exc, torch.cuda.OutOfMemoryError) or any(status in str(exc) for status in CUDNN_OUT_OF_MEMORY)


@contextlib.contextmanager
def out_of_memory_as(what: str, nbytes: int) -> Iterator[None]:
    """Inside, torch running out of device memory (is_out_of_memory) raises DeviceMemoryError
    for `what`, on which the Planner runs a smaller kernel."""
    try:
        yield
    except RuntimeError as exc:  # torch.cuda.OutOfMemoryError is one
        if not is_out_of_memory(exc):
            raise
        raise DeviceMemoryError(f"{what} ({type(exc).__name__}: {str(exc).splitlines()[0][:80]})", nbytes) from None


class TorchPool:
    """torch's caching allocator and the device beyond it (ucudnn.plan.framework.Pool): what can be
    had, what the process holds outside the pool, what ucudnn holds beside it (CUDA graphs), and
    the planning scope in which ucudnn's own allocations come from the pool."""

    def __init__(self) -> None:
        self._planning_depth = 0  # planning scopes open (planning_scope)

    def free_bytes(self, device: torch.device) -> int:
        """What torch could allocate now in one block, at the least: the device's free memory and
        torch's cached blocks, less the free parts of blocks in use (inactive splits: a large
        allocation cannot take them; torch gives the other cached blocks back to the device and
        allocates afresh). Host counters and one cudaMemGetInfo: no device sync."""
        stats = torch.cuda.memory_stats(device)
        cached = stats["reserved_bytes.all.current"] - stats["allocated_bytes.all.current"]
        return torch.cuda.mem_get_info(device)[0] + cached - stats["inactive_split_bytes.all.current"]

    @staticmethod
    def outside_bytes(device: torch.device | None = None) -> int:
        """What the process holds on the device beyond torch's pool (CUDA's context, kernels'
        code as it is loaded, libraries' handles and buffers): one cudaMemGetInfo, no sync."""
        free, total = torch.cuda.mem_get_info(device)
        return total - free - torch.cuda.memory_reserved(device)

    @staticmethod
    def settled_memory(device: torch.device) -> Memory:
        """The device's free memory and the bytes torch's tensors hold, after torch's unused
        cached blocks went back to the device (a device sync): what torch still holds beyond its
        tensors is then fragments it cannot hand out as one large block."""
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info(device)
        return Memory(free, torch.cuda.memory_allocated(device))

    @staticmethod
    def flushes(device: torch.device) -> int:
        """How often torch's caching allocator has given all its cached blocks back to the device
        to serve an allocation (num_alloc_retries: a device sync, and pages mapped again). The
        nested statistics: torch.cuda.memory_stats would flatten them all first."""
        return torch.cuda.memory.memory_stats_as_nested_dict(device).get("num_alloc_retries", 0)

    @staticmethod
    def grown(device: torch.device) -> int:
        """How often torch's caching allocator has taken memory from the device (num_device_alloc:
        cudaMalloc calls, or pages mapped into an expandable segment)."""
        return torch.cuda.memory.memory_stats_as_nested_dict(device).get("num_device_alloc", 0)

    @staticmethod
    def release(device: torch.device) -> int:
        """Give back what ucudnn holds beside torch's pool that it can make again (CUDA graphs,
        CuPy's cached blocks) and torch's cached blocks; the graphs' bytes."""
        from ...execute import gpu
        from ...execute.graphs import GRAPH_MEMORY

        held = GRAPH_MEMORY.release()
        if gpu.loaded():
            gpu.free_pool()
        torch.cuda.synchronize(device)  # graphs in flight free their memory once they end
        torch.cuda.empty_cache()
        return held

    @staticmethod
    def bound_beside(nbytes: int | None) -> None:
        """What ucudnn may hold beside torch's pool in CUDA graphs from now on (None: unbounded)."""
        from ...execute.graphs import GRAPH_MEMORY

        GRAPH_MEMORY.budget = nbytes

    @staticmethod
    def borrow(nbytes: int, device: torch.device) -> Tensor:
        """Workspace from torch's caching allocator, on the current stream; where it cannot be
        had, DeviceMemoryError (a MemoryError), on which ucudnn plans within less."""
        with out_of_memory_as("a convolution workspace", nbytes):
            return torch.empty(nbytes, dtype=torch.uint8, device=device)

    @contextlib.contextmanager
    def planning_scope(self, device: torch.device) -> Iterator[None]:
        """Inside: ucudnn's own allocations (benchmark operands and workspaces, made through
        CuPy) come from torch's caching allocator, so that one pool serves the training step and
        the benchmark: freed scratch goes back to torch, torch's peak statistics count it, and
        memory pressure is the same for both. Out of memory there is CuPy's, which the benchmark
        records as data. On the way out of the outermost scope torch's unused cached blocks go
        back to the device: the operands and workspaces of the benchmark, and of timing torch's
        own kernels for delegation, would otherwise stay cached in odd sizes and fragment the pool
        the step runs in. Once per outermost scope, not per kernel (Pending.plan opens one around
        its slice), so that each kernel's blocker (TorchFramework.time_own) reuses the last one's
        cached block rather than being mapped afresh, which makes timing torch's kernels faster
        (docs/results-archive.md, "Six models")."""
        from ...execute import gpu

        cupy = gpu.cupy()

        def allocate(nbytes: int) -> Any:
            try:
                block = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)
            except torch.cuda.OutOfMemoryError:
                raise cupy.cuda.memory.OutOfMemoryError(nbytes, torch.cuda.memory_reserved(device)) from None
            return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(block.data_ptr(), block.nbytes, block,
                                                                   block.device.index), 0)

        self._planning_depth += 1
        try:
            with cupy.cuda.using_allocator(allocate):
                yield
        finally:
            self._planning_depth -= 1
            if not self._planning_depth:
                torch.cuda.empty_cache()
