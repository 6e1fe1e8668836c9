"""cuDNN's convolution API in Python, drop-in for ucudnn: every function takes either a plain
cuDNN handle (from `create()`) or a `ucudnn.Handle`, so swapping the handle object is the only
change a caller makes. With a plain handle the call goes straight to cuDNN. With a ucudnn
handle, algorithm queries answer a virtual algorithm and zero workspace, and the convolutions
run micro-batched (the algorithm and workspace arguments are then ignored).

Descriptors are cuDNN's own (`TensorDescriptor`, `FilterDescriptor`, `ConvolutionDescriptor`
here, or raw addresses made elsewhere); data arguments are device addresses or CuPy/torch arrays.
"""
from __future__ import annotations

from .core.problem import ConvKind
from .execute.bindings import convolution as _conv, cudnn as _cudnn
from .execute.bindings.cudnn import Pointer
from .execute.bindings.descriptors import ConvolutionDescriptor, FilterDescriptor, TensorDescriptor, read_problem
from .execute.bindings.enums import VIRTUAL_ALGO, AlgoPerf
from .execute.gpu import Buffer, pointer
from .handle import Handle

F, BD, BF = ConvKind.FORWARD, ConvKind.BACKWARD_DATA, ConvKind.BACKWARD_FILTER
__all__ = ["create", "destroy", "set_stream", "get_version", "TensorDescriptor", "FilterDescriptor",
           "ConvolutionDescriptor", "AlgoPerf", "Handle"]

create, destroy, get_version = _cudnn.create_handle, _cudnn.destroy_handle, _cudnn.version
AnyHandle = Handle | Pointer  # a ucudnn.Handle, or a plain cuDNN handle (create())
Descriptors = dict[str, Pointer]  # by role: x, w, y, conv
Buffers = dict[str, Buffer]  # by role: x, w, y


def set_stream(handle: AnyHandle, stream: int) -> None:
    if isinstance(handle, Handle):
        handle.set_stream(stream)
    else:
        _cudnn.set_stream(handle, stream)


def _virtual() -> list[AlgoPerf]:
    perf = AlgoPerf()
    perf.algo, perf.status, perf.time, perf.memory = VIRTUAL_ALGO, 0, 0.0, 0
    return [perf]


def _get(handle: AnyHandle, kind: ConvKind, descs: Descriptors) -> list[AlgoPerf]:
    if isinstance(handle, Handle):
        handle.query(read_problem(kind, descs["x"], descs["w"], descs["conv"]))
        return _virtual()
    return _conv.get_algorithms(handle, kind, descs)


def _find(handle: AnyHandle, kind: ConvKind, descs: Descriptors, ptrs: Buffers, workspace: Buffer,
          workspace_size: int) -> list[AlgoPerf]:
    if isinstance(handle, Handle):
        return _get(handle, kind, descs)
    return _conv.find_algorithms(handle, kind, descs, {k: pointer(v) for k, v in ptrs.items()},
                                 pointer(workspace), workspace_size)


def _workspace(handle: AnyHandle, kind: ConvKind, descs: Descriptors, algo: int) -> int:
    if isinstance(handle, Handle):
        return handle.query(read_problem(kind, descs["x"], descs["w"], descs["conv"]))[1]
    return _conv.workspace_size(handle, kind, descs, algo)


def _convolve(handle: AnyHandle, kind: ConvKind, descs: Descriptors, ptrs: Buffers, algo: int, workspace: Buffer,
              workspace_size: int, alpha: float, beta: float) -> None:
    problem = read_problem(kind, descs["x"], descs["w"], descs["conv"])
    if isinstance(handle, Handle):
        handle.convolve(problem, ptrs["x"], ptrs["w"], ptrs["y"], alpha, beta)
    else:
        _conv.convolve(handle, kind, descs, {k: pointer(v) for k, v in ptrs.items()}, algo,
                       pointer(workspace), workspace_size, alpha, beta, problem.dtype)


# Forward: x, w -> y
def get_convolution_forward_algorithm_v7(handle: AnyHandle, x_desc: Pointer, w_desc: Pointer, conv_desc: Pointer,
                                         y_desc: Pointer) -> list[AlgoPerf]:
    return _get(handle, F, dict(x=x_desc, w=w_desc, conv=conv_desc, y=y_desc))


def find_convolution_forward_algorithm_ex(handle: AnyHandle, x_desc: Pointer, x: Buffer, w_desc: Pointer, w: Buffer,
                                          conv_desc: Pointer, y_desc: Pointer, y: Buffer, workspace: Buffer = 0,
                                          workspace_size: int = 0) -> list[AlgoPerf]:
    return _find(handle, F, dict(x=x_desc, w=w_desc, conv=conv_desc, y=y_desc), dict(x=x, w=w, y=y),
                 workspace, workspace_size)


