"""The three convolution kernels through one set of functions: kind picks the cuDNN call and
the order of its operands (F: x, w -> y; BD: w, dy -> dx; BF: x, dy -> dw)."""
from __future__ import annotations

from collections.abc import Mapping
from ctypes import byref, c_int, c_size_t, c_void_p
from typing import Any, Protocol

from ...core.problem import ConvKind
from . import cudnn
from .enums import AlgoPerf, algo_count

ROLES = {ConvKind.FORWARD: ("x", "w", "y"), ConvKind.BACKWARD_DATA: ("w", "y", "x"),
         ConvKind.BACKWARD_FILTER: ("x", "y", "w")}
_NAME = {ConvKind.FORWARD: "ConvolutionForward", ConvKind.BACKWARD_DATA: "ConvolutionBackwardData",
         ConvKind.BACKWARD_FILTER: "ConvolutionBackwardFilter"}


class Descriptors(Protocol):
    """A kernel's descriptors by role ("x", "w", "y", "conv"): a KernelDescriptors, or a dict."""

    def __getitem__(self, role: str, /) -> Any: ...


def function_name(kind: ConvKind) -> str:
    """The cuDNN function that runs this kind of kernel, e.g. cudnnConvolutionBackwardData."""
    return f"cudnn{_NAME[kind]}"


def _descs(kind: ConvKind, descs: Descriptors) -> tuple:
    first, second, out = ROLES[kind]
    return descs[first], descs[second], descs["conv"], descs[out]


def workspace_size(handle, kind: ConvKind, descs: Descriptors, algo: int) -> int:
    size = c_size_t()
    cudnn.call(f"cudnnGet{_NAME[kind]}WorkspaceSize", handle, *_descs(kind, descs), algo, byref(size))
    return size.value


def get_algorithms(handle, kind: ConvKind, descs: Descriptors) -> list[AlgoPerf]:
    """cudnnGet*Algorithm_v7: cuDNN's heuristic ranking (no execution)."""
    perf, returned = (AlgoPerf * algo_count(kind))(), c_int()
    cudnn.call(f"cudnnGet{_NAME[kind]}Algorithm_v7", handle, *_descs(kind, descs), len(perf),
               byref(returned), perf)
    return list(perf[:returned.value])


def find_algorithms(handle, kind: ConvKind, descs: Descriptors, ptrs: Mapping[str, int], workspace: int,
                    workspace_size: int) -> list[AlgoPerf]:
    """cudnnFind*AlgorithmEx: runs every algorithm once within the given workspace."""
    first, second, out = ROLES[kind]
    perf, returned = (AlgoPerf * algo_count(kind))(), c_int()
    cudnn.call(f"cudnnFind{_NAME[kind]}AlgorithmEx", handle, descs[first], c_void_p(ptrs[first]),
               descs[second], c_void_p(ptrs[second]), descs["conv"], descs[out], c_void_p(ptrs[out]),
               len(perf), byref(returned), perf, c_void_p(workspace), workspace_size)
    return list(perf[:returned.value])


def convolve(handle, kind: ConvKind, descs: Descriptors, ptrs: Mapping[str, int], algo: int,
             workspace: int, workspace_size: int, alpha: float, beta: float, dtype: str) -> None:
    """out = alpha * conv(inputs) + beta * out, with algorithm `algo`."""
    first, second, out = ROLES[kind]
    cudnn.call(function_name(kind), handle, byref(cudnn.scalar(alpha, dtype)), descs[first],
               c_void_p(ptrs[first]), descs[second], c_void_p(ptrs[second]), descs["conv"], algo,
               c_void_p(workspace), workspace_size, byref(cudnn.scalar(beta, dtype)), descs[out],
               c_void_p(ptrs[out]))
