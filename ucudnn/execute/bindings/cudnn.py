"""The cuDNN prototypes ucudnn calls, declared in one table, and checked calls through them.

Every call goes through `call(name, *args)`, which raises CudnnError naming the function and
the status when cuDNN returns anything but CUDNN_STATUS_SUCCESS.
"""
from __future__ import annotations

import ctypes
from ctypes import POINTER, c_char_p, c_float, c_int, c_size_t, c_void_p
from typing import Protocol

from ...core.errors import CudnnError, GpuUnavailableError
from . import library
from .enums import SUCCESS, AlgoPerf

P = c_void_p  # every opaque cuDNN object, device pointer and stream


class Parameter(Protocol):
    """What ctypes passes in an object's place, its `_as_parameter_` (a Descriptor, a ucudnn.Handle)."""

    @property
    def _as_parameter_(self) -> Pointer: ...


# What a P argument takes: a cuDNN handle, a descriptor or an address, as ctypes passes them (None: NULL)
Pointer = c_void_p | int | Parameter | None
INT_P, SIZE_P, PERF_P = POINTER(c_int), POINTER(c_size_t), POINTER(AlgoPerf)

# name: argument types (every function returns cudnnStatus_t unless listed in _RETURNS)
PROTOTYPES: dict[str, list] = {
    "cudnnGetVersion": [],
    "cudnnGetErrorString": [c_int],
    "cudnnCreate": [POINTER(P)],
    "cudnnDestroy": [P],
    "cudnnSetStream": [P, P],
    "cudnnGetStream": [P, POINTER(P)],
    "cudnnCreateTensorDescriptor": [POINTER(P)],
    "cudnnSetTensorNdDescriptor": [P, c_int, c_int, INT_P, INT_P],
    "cudnnGetTensorNdDescriptor": [P, c_int, INT_P, INT_P, INT_P, INT_P],
    "cudnnDestroyTensorDescriptor": [P],
    "cudnnCreateFilterDescriptor": [POINTER(P)],
    "cudnnSetFilterNdDescriptor": [P, c_int, c_int, c_int, INT_P],
    "cudnnGetFilterNdDescriptor": [P, c_int, INT_P, INT_P, INT_P, INT_P],
    "cudnnDestroyFilterDescriptor": [P],
    "cudnnCreateConvolutionDescriptor": [POINTER(P)],
    "cudnnSetConvolutionNdDescriptor": [P, c_int, INT_P, INT_P, INT_P, c_int, c_int],
    "cudnnGetConvolutionNdDescriptor": [P, c_int, INT_P, INT_P, INT_P, INT_P, INT_P, INT_P],
    "cudnnSetConvolutionGroupCount": [P, c_int],
    "cudnnGetConvolutionGroupCount": [P, INT_P],
    "cudnnSetConvolutionMathType": [P, c_int],
    "cudnnGetConvolutionMathType": [P, INT_P],
    "cudnnDestroyConvolutionDescriptor": [P],
    # The three kernels share argument shapes: (input1, input2, output) descriptors in cuDNN's
    # order: F (x, w, y), BD (w, dy, dx), BF (x, dy, dw).
    **{f"cudnnGet{k}Algorithm_v7": [P, P, P, P, P, c_int, INT_P, PERF_P] for k in
       ("ConvolutionForward", "ConvolutionBackwardData", "ConvolutionBackwardFilter")},
    **{f"cudnnFind{k}AlgorithmEx": [P, P, P, P, P, P, P, P, c_int, INT_P, PERF_P, P, c_size_t] for k in
       ("ConvolutionForward", "ConvolutionBackwardData", "ConvolutionBackwardFilter")},
    **{f"cudnnGet{k}WorkspaceSize": [P, P, P, P, P, c_int, SIZE_P] for k in
       ("ConvolutionForward", "ConvolutionBackwardData", "ConvolutionBackwardFilter")},
    **{k: [P, P, P, P, P, P, P, c_int, P, c_size_t, P, P, P] for k in
       ("cudnnConvolutionForward", "cudnnConvolutionBackwardData", "cudnnConvolutionBackwardFilter")},
}
_RETURNS = {"cudnnGetVersion": c_size_t, "cudnnGetErrorString": c_char_p}

_lib: ctypes.CDLL | None = None
library_path: str | None = None


def lib() -> ctypes.CDLL:
    """The loaded library with every prototype declared (loaded on first use)."""
    global _lib, library_path
    if _lib is None:
        loaded, library_path = library.load()
        for name, argtypes in PROTOTYPES.items():
            function = getattr(loaded, name)
            function.argtypes, function.restype = argtypes, _RETURNS.get(name, c_int)
        _lib = loaded
    return _lib


def status_name(status: int) -> str:
    return lib().cudnnGetErrorString(status).decode()


def call(name: str, *args) -> None:
    status = getattr(lib(), name)(*args)
    if status != SUCCESS:
        raise CudnnError(name, status, status_name(status))


def version() -> int:
    """e.g. 91900 for cuDNN 9.19.0."""
    return int(lib().cudnnGetVersion())


def create_handle(stream: int | None = None) -> c_void_p:
    """A new cuDNN handle, on `stream` if given (else cuDNN's default, the legacy stream)."""
    handle = c_void_p()
    try:
        call("cudnnCreate", ctypes.byref(handle))
    except CudnnError as exc:
        if exc.status_name != "CUDNN_STATUS_NOT_INITIALIZED":
            raise
        # what cuDNN says where its library loads but no GPU or driver is usable
        raise GpuUnavailableError(f"cuDNN cannot start: {exc}; no usable NVIDIA GPU or driver here "
                                  "(nvidia-smi should list one)") from None
    if stream is not None:
        set_stream(handle, stream)
    return handle


def destroy_handle(handle: Pointer) -> None:
    call("cudnnDestroy", handle)


def set_stream(handle: Pointer, stream: int) -> None:
    call("cudnnSetStream", handle, c_void_p(stream))


def get_stream(handle: Pointer) -> int:
    """The stream `handle` queues its work on (0: the legacy default stream)."""
    stream = c_void_p()
    call("cudnnGetStream", handle, ctypes.byref(stream))
    return stream.value or 0


def scalar(value: float, dtype: str):
    """alpha/beta as cuDNN wants them: double for double data, float otherwise."""
    return ctypes.c_double(value) if dtype == "float64" else c_float(value)