def get_convolution_forward_workspace_size(handle: AnyHandle, x_desc: Pointer, w_desc: Pointer, conv_desc: Pointer,
                                           y_desc: Pointer, algo: int) -> int:
    return _workspace(handle, F, dict(x=x_desc, w=w_desc, conv=conv_desc, y=y_desc), algo)


def convolution_forward(handle: AnyHandle, alpha: float, x_desc: Pointer, x: Buffer, w_desc: Pointer, w: Buffer,
                        conv_desc: Pointer, algo: int, workspace: Buffer, workspace_size: int, beta: float,
                        y_desc: Pointer, y: Buffer) -> None:
    _convolve(handle, F, dict(x=x_desc, w=w_desc, conv=conv_desc, y=y_desc), dict(x=x, w=w, y=y),
              algo, workspace, workspace_size, alpha, beta)


# BackwardData: w, dy -> dx
def get_convolution_backward_data_algorithm_v7(handle: AnyHandle, w_desc: Pointer, dy_desc: Pointer,
                                               conv_desc: Pointer, dx_desc: Pointer) -> list[AlgoPerf]:
    return _get(handle, BD, dict(x=dx_desc, w=w_desc, conv=conv_desc, y=dy_desc))


def find_convolution_backward_data_algorithm_ex(handle: AnyHandle, w_desc: Pointer, w: Buffer, dy_desc: Pointer,
                                                dy: Buffer, conv_desc: Pointer, dx_desc: Pointer, dx: Buffer,
                                                workspace: Buffer = 0, workspace_size: int = 0) -> list[AlgoPerf]:
    return _find(handle, BD, dict(x=dx_desc, w=w_desc, conv=conv_desc, y=dy_desc), dict(x=dx, w=w, y=dy),
                 workspace, workspace_size)


def get_convolution_backward_data_workspace_size(handle: AnyHandle, w_desc: Pointer, dy_desc: Pointer,
                                                 conv_desc: Pointer, dx_desc: Pointer, algo: int) -> int:
    return _workspace(handle, BD, dict(x=dx_desc, w=w_desc, conv=conv_desc, y=dy_desc), algo)


def convolution_backward_data(handle: AnyHandle, alpha: float, w_desc: Pointer, w: Buffer, dy_desc: Pointer,
                              dy: Buffer, conv_desc: Pointer, algo: int, workspace: Buffer, workspace_size: int,
                              beta: float, dx_desc: Pointer, dx: Buffer) -> None:
    _convolve(handle, BD, dict(x=dx_desc, w=w_desc, conv=conv_desc, y=dy_desc), dict(x=dx, w=w, y=dy),
              algo, workspace, workspace_size, alpha, beta)


# BackwardFilter: x, dy -> dw
def get_convolution_backward_filter_algorithm_v7(handle: AnyHandle, x_desc: Pointer, dy_desc: Pointer,
                                                 conv_desc: Pointer, dw_desc: Pointer) -> list[AlgoPerf]:
    return _get(handle, BF, dict(x=x_desc, w=dw_desc, conv=conv_desc, y=dy_desc))


def find_convolution_backward_filter_algorithm_ex(handle: AnyHandle, x_desc: Pointer, x: Buffer, dy_desc: Pointer,
                                                  dy: Buffer, conv_desc: Pointer, dw_desc: Pointer, dw: Buffer,
                                                  workspace: Buffer = 0, workspace_size: int = 0) -> list[AlgoPerf]:
    return _find(handle, BF, dict(x=x_desc, w=dw_desc, conv=conv_desc, y=dy_desc), dict(x=x, w=dw, y=dy),
                 workspace, workspace_size)


def get_convolution_backward_filter_workspace_size(handle: AnyHandle, x_desc: Pointer, dy_desc: Pointer,
                                                   conv_desc: Pointer, dw_desc: Pointer, algo: int) -> int:
    return _workspace(handle, BF, dict(x=x_desc, w=dw_desc, conv=conv_desc, y=dy_desc), algo)


def convolution_backward_filter(handle: AnyHandle, alpha: float, x_desc: Pointer, x: Buffer, dy_desc: Pointer,
                                dy: Buffer, conv_desc: Pointer, algo: int, workspace: Buffer, workspace_size: int,
                                beta: float, dw_desc: Pointer, dw: Buffer) -> None:
    _convolve(handle, BF, dict(x=x_desc, w=dw_desc, conv=conv_desc, y=dy_desc), dict(x=x, w=dw, y=dy),
              algo, workspace, workspace_size, alpha, beta)
