"""Plans of dispatch steps on cuDNN's legacy API: one direct ctypes call per step, on device addresses."""
from __future__ import annotations

from ctypes import byref

from ...core.errors import CudnnError
from ...core.problem import ConvProblem
from ..dispatch import Plan, Step
from . import cudnn
from .convolution import ROLES, function_name, workspace_size
from .descriptors import KernelDescriptors

_INDEX = {"x": 0, "w": 1, "y": 2}


class CudnnExecutor:
    """Prepares each step's plan as one direct ctypes call: descriptors, scalars and the function
    are looked up once, so a call costs little more than cuDNN's own launch. cuDNN's legacy calls
    take alpha and beta: the plan applies the step's route's own."""

    def __init__(self, handle) -> None:
        self.handle = handle
        self._descriptors: dict[str, KernelDescriptors] = {}

    def descriptors(self, p: ConvProblem) -> KernelDescriptors:
        if p.key not in self._descriptors:
            self._descriptors[p.key] = KernelDescriptors(p)
        return self._descriptors[p.key]

    def plan(self, step: Step, algo: int) -> Plan:
        """`step` as a call of cuDNN's algorithm number `algo` for its kind."""
        p = step.problem
        descs = self.descriptors(p)
        name = function_name(p.kind)
        function = getattr(cudnn.lib(), name)
        alpha, beta = cudnn.scalar(step.route.alpha, p.dtype), cudnn.scalar(step.route.beta, p.dtype)
        i1, i2 = (_INDEX[r] for r in ROLES[p.kind][:2])
        d1, d2, d3 = (descs[r] for r in ROLES[p.kind])
        handle, conv, alpha_ref, beta_ref = self.handle, descs.conv, byref(alpha), byref(beta)

        def run(x: int, w: int, y: int, out: int, workspace: int, workspace_size: int) -> None:
            operands = (x, w, y)
            status = function(handle, alpha_ref, d1, operands[i1], d2, operands[i2], conv, algo,
                              workspace, workspace_size, beta_ref, d3, out)
            if status:
                raise CudnnError(name, status, cudnn.status_name(status))

        # the scalars and descriptors must outlive the call (mypy types no attributes of functions)
        run.keep = (alpha, beta, descs)  # type: ignore[attr-defined]
        return Plan(run, workspace_size(self.handle, p.kind, descs, algo))
