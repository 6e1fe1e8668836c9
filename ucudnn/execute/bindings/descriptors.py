"""cuDNN tensor, filter and convolution descriptors: built from a ConvProblem, or read back
from descriptors a framework made (so a ucudnn.Handle can see what it is asked to run)."""
from __future__ import annotations

import ctypes
from ctypes import byref, c_int, c_void_p

from ...core.errors import UnsupportedProblemError
from ...core.problem import ConvKind, ConvProblem
from . import cudnn
from .enums import CONV_MODE, DATA_TYPE, MATH_TYPE, TENSOR_FORMAT

MAX_DIMS = 8  # CUDNN_DIM_MAX
MAX_CONV_DIMS = MAX_DIMS - 2  # cudnnGetConvolutionNdDescriptor refuses more
_NAMES = {value: name for name, value in DATA_TYPE.items()}


def _ints(values) -> ctypes.Array:
    return (c_int * len(values))(*values)


class Descriptor:
    """Owns one cuDNN descriptor; passes to ctypes calls as the raw pointer."""

    kind = ""  # "Tensor", "Filter" or "Convolution"

    def __init__(self):
        self._as_parameter_ = c_void_p()
        cudnn.call(f"cudnnCreate{self.kind}Descriptor", byref(self._as_parameter_))

    def __del__(self):
        if getattr(self, "_as_parameter_", None) and cudnn._lib is not None:
            getattr(cudnn.lib(), f"cudnnDestroy{self.kind}Descriptor")(self._as_parameter_)


class TensorDescriptor(Descriptor):
    kind = "Tensor"

    def __init__(self, dtype: str, shape: tuple[int, ...], layout: str):
        super().__init__()
        cudnn.call("cudnnSetTensorNdDescriptor", self, DATA_TYPE[dtype], len(shape), _ints(shape),
                   _ints(packed_strides(shape, layout)))


class FilterDescriptor(Descriptor):
    kind = "Filter"

    def __init__(self, dtype: str, shape: tuple[int, ...], layout: str):
        super().__init__()
        cudnn.call("cudnnSetFilterNdDescriptor", self, DATA_TYPE[dtype], TENSOR_FORMAT[layout],
                   len(shape), _ints(shape))


class ConvolutionDescriptor(Descriptor):
    kind = "Convolution"

    def __init__(self, p: ConvProblem):
        super().__init__()
        cudnn.call("cudnnSetConvolutionNdDescriptor", self, p.spatial_dims, _ints(p.pads),
                   _ints(p.strides), _ints(p.dilations), CONV_MODE[p.mode], DATA_TYPE[p.compute_type])
        cudnn.call("cudnnSetConvolutionGroupCount", self, p.groups)
        cudnn.call("cudnnSetConvolutionMathType", self, MATH_TYPE[p.math])


def packed_strides(shape: tuple[int, ...], layout: str) -> list[int]:
    """Element strides of a packed tensor, listed in logical (N, C, *spatial) order."""
    order = [0, *range(2, len(shape)), 1] if layout == "nhwc" else list(range(len(shape)))
    strides, step = [0] * len(shape), 1
    for axis in reversed(order):
        strides[axis], step = step, step * shape[axis]
    return strides


class KernelDescriptors:
    """The four descriptors of one ConvProblem, by role: x, w, y and conv."""

    def __init__(self, p: ConvProblem):
        self.problem = p
        self.x = TensorDescriptor(p.dtype, p.x_shape, p.layout)
        self.y = TensorDescriptor(p.dtype, p.y_shape, p.layout)
        self.w = FilterDescriptor(p.dtype, p.w_shape, p.layout)
        self.conv = ConvolutionDescriptor(p)

    def __getitem__(self, role: str) -> Descriptor:
        return getattr(self, role)


def _read_tensor(desc) -> tuple[str, list[int], list[int]]:
    dtype, nb = c_int(), c_int()
    dims, strides = (c_int * MAX_DIMS)(), (c_int * MAX_DIMS)()
    cudnn.call("cudnnGetTensorNdDescriptor", desc, MAX_DIMS, byref(dtype), byref(nb), dims, strides)
    return _NAMES.get(dtype.value, f"type{dtype.value}"), list(dims[:nb.value]), list(strides[:nb.value])


def _read_filter(desc) -> tuple[str, str, list[int]]:
    dtype, fmt, nb = c_int(), c_int(), c_int()
    dims = (c_int * MAX_DIMS)()
    cudnn.call("cudnnGetFilterNdDescriptor", desc, MAX_DIMS, byref(dtype), byref(fmt), byref(nb), dims)
    layout = {v: k for k, v in TENSOR_FORMAT.items()}.get(fmt.value, f"format{fmt.value}")
    return _NAMES.get(dtype.value, f"type{dtype.value}"), layout, list(dims[:nb.value])


def _read_convolution(desc) -> dict:
    n, mode, compute, groups, math = c_int(), c_int(), c_int(), c_int(), c_int()
    pads, strides, dils = ((c_int * MAX_CONV_DIMS)() for _ in range(3))
    cudnn.call("cudnnGetConvolutionNdDescriptor", desc, MAX_CONV_DIMS, byref(n), pads, strides, dils,
               byref(mode), byref(compute))
    cudnn.call("cudnnGetConvolutionGroupCount", desc, byref(groups))
    cudnn.call("cudnnGetConvolutionMathType", desc, byref(math))
    return dict(pads=tuple(pads[:n.value]), strides=tuple(strides[:n.value]),
                dilations=tuple(dils[:n.value]), groups=groups.value,
                mode={v: k for k, v in CONV_MODE.items()}[mode.value],
                compute_type=_NAMES[compute.value], math={v: k for k, v in MATH_TYPE.items()}[math.value])


def read_problem(kind: ConvKind | str, x_desc, w_desc, conv_desc) -> ConvProblem:
    """The ConvProblem that descriptors describe; x_desc is dx for BD. Only packed NCHW/NHWC
    tensors (batch outermost) can be split, anything else raises UnsupportedProblemError."""
    dtype, x_shape, x_strides = _read_tensor(x_desc)
    w_dtype, layout, w_shape = _read_filter(w_desc)
    if x_strides != packed_strides(tuple(x_shape), layout):
        raise UnsupportedProblemError(
            f"x/dx tensor with dims {x_shape} and strides {x_strides} is not a packed {layout} tensor "
            f"(strides {packed_strides(tuple(x_shape), layout)}); ucudnn splits packed tensors only: "
            "make it contiguous, or call cuDNN with a plain handle"
        )
    return ConvProblem(kind=ConvKind(kind), x_shape=tuple(x_shape), w_shape=tuple(w_shape), dtype=dtype,
                       layout=layout, **_read_convolution(conv_desc))
