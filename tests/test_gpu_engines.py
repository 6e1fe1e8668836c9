"""GPU: the engines backend (cuDNN's graph API through nvidia-cudnn-frontend). Micro-batched
engine dispatch equals the undivided engine call and a float64 reference for F, BD and BF over
random shapes (groups, dilations, strides, odd batches; fp32 with and without TF32, fp16, bf16;
NCHW and NHWC); micro-batched half-precision (fp16, bf16) dW, summed in float32, stays within 2x
the undivided call's error; the benchmarker lists, times and names engine candidates."""
from __future__ import annotations

import json
import os
import zlib

import numpy as np
import pytest

from ucudnn.core.problem import ConvKind, ConvProblem
from ucudnn.optimizers.configuration import Configuration

from gpu_support import (
    CASES,
    OUTPUT,
    expected,
    host_operands,
    measured,
    random_problem,
    relative_error,
    run_configuration,
)

pytestmark = pytest.mark.gpu
# Half types: inputs are exact, products accumulate in float32, so the error is a few roundings
# of the output to the half type (its unit roundoff u: fp16 2**-11, bf16 2**-8 with 8 significand
# bits). fp16's bound 1e-2 is 20u, where the H100 saw at most 1.2e-3 (2.4u,
# bench/results/2026-11-23/engines/); bf16 gets the same 20u: 1e-2 * 2**3 = 8e-2. An error of the
# dispatch (a part misplaced, a sum lost) is of order 1, far above either.
ENGINE_BOUND = {"float32": {"fma": 1e-5, "default": 2e-3}, "float16": {"tensor_op": 1e-2},
                "bfloat16": {"tensor_op": 8e-2}}
ENGINE_CASES = [*CASES, *(("bfloat16", "tensor_op", layout, ENGINE_BOUND["bfloat16"]["tensor_op"])
                          for layout in ("nchw", "nhwc"))]
# bf16 shares the budget the six other cases had (17 each, 102 per op): 8 cases x 13 = 104 per op.
SHAPES_PER_CASE = int(os.environ.get("UCUDNN_ENGINE_TEST_SHAPES", "13"))
RESULTS: list[dict] = []


@pytest.fixture(scope="module")
def engines():
    """The engines backend alone, routed as a handle routes it (ucudnn.execute.backends.open_backends)."""
    pytest.importorskip("cudnn", reason="nvidia-cudnn-frontend is not installed")
    from ucudnn.execute import gpu
    from ucudnn.execute.backends import open_backends
    from ucudnn.execute.bindings import cudnn

    handle = cudnn.create_handle()
    yield open_backends("engines", handle, gpu.current_stream())
    cudnn.destroy_handle(handle)
    if os.environ.get("UCUDNN_RESULTS_DIR"):
        with open(os.path.join(os.environ["UCUDNN_RESULTS_DIR"], "engine_dispatch_errors.json"), "w") as f:
            json.dump(RESULTS, f)


def pick(rng, engines, problem: ConvProblem, first: bool = False) -> str | None:
    """A candidate of micro-batch kernel `problem` that builds (heuristics' first, or a random
    one); None if the graph API has none."""
    from ucudnn.execute.backends import candidate_id

    graph = engines["engines"].graph(problem)
    names = list(graph.index)
    order = names if first else [names[i] for i in rng.permutation(len(names))]
    return next((candidate_id("engines", n) for n in order if not isinstance(graph.build(n), str)), None)


def random_configuration(rng, engines, problem: ConvProblem) -> Configuration | None:
    """Random parts at any sample: those that start off the alignment are staged by dispatch
    (engines refuse misaligned pointers: CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER)."""
    starts = np.arange(1, problem.batch)
    parts = int(rng.integers(2, min(4, len(starts) + 1) + 1)) if len(starts) else 1
    cuts = sorted(rng.choice(starts, parts - 1, replace=False)) if parts > 1 else []
    parts = []
    for b in map(int, np.diff([0, *cuts, problem.batch])):
        found = pick(rng, engines, problem.with_batch(b))
        if found is None:
            return None
        parts.append((found, b))
    return measured(engines, problem, parts)


run = run_configuration


