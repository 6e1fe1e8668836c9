"""The executor of dispatch steps on the GPU: one cuDNN call per step, on device addresses."""
from __future__ import annotations

from ctypes import byref

from ..dispatch import Call, Step
from ..errors import CudnnError
from ..problem import ConvProblem
from . import cudnn
from .convolution import ROLES, function_name
from .enums import algo_number
from .descriptors import KernelDescriptors

_INDEX = {"x": 0, "w": 1, "y": 2}


class CudnnExecutor:
    """Prepares each step as one direct ctypes call: descriptors, scalars and the function are
    looked up once, so a call costs little more than cuDNN's own launch."""

    def __init__(self, handle):
        self.handle = handle
        self._descriptors: dict[str, KernelDescriptors] = {}

    def descriptors(self, p: ConvProblem) -> KernelDescriptors:
        if p.key not in self._descriptors:
            self._descriptors[p.key] = KernelDescriptors(p)
        return self._descriptors[p.key]

    def prepare(self, step: Step) -> Call:
        p = step.problem
        descs = self.descriptors(p)
        name = function_name(p.kind)
        function = getattr(cudnn.lib(), name)
        alpha, beta = cudnn.scalar(step.alpha, p.dtype), cudnn.scalar(step.call_beta, p.dtype)
        offsets = {"x": step.x_offset, "w": 0, "y": step.y_offset}
        (i1, o1), (i2, o2), (i3, o3) = ((_INDEX[r], offsets[r]) for r in ROLES[p.kind])
        d1, d2, d3 = (descs[r] for r in ROLES[p.kind])
        handle, conv, alpha_ref, beta_ref = self.handle, descs.conv, byref(alpha), byref(beta)
        algo = algo_number(p.kind, step.algo.partition(":")[2])

        def call(x: int, w: int, y: int, workspace: int, workspace_size: int) -> None:
            operands = (x, w, y)
            status = function(handle, alpha_ref, d1, operands[i1] + o1, d2, operands[i2] + o2, conv, algo,
                              workspace, workspace_size, beta_ref, d3, operands[i3] + o3)
            if status:
                raise CudnnError(name, status, cudnn.status_name(status))

        call.keep = (alpha, beta, descs)  # the scalars and descriptors must outlive the call
        return call
