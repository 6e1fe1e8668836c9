"""Helpers of the GPU tests: random problems and operands, reference checks, cuDNN's own pick."""
from __future__ import annotations

import numpy as np

from ucudnn.core.problem import ConvKind, ConvProblem
from ucudnn.optimizers.configuration import Configuration, MicroConfig

import reference

# (dtype, math, layout, bound on ||out - ref|| / ||ref||)
CASES = [
    ("float32", "fma", "nchw", 1e-5),
    ("float32", "fma", "nhwc", 1e-5),
    ("float32", "default", "nchw", 2e-3),
    ("float32", "default", "nhwc", 2e-3),
    ("float16", "tensor_op", "nchw", 1e-2),  # half types: tensor-op math, as ucudnn plans them
    ("float16", "tensor_op", "nhwc", 1e-2),
]
BATCHES = (1, 97, 250, 256)
# cuDNN's FFT and Winograd-nonfused algorithms round in the transformed domain: in fp32 with FMA
# math their error reaches ~2e-3 (seen on an H100 for an AlexNet conv2 BF), far above direct ones.
TRANSFORM_ALGOS = ("FFT", "FFT_TILING", "WINOGRAD_NONFUSED")
TRANSFORM_BOUND = 5e-3


def bound_for(kind: ConvKind, algos, bound: float) -> float:
    """The error bound of a result computed with `algos`: `bound`, or TRANSFORM_BOUND if larger
    and any of them works in a transformed domain."""
    from ucudnn.execute.bindings.enums import algo_name

    names = [algo_name(kind, a) if isinstance(a, int) else a.partition(":")[2] for a in algos]
    transform = any(name in TRANSFORM_ALGOS for name in names)
    return max(bound, TRANSFORM_BOUND) if transform else bound


OUTPUT = {ConvKind.FORWARD: "y", ConvKind.BACKWARD_DATA: "x", ConvKind.BACKWARD_FILTER: "w"}


def random_problem(rng: np.random.Generator, kind: ConvKind, dtype: str, math: str, layout: str) -> ConvProblem:
    """Small random 2-D kernels: pads, strides, dilations and groups all vary; B from BATCHES."""
    groups, c_per_group = int(rng.choice([1, 1, 2, 4])), int(rng.integers(1, 5))
    kernel, dilation = rng.integers(1, 4, 2), rng.integers(1, 3, 2)
    size = [int(rng.integers((k - 1) * d + 1, 13)) for k, d in zip(kernel, dilation)]
    return ConvProblem(
        kind=kind, x_shape=(int(rng.choice(BATCHES)), groups * c_per_group, *size),
        w_shape=(groups * int(rng.integers(1, 5)), c_per_group, *map(int, kernel)),
        pads=tuple(int(rng.integers(0, k)) for k in kernel), strides=tuple(map(int, rng.integers(1, 3, 2))),
        dilations=tuple(map(int, dilation)), groups=groups, dtype=dtype, math=math, layout=layout,
    )


def stored(values: np.ndarray, dtype: str) -> np.ndarray:
    """`values` as a tensor of `dtype` holds them: bfloat16 as raw 16-bit patterns rounded to
    nearest even (NumPy and CuPy have no bfloat16; ucudnn.execute.gpu.random_array stores it alike)."""
    if dtype != "bfloat16":
        return values.astype(dtype)
    bits = values.astype(np.float32).view(np.uint32)
    return ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)


def as_float64(array: np.ndarray, dtype: str) -> np.ndarray:
    """The values a host copy of a `dtype` tensor holds (see `stored`), in float64."""
    if dtype != "bfloat16":
        return array.astype(np.float64)
    return (array.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def host_operands(rng: np.random.Generator, p: ConvProblem) -> dict[str, np.ndarray]:
    """Random x, w, y in memory order, exactly representable in the problem's dtype."""
    return {role: stored(rng.uniform(-1, 1, reference.stored_shape(shape, p.layout)), p.dtype)
            for role, shape in (("x", p.x_shape), ("w", p.w_shape), ("y", p.y_shape))}


def expected(p: ConvProblem, host: dict[str, np.ndarray], alpha: float, beta: float) -> np.ndarray:
    """alpha * conv + beta * prior output, float64, in memory order."""
    logical = {k: reference.to_logical(as_float64(v, p.dtype), p.layout) for k, v in host.items()}
    result = reference.convolve(p, logical["x"], logical["w"], logical["y"])
    out = OUTPUT[p.kind]
    return reference.from_logical(alpha * result + beta * logical[out], p.layout)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    got, want = got.astype(np.float64), want.astype(np.float64)
    if not np.all(np.isfinite(got)):
        return float("inf")
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def measured(backends, problem: ConvProblem, parts) -> Configuration:
    """The configuration of `parts` ((candidate, micro-batch size) pairs) on `backends` with the
    workspace each part's measurement would record: the route's buffers, the staged slices and the plan's own."""
    from ucudnn.execute.dispatch import steps

    unsized = Configuration(tuple(MicroConfig(algo, b, 0.0, 0) for algo, b in parts))
    return Configuration(tuple(
        MicroConfig(s.algo, s.problem.batch, 0.0, s.buffer_bytes + backends.prepare_plan(s).workspace)
        for s in steps(problem, unsized, backends.blends)))


def run_configuration(backends, problem: ConvProblem, configuration, host: dict, alpha: float,
                      beta: float) -> np.ndarray:
    """The output of `configuration` run through `backends` (ucudnn.execute.dispatch), float64, memory order."""
    import cupy as cp

    from ucudnn.execute import gpu
    from ucudnn.execute.dispatch import compile_program

    device = {role: cp.asarray(array) for role, array in host.items()}
    workspace = gpu.alloc(max(configuration.workspace, 1))
    compile_program(problem, configuration, backends, alpha, beta)(
        *(device[r].data.ptr for r in "xwy"), workspace.ptr, configuration.workspace)
    cp.cuda.get_current_stream().synchronize()
    return as_float64(cp.asnumpy(device[OUTPUT[problem.kind]]), problem.dtype)