@pytest.mark.parametrize("kind", list(ConvKind), ids=str)
@pytest.mark.parametrize("dtype,math,layout,bound", ENGINE_CASES, ids=lambda v: str(v))
def test_engine_dispatch_equals_undivided_and_reference(engines, kind, dtype, math, layout, bound):
    rng = np.random.default_rng(zlib.crc32(f"engines{kind}{dtype}{math}{layout}".encode()))
    bound = ENGINE_BOUND[dtype][math]
    checked, worst = 0, 0.0
    for _ in range(SHAPES_PER_CASE):
        problem = random_problem(rng, kind, dtype, math, layout)
        whole_pick = pick(rng, engines, problem, first=True)
        split = random_configuration(rng, engines, problem)
        if whole_pick is None or split is None:
            RESULTS.append(dict(problem=problem.describe(), skipped="no engine builds"))
            continue
        host = host_operands(rng, problem)
        alpha, beta = float(rng.uniform(0.5, 2.0)), float(rng.choice([0.0, rng.uniform(-1, 1)]))
        want = expected(problem, host, alpha, beta)
        whole = measured(engines, problem, [(whole_pick, problem.batch)])
        got_split = run(engines, problem, split, host, alpha, beta)
        got_whole = run(engines, problem, whole, host, alpha, beta)
        errors = (relative_error(got_split, want), relative_error(got_whole, want),
                  relative_error(got_split, got_whole))
        RESULTS.append(dict(problem=problem.describe(), split=split.describe(), errors=errors))
        checked, worst = checked + 1, max(worst, errors[0])
        assert errors[0] <= bound and errors[1] <= bound and errors[2] <= 2 * bound, (
            f"{problem.describe()} split {split.describe()}: error vs reference {errors[0]:.2e}, "
            f"undivided vs reference {errors[1]:.2e}, split vs undivided {errors[2]:.2e}, bound {bound:.0e}")
    print(f"engines {kind} {dtype} {math} {layout}: {checked} of {SHAPES_PER_CASE} shapes checked, "
          f"worst error {worst:.2e} <= {bound:.0e}")
    assert checked >= SHAPES_PER_CASE * 3 // 4, "the graph API ran too few of the shapes"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_micro_batched_half_dw_is_summed_in_float32(engines, dtype, layout):
    """dW of a 64-sample half kernel in 8 micro-batches: error vs float64 at most 2x the
    undivided call's (fp16 summed in the half output it was 8x, engines.md section 1). Each
    part's partial and the result round once to the half type: about sqrt(2) x one rounding."""
    rng = np.random.default_rng(7)
    problem = ConvProblem("BF", (64, 32, 14, 14), (32, 32, 3, 3), pads=1, dtype=dtype, layout=layout)
    host = host_operands(rng, problem)
    want = expected(problem, host, 1.0, 0.0)
    split = measured(engines, problem, [(pick(rng, engines, problem.with_batch(8), first=True), 8)] * 8)
    whole = measured(engines, problem, [(pick(rng, engines, problem, first=True), 64)])
    split_error = relative_error(run(engines, problem, split, host, 1.0, 0.0), want)
    whole_error = relative_error(run(engines, problem, whole, host, 1.0, 0.0), want)
    print(f"{dtype} dW {layout}: 8 x 8 {split_error:.2e}, undivided {whole_error:.2e}")
    assert split_error <= 2 * whole_error


def test_benchmarker_times_and_names_engine_candidates():
    pytest.importorskip("cudnn", reason="nvidia-cudnn-frontend is not installed")
    from ucudnn.core.measurements import OK
    from ucudnn.measure.benchmark import CudnnBenchmarker

    p = ConvProblem("F", (32, 64, 27, 27), (192, 64, 5, 5), pads=2)
    bench = CudnnBenchmarker(backend="engines")
    results = bench.measure(p, (8, 32), cap=64 * 2**20)
    ok = [m for m in results if m.status == OK]
    assert bench.device.frontend_version
    assert ok and all(m.algo.startswith("engines:eng") and m.time_ms > 0 for m in ok)
    precise = [m for m in ok if m.repeats > 1]
    assert precise, "the fastest candidates must be timed again precisely"
    fastest = min(ok, key=lambda m: m.time_ms)
    assert fastest.repeats > 1
    print(f"engines F b=8,32: {len(results)} measurements, {len(ok)} ok, {len(precise)} timed precisely")


def test_handle_runs_engines_and_legacy_side_by_side(tmp_path):
    """backend='all' at 64 MiB on AlexNet conv2: the handle's result matches float64, and the
    chosen configuration says which backend runs each micro-batch."""
    pytest.importorskip("cudnn", reason="nvidia-cudnn-frontend is not installed")
    import cupy as cp

    from ucudnn import Handle

    rng = np.random.default_rng(3)
    for kind in ConvKind:
        p = ConvProblem(kind, (64, 64, 27, 27), (192, 64, 5, 5), pads=2, math="fma")
        host = host_operands(rng, p)
        device = {r: cp.asarray(a) for r, a in host.items()}
        with Handle(backend="all", workspace_limit="8MiB", cache_path=str(tmp_path / "cache.db")) as handle:
            handle.convolve(p, device["x"], device["w"], device["y"])
            cp.cuda.get_current_stream().synchronize()
            config = handle.configuration(p)
        got = cp.asnumpy(device[OUTPUT[kind]])
        error = relative_error(got, expected(p, host, 1.0, 0.0))
        print(f"{kind}: {config.describe()} error {error:.1e}")
        assert all(m.algo.split(":")[0] in ("engines", "legacy") for m in config.micro)
        assert error <= 5e-3  # FFT-class candidates round in the transformed domain (gpu_support)


def test_a_pruned_measurement_times_the_favourites_and_builds_no_more():
    """best=3: per size, the first three candidates of the engines' ranking are measured (timed, or
    over the cap; on to the first that runs where none of them does); the rest are PRUNED, unbuilt."""
    pytest.importorskip("cudnn", reason="nvidia-cudnn-frontend is not installed")
    from ucudnn.core.measurements import OK, OVER_CAP, PRUNED
    from ucudnn.measure.benchmark import CudnnBenchmarker

    p = ConvProblem("F", (32, 64, 27, 27), (192, 64, 5, 5), pads=2)
    bench = CudnnBenchmarker(backend="engines")
    ranked = bench.backends["engines"].ranked(p)
    results = [m for m in bench.measure(p, (32,), cap=2**20, best=3)]
    assert [m.algo for m in results] == ranked  # every candidate has a row, in the ranking's order
    timed = [i for i, m in enumerate(results) if m.status == OK]
    measured = max(3, timed[0] + 1)
    assert timed and all(i < measured for i in timed)
    assert all(m.status == PRUNED and m.workspace == 0 for m in results[measured:])
    assert any(m.status == PRUNED for m in results), "the engines rank 30-90 candidates; 3 were asked for"
    assert all(m.status in (OVER_CAP, OK, "failed", "unsupported") for m in results[:measured])
