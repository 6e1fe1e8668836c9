"""Test doubles of ucudnn.torch's GPU side: a handle over real Assignments with a fake benchmarker
and the NumPy executor (handle_doubles), and a framework that runs 'ucudnn' kernels on CPU tensors."""
from __future__ import annotations

import contextlib

import torch

from ucudnn.integrations.torch import TorchFramework
from ucudnn.plan.framework import OwnTiming
from ucudnn.plan.memory import Memory

from handle_doubles import NumpyHandle


class NumpyFramework(TorchFramework):
    """Runs 'ucudnn' kernels on CPU tensors: operands are flat NumPy views of their memory.
    torch's own kernels 'take' `torch_timing(problem)`: by default forever, so that layers are
    never delegated to torch unless a test says otherwise; `timed` lists the kernels timed. It is
    its own pool (`pool`: free_bytes, settled_memory, borrow, ...)."""

    handle_class = NumpyHandle

    def __init__(self, torch_timing=lambda problem: OwnTiming(float("inf"), 0), memory=Memory(2**40, 0)):
        super().__init__()
        self.pool = self
        self.torch_timing = torch_timing
        self.timed = []
        self.pressures = []  # per timing of torch's kernels: the bytes left free for it (None: no blocker)
        self.timed_planning = []  # per timing of torch's kernels: whether inside the planning scope
        self.memory_now = memory  # what settled_memory() reports: set it to simulate the device's state
        self._planning = 0
        self.streams, self.marked, self.aside = [], [], False  # side_stream's log
        self.flushed, self.flush_at = 0, float("inf")  # flushes so far; borrows above flush_at flush
        self.releases, self.bounds = 0, []  # release() calls, bound_beside() budgets

    @contextlib.contextmanager
    def planning_scope(self, device):
        self._planning += 1
        try:
            yield
        finally:
            self._planning -= 1

    @contextlib.contextmanager
    def side_stream(self, device):
        """Context.beside's side stream: `aside` sets `self.aside` while its body runs and lists
        the tensors it was given in `marked`; `streams` logs "opened" and "joined"."""
        self.streams.append("opened")

        @contextlib.contextmanager
        def aside(*tensors):
            self.aside = True
            try:
                yield
            finally:
                self.aside = False
            self.marked.extend(tensors)
        try:
            yield aside
        finally:
            self.streams.append("joined")

    def settled_memory(self, device):
        return self.memory_now

    def free_bytes(self, device):
        return self.memory_now.free

    def outside_bytes(self, device):  # nothing beside the pretend pool
        return 0

    def flushes(self, device):  # none, unless a test's borrow says so (flush_at)
        return self.flushed

    def grown(self, device):  # the pretend pool never grows
        return 0

    def borrow(self, nbytes, device):
        """Workspace on the CPU; a borrow of more than `flush_at` bytes counts as a flush."""
        if nbytes > self.flush_at:
            self.flushed += 1
        return torch.empty(nbytes, dtype=torch.uint8)

    def mark(self, device, hold_s=0.0):  # no marks: torch's kernels take what torch_timing says (Clocked marks them)
        return None

    @staticmethod
    def elapsed_ms(start, end):
        return (end - start) * 1e3


    def time_own(self, problem, device, free=None):
        self.timed.append(problem)
        self.pressures.append(free)
        self.timed_planning.append(self._planning > 0)
        return self.torch_timing(problem)

    def runs_on(self, device):
        return device.type == "cpu"

    def device_guard(self, device):
        return contextlib.nullcontext()

    def stream(self, device):
        return None

    def make_handle(self, settings, cache, device):
        return self.handle_class(settings, cache)

    def operand(self, tensor):
        return tensor.detach().as_strided((tensor.numel(),), (1,)).numpy()

    def synchronize(self, device):
        pass

    def release(self, device):  # nothing held beside the pretend pool; each release counted
        self.releases += 1
        return 0

    def bound_beside(self, nbytes):  # each graph budget set, listed
        self.bounds.append(nbytes)


class Clocked(NumpyFramework):
    """Marks on a clock that moves a microsecond a mark, standing in for CUDA events on CPU
    tensors: a layer's own kernels are seen in the step (quick, whatever the host's load) rather
    than taken from torch_timing."""

    ticks = 0

    def mark(self, device, hold_s=0.0):
        self.ticks += 1
        return self.ticks * 1e-6
