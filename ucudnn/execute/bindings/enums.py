"""cuDNN constants of the legacy convolution API (cudnn_graph.h, cudnn_cnn.h of cuDNN 9).
Pure data: importing this loads no library."""
from __future__ import annotations

import ctypes
from collections.abc import Iterable, Mapping

from ...core.problem import DTYPES, LAYOUTS, MATH_TYPES, MODES, ConvKind


def _numbered(names: Iterable[str], numbers: Mapping[str, int]) -> dict[str, int]:
    """cuDNN's number for each name of ucudnn.core.problem's vocabulary (in its order); the two must
    name the same values, else importing fails here rather than at the first call."""
    names = list(names)
    if set(names) != set(numbers):
        raise RuntimeError(f"cuDNN numbers {sorted(numbers)} do not match ucudnn.core.problem's names {sorted(names)}")
    return {name: numbers[name] for name in names}


DATA_TYPE = _numbered(DTYPES, {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 9})
TENSOR_FORMAT = _numbered(LAYOUTS, {"nchw": 0, "nhwc": 1})
MATH_TYPE = _numbered(MATH_TYPES, {"default": 0, "tensor_op": 1, "tensor_op_allow_conversion": 2, "fma": 3})
CONV_MODE = _numbered(MODES, {"convolution": 0, "cross_correlation": 1})

ALGORITHMS = {
    ConvKind.FORWARD: ("IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT", "FFT",
                       "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"),
    ConvKind.BACKWARD_DATA: ("ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"),
    ConvKind.BACKWARD_FILTER: ("ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD", "WINOGRAD_NONFUSED",
                               "FFT_TILING"),
}

# The algorithm id a ucudnn.Handle reports to frameworks: a valid enum value of every kind.
VIRTUAL_ALGO = 0

SUCCESS = 0
# cudnnDeterminism_t, the `determinism` of an AlgoPerf: CUDNN_NON_DETERMINISTIC is 0.
DETERMINISTIC = 1
def algo_name(kind: ConvKind | str, algo: int) -> str:
    names = ALGORITHMS[ConvKind(kind)]
    return names[algo] if 0 <= algo < len(names) else f"ALGO_{algo}"


def algo_count(kind: ConvKind | str) -> int:
    return len(ALGORITHMS[ConvKind(kind)])


def algo_number(kind: ConvKind | str, name: str) -> int:
    """The enum value of algorithm `name` (as algo_name gives it) for this kind of kernel."""
    names = ALGORITHMS[ConvKind(kind)]
    if name in names:
        return names.index(name)
    if name.startswith("ALGO_") and name[5:].isdigit():
        return int(name[5:])
    raise ValueError(f"{name!r} is not a cuDNN {ConvKind(kind).value} algorithm; use one of {', '.join(names)}")


class AlgoPerf(ctypes.Structure):
    """cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t: the three share this layout."""

    _fields_ = [
        ("algo", ctypes.c_int),
        ("status", ctypes.c_int),
        ("time", ctypes.c_float),
        ("memory", ctypes.c_size_t),
        ("determinism", ctypes.c_int),
        ("mathType", ctypes.c_int),
        ("reserved", ctypes.c_int * 3),
    ]
