"""The executor of dispatch steps on the GPU: one cuDNN call per step, on device addresses."""
from __future__ import annotations

from ..dispatch import Step
from ..problem import ConvProblem
from .convolution import convolve
from .descriptors import KernelDescriptors


class CudnnExecutor:
    """Runs dispatch steps with cuDNN on device pointers; descriptors are built once per size."""

    def __init__(self, handle):
        self.handle = handle
        self._descriptors: dict[str, KernelDescriptors] = {}

    def descriptors(self, p: ConvProblem) -> KernelDescriptors:
        if p.key not in self._descriptors:
            self._descriptors[p.key] = KernelDescriptors(p)
        return self._descriptors[p.key]

    def __call__(self, step: Step, x: int, w: int, y: int, workspace: int, workspace_size: int) -> None:
        ptrs = {"x": x + step.x_offset, "w": w, "y": y + step.y_offset}
        convolve(self.handle, step.problem.kind, self.descriptors(step.problem), ptrs, step.algo,
                 workspace, workspace_size, step.alpha, step.beta, step.problem.dtype)
