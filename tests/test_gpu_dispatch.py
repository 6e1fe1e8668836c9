"""GPU: micro-batched dispatch equals undivided cuDNN and a float64 reference, for F, BD and BF,
fp32 (FMA and default math) and fp16, NCHW and NHWC, B in {1, 97, 250, 256}, random pads,
strides, dilations and groups; random configurations drawn from the algorithms cuDNN supports."""
from __future__ import annotations

import json
import os
import types
import zlib

import numpy as np
import pytest

from ucudnn.core.problem import ConvKind
from ucudnn.optimizers.configuration import Configuration

from gpu_support import CASES, expected, host_operands, measured, random_problem, relative_error, run_configuration

pytestmark = pytest.mark.gpu
SHAPES_PER_CASE = int(os.environ.get("UCUDNN_TEST_SHAPES", "20"))  # 6 cases x 20 = 120 per op
RESULTS: list[dict] = []


@pytest.fixture(scope="module")
def legacy():
    from ucudnn.execute import gpu
    from ucudnn.execute.backends import open_backends
    from ucudnn.execute.bindings import cudnn

    handle = cudnn.create_handle()
    yield types.SimpleNamespace(handle=handle, backends=open_backends("legacy", handle, gpu.current_stream()))
    cudnn.destroy_handle(handle)
    if os.environ.get("UCUDNN_RESULTS_DIR"):
        with open(os.path.join(os.environ["UCUDNN_RESULTS_DIR"], "dispatch_errors.json"), "w") as f:
            json.dump(RESULTS, f)


def supported_algorithms(handle, problem) -> list[str]:
    """The candidates cuDNN's heuristics list as supported for this kernel."""
    from ucudnn.execute.backends.legacy import legacy_id
    from ucudnn.execute.bindings.convolution import get_algorithms
    from ucudnn.execute.bindings.descriptors import KernelDescriptors

    descs = KernelDescriptors(problem)
    return [legacy_id(problem.kind, perf.algo) for perf in get_algorithms(handle, problem.kind, descs)
            if perf.status == 0]


def random_configuration(rng, legacy, problem) -> Configuration:
    parts = int(rng.integers(1, min(4, problem.batch) + 1))
    cuts = sorted(rng.choice(np.arange(1, problem.batch), parts - 1, replace=False)) if parts > 1 else []
    sizes = np.diff([0, *cuts, problem.batch])
    chosen = []
    for b in map(int, sizes):
        choices = supported_algorithms(legacy.handle, problem.with_batch(b))
        chosen.append((choices[int(rng.integers(len(choices)))], b))
    return measured(legacy.backends, problem, chosen)


@pytest.mark.parametrize("kind", list(ConvKind), ids=str)
@pytest.mark.parametrize("dtype,math,layout,bound", CASES, ids=lambda v: str(v))
def test_micro_batched_equals_undivided_and_reference(legacy, kind, dtype, math, layout, bound):
    rng = np.random.default_rng(zlib.crc32(f"{kind}{dtype}{math}{layout}".encode()))
    worst = 0.0
    for _ in range(SHAPES_PER_CASE):
        problem = random_problem(rng, kind, dtype, math, layout)
        host = host_operands(rng, problem)
        alpha, beta = float(rng.uniform(0.5, 2.0)), float(rng.choice([0.0, rng.uniform(-1, 1)]))
        want = expected(problem, host, alpha, beta)
        split = random_configuration(rng, legacy, problem)
        whole = measured(legacy.backends, problem, [(supported_algorithms(legacy.handle, problem)[0], problem.batch)])
        got_split = run_configuration(legacy.backends, problem, split, host, alpha, beta)
        got_whole = run_configuration(legacy.backends, problem, whole, host, alpha, beta)
        errors = (relative_error(got_split, want), relative_error(got_whole, want),
                  relative_error(got_split, got_whole.astype(np.float64)))
        worst = max(worst, errors[0])
        RESULTS.append(dict(problem=problem.describe(), split=split.describe(), errors=errors))
        assert errors[0] <= bound and errors[1] <= bound and errors[2] <= 2 * bound, (
            f"{problem.describe()} split {split.describe()}: error vs reference {errors[0]:.2e}, "
            f"undivided vs reference {errors[1]:.2e}, split vs undivided {errors[2]:.2e}, bound {bound:.0e}")
    print(f"{kind} {dtype} {math} {layout}: {SHAPES_PER_CASE} shapes, worst error {worst:.2e} <= {bound:.0e}")
