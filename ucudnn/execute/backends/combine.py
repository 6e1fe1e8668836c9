"""Combine steps on the GPU (ucudnn.core.accumulation): dst = alpha * src + beta * dst, one CuPy
elementwise kernel per pair of data types, computed in float32 (float64 for float64 data)."""
from __future__ import annotations

import functools

from ...core.accumulation import Combine, buffer_type, output_elements
from ...core.problem import ConvProblem
from .. import gpu

_STORAGE = {"float32": "float32", "float16": "float16", "bfloat16": "uint16", "float64": "float64"}
_LOAD = {"bfloat16": "bf16_load({})"}
_STORE = {"bfloat16": "bf16_store({})", "float16": "(float16)({})", "float32": "({})", "float64": "(double)({})"}
_BF16 = """
__device__ float bf16_load(unsigned short v) { return __uint_as_float(((unsigned int)v) << 16); }
__device__ unsigned short bf16_store(float f) {
    unsigned int u = __float_as_uint(f);
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
"""


def run(problem: ConvProblem, c: Combine, buffers: dict[str, int], stream: int) -> None:
    """Run `c` over the output elements of a call of `problem`, on `stream`."""
    cp = gpu.cupy()
    count = output_elements(problem)
    src, dst = buffer_type(c.src, problem), buffer_type(c.dst, problem)
    with cp.cuda.ExternalStream(stream):
        _kernel(src, dst)(_view(cp, buffers[c.src], count, src), cp.float32(c.alpha), cp.float32(c.beta),
                          _view(cp, buffers[c.dst], count, dst))


def _view(cp, address: int, count: int, dtype: str):
    itemsize = cp.dtype(_STORAGE[dtype]).itemsize
    memory = cp.cuda.UnownedMemory(address, count * itemsize, None)
    return cp.ndarray((count,), _STORAGE[dtype], cp.cuda.MemoryPointer(memory, 0))


@functools.cache
def _kernel(src: str, dst: str):
    """dst = alpha * src + beta * dst (beta 0: dst is not read, so garbage stays out)."""
    wide = "double" if "float64" in (src, dst) else "float"
    load = lambda t, v: _LOAD.get(t, f"({wide})({{}})").format(v)  # noqa: E731
    body = (f"{wide} acc = alpha * {load(src, 'a')};\n"
            f"if (beta != 0.0f) acc += beta * {load(dst, 'b')};\n"
            f"b = {_STORE[dst].format('acc')};")
    return gpu.cupy().ElementwiseKernel(f"{_STORAGE[src]} a, float32 alpha, float32 beta", f"{_STORAGE[dst]} b",
                                        body, f"ucudnn_combine_{src}_{dst}", preamble=_BF16)
