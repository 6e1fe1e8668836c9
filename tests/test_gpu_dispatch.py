"""GPU: micro-batched dispatch equals undivided cuDNN and a float64 reference, for F, BD and BF,
fp32 (FMA and default math) and fp16, NCHW and NHWC, B in {1, 97, 250, 256}, random pads,
strides, dilations and groups; random configurations drawn from the algorithms cuDNN supports."""
from __future__ import annotations

import json
import os
import zlib

import numpy as np
import pytest

from executors import dispatch
from gpu_support import CASES, OUTPUT, expected, host_operands, random_problem, relative_error
from ucudnn.optimizers.configuration import Configuration, MicroConfig
from ucudnn.problem import ConvKind

pytestmark = pytest.mark.gpu
SHAPES_PER_CASE = int(os.environ.get("UCUDNN_TEST_SHAPES", "20"))  # 6 cases x 20 = 120 per op
RESULTS: list[dict] = []


@pytest.fixture(scope="module")
def cudnn_handle():
    from ucudnn.bindings import cudnn
    from ucudnn import gpu

    handle = cudnn.create_handle()
    cudnn.set_stream(handle, gpu.current_stream())
    yield handle
    cudnn.destroy_handle(handle)
    if os.environ.get("UCUDNN_RESULTS_DIR"):
        with open(os.path.join(os.environ["UCUDNN_RESULTS_DIR"], "dispatch_errors.json"), "w") as f:
            json.dump(RESULTS, f)


def supported_algorithms(handle, problem) -> list[tuple[str, int]]:
    """(candidate, workspace) pairs cuDNN's heuristics list as supported for this kernel."""
    from ucudnn.backends.legacy import legacy_id
    from ucudnn.bindings.convolution import get_algorithms, workspace_size
    from ucudnn.bindings.descriptors import KernelDescriptors

    descs = KernelDescriptors(problem)
    return [(legacy_id(problem.kind, perf.algo), workspace_size(handle, problem.kind, descs, perf.algo))
            for perf in get_algorithms(handle, problem.kind, descs) if perf.status == 0]


def random_configuration(rng, handle, problem) -> Configuration:
    parts = int(rng.integers(1, min(4, problem.batch) + 1))
    cuts = sorted(rng.choice(np.arange(1, problem.batch), parts - 1, replace=False)) if parts > 1 else []
    sizes = np.diff([0, *cuts, problem.batch])
    micro = []
    for b in map(int, sizes):
        choices = supported_algorithms(handle, problem.with_batch(b))
        algo, ws = choices[int(rng.integers(len(choices)))]
        micro.append(MicroConfig(algo, b, 0.0, ws))
    return Configuration(tuple(micro))


def run(handle, problem, configuration, host, alpha, beta) -> np.ndarray:
    import cupy as cp

    from ucudnn import gpu
    from ucudnn.bindings.executor import CudnnExecutor

    device = {role: cp.asarray(array) for role, array in host.items()}
    workspace = gpu.alloc(configuration.workspace)
    dispatch(problem, configuration, CudnnExecutor(handle), *(device[r].data.ptr for r in "xwy"),
             alpha, beta, workspace.ptr, configuration.workspace)
    cp.cuda.get_current_stream().synchronize()
    return cp.asnumpy(device[OUTPUT[problem.kind]])


@pytest.mark.parametrize("kind", list(ConvKind), ids=str)
@pytest.mark.parametrize("dtype,math,layout,bound", CASES, ids=lambda v: str(v))
def test_micro_batched_equals_undivided_and_reference(cudnn_handle, kind, dtype, math, layout, bound):
    rng = np.random.default_rng(zlib.crc32(f"{kind}{dtype}{math}{layout}".encode()))
    worst = 0.0
    for _ in range(SHAPES_PER_CASE):
        problem = random_problem(rng, kind, dtype, math, layout)
        host = host_operands(rng, problem)
        alpha, beta = float(rng.uniform(0.5, 2.0)), float(rng.choice([0.0, rng.uniform(-1, 1)]))
        want = expected(problem, host, alpha, beta)
        split = random_configuration(rng, cudnn_handle, problem)
        whole_algo, whole_ws = supported_algorithms(cudnn_handle, problem)[0]
        whole = Configuration((MicroConfig(whole_algo, problem.batch, 0.0, whole_ws),))
        got_split = run(cudnn_handle, problem, split, host, alpha, beta)
        got_whole = run(cudnn_handle, problem, whole, host, alpha, beta)
        errors = (relative_error(got_split, want), relative_error(got_whole, want),
                  relative_error(got_split, got_whole.astype(np.float64)))
        worst = max(worst, errors[0])
        RESULTS.append(dict(problem=problem.describe(), split=split.describe(), errors=errors))
        assert errors[0] <= bound and errors[1] <= bound and errors[2] <= 2 * bound, (
            f"{problem.describe()} split {split.describe()}: error vs reference {errors[0]:.2e}, "
            f"undivided vs reference {errors[1]:.2e}, split vs undivided {errors[2]:.2e}, bound {bound:.0e}")
    print(f"{kind} {dtype} {math} {layout}: {SHAPES_PER_CASE} shapes, worst error {worst:.2e} <= {bound:.0e}")
