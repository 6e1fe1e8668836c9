"""GPU: the drop-in API. Swapping a plain cuDNN handle for a ucudnn.Handle changes nothing but
speed: queries answer a virtual algorithm and zero workspace, results match direct cuDNN."""
from __future__ import annotations

import numpy as np
import pytest

from ucudnn.core.problem import ConvKind, ConvProblem
from ucudnn.optimizers.configuration import Configuration, MicroConfig

from gpu_support import bound_for, expected, host_operands, relative_error

pytestmark = pytest.mark.gpu
# conv2 of AlexNet at a small batch: FFT/Winograd-class algorithms need more workspace than 1 MiB.
LAYER = dict(x_shape=(32, 96, 27, 27), w_shape=(256, 96, 5, 5), pads=2)


@pytest.fixture
def ucudnn_handle(tmp_path):
    from ucudnn import Handle
    from ucudnn.measure.cache import Cache

    with Handle(cache=Cache(tmp_path / "bench.db"), workspace_limit="1MiB",
                policy="powerOfTwo") as handle:
        yield handle


def descriptors(p: ConvProblem):
    from ucudnn import cudnn

    x = cudnn.TensorDescriptor(p.dtype, p.x_shape, p.layout)
    y = cudnn.TensorDescriptor(p.dtype, p.y_shape, p.layout)
    w = cudnn.FilterDescriptor(p.dtype, p.w_shape, p.layout)
    return x, w, cudnn.ConvolutionDescriptor(p), y


def call(handle, p: ConvProblem, arrays: dict, alpha=1.0, beta=0.0):
    """The framework's side: query an algorithm and its workspace, allocate, convolve."""
    import cupy as cp

    from ucudnn import cudnn

    x_desc, w_desc, conv_desc, y_desc = descriptors(p)
    x, w, y = arrays["x"], arrays["w"], arrays["y"]
    if p.kind is ConvKind.FORWARD:
        algo = cudnn.get_convolution_forward_algorithm_v7(handle, x_desc, w_desc, conv_desc, y_desc)[0].algo
        size = cudnn.get_convolution_forward_workspace_size(handle, x_desc, w_desc, conv_desc, y_desc, algo)
        ws = cp.empty(max(size, 1), cp.uint8)
        cudnn.convolution_forward(handle, alpha, x_desc, x, w_desc, w, conv_desc, algo, ws, size, beta, y_desc, y)
    elif p.kind is ConvKind.BACKWARD_DATA:
        algo = cudnn.get_convolution_backward_data_algorithm_v7(handle, w_desc, y_desc, conv_desc, x_desc)[0].algo
        size = cudnn.get_convolution_backward_data_workspace_size(handle, w_desc, y_desc, conv_desc, x_desc, algo)
        ws = cp.empty(max(size, 1), cp.uint8)
        cudnn.convolution_backward_data(handle, alpha, w_desc, w, y_desc, y, conv_desc, algo, ws, size, beta,
                                        x_desc, x)
    else:
        algo = cudnn.get_convolution_backward_filter_algorithm_v7(handle, x_desc, y_desc, conv_desc, w_desc)[0].algo
        size = cudnn.get_convolution_backward_filter_workspace_size(handle, x_desc, y_desc, conv_desc, w_desc, algo)
        ws = cp.empty(max(size, 1), cp.uint8)
        cudnn.convolution_backward_filter(handle, alpha, x_desc, x, y_desc, y, conv_desc, algo, ws, size, beta,
                                          w_desc, w)
    return algo, size


@pytest.mark.parametrize("kind", list(ConvKind), ids=str)
def test_swapping_the_handle_keeps_results(ucudnn_handle, kind):
    import cupy as cp

    from ucudnn import cudnn
    from ucudnn.execute.bindings.enums import VIRTUAL_ALGO

    from gpu_support import OUTPUT

    p = ConvProblem(kind, math="fma", **LAYER)
    host = host_operands(np.random.default_rng(1), p)
    want = expected(p, host, 1.5, 0.5)
    plain = cudnn.create()
    results = {}
    for name, handle in (("plain", plain), ("ucudnn", ucudnn_handle)):
        arrays = {k: cp.asarray(v) for k, v in host.items()}
        algo, size = call(handle, p, arrays, alpha=1.5, beta=0.5)
        results[name] = (algo, size, cp.asnumpy(arrays[OUTPUT[kind]]))
    cudnn.destroy(plain)
    assert results["ucudnn"][:2] == (VIRTUAL_ALGO, 0)
    configuration = ucudnn_handle.configuration(p)
    assert relative_error(results["plain"][2], want) <= bound_for(kind, [results["plain"][0]], 1e-5)
    assert relative_error(results["ucudnn"][2], want) <= bound_for(kind, [m.algo for m in configuration.micro], 1e-5)
    assert configuration.batch == p.batch and configuration.workspace <= 2**20
    print(f"{kind}: {configuration.describe()} ({configuration.workspace} B)")


def test_descriptors_read_back_as_the_problem():
    from ucudnn.execute.bindings.descriptors import read_problem

    for layout in ("nchw", "nhwc"):
        p = ConvProblem("BF", (7, 6, 11, 9), (4, 3, 3, 2), pads=(1, 0), strides=(2, 1), dilations=(1, 2),
                        groups=2, dtype="float16", math="tensor_op", layout=layout)
        x, w, conv, _ = descriptors(p)
        assert read_problem("BF", x, w, conv) == p


def test_wd_handle_divides_one_workspace(tmp_path):
    import cupy as cp

    from ucudnn import Handle
    from ucudnn.measure.cache import Cache

    from gpu_support import OUTPUT

    problems = [ConvProblem(kind, math="fma", **LAYER) for kind in ConvKind]
    with Handle(cache=Cache(tmp_path / "bench.db"), optimizer="wd", total_limit="24MiB") as handle:
        with handle.network():
            for p in problems:
                assert handle.query(p) == (0, 0)
        result = handle.wd_result
        assert result is not None and result.total_workspace <= 24 * 2**20
        for p in problems:
            host = host_operands(np.random.default_rng(2), p)
            arrays = {k: cp.asarray(v) for k, v in host.items()}
            handle.convolve(p, arrays["x"], arrays["w"], arrays["y"])
            got = cp.asnumpy(arrays[OUTPUT[p.kind]])
            algos = [m.algo for m in handle.configuration(p).micro]
            assert relative_error(got, expected(p, host, 1.0, 0.0)) <= bound_for(p.kind, algos, 1e-5)
        print("WD:", {str(p.kind): handle.configuration(p).describe() for p in problems},
              result.total_workspace, "bytes of", 24 * 2**20)
        handle.reset()  # between iterations: every known kernel is solved again, as one network
        assert handle.wd_result is None and len(handle) == 0
        handle.convolve(problems[0], arrays["x"], arrays["w"], arrays["y"])
        assert handle.wd_result is not None and len(handle) == len(problems)


def test_benchmarker_records_every_algorithm():
    from ucudnn.core.measurements import OK, OVER_CAP
    from ucudnn.execute.bindings.enums import algo_count
    from ucudnn.measure.benchmark import CudnnBenchmarker

    p = ConvProblem("F", **LAYER)
    results = CudnnBenchmarker(backend="legacy").measure(p, (1, 8, 32), cap=8 * 2**20)
    assert len(results) == 3 * algo_count("F")
    assert any(m.status == OK for m in results)
    assert all(m.time_ms > 0 and m.workspace <= 8 * 2**20 for m in results if m.status == OK)
    assert all(m.workspace > 8 * 2**20 for m in results if m.status == OVER_CAP)


@pytest.mark.parametrize("kind", list(ConvKind), ids=str)
def test_graph_replays_match_direct_execution(tmp_path, kind):
    """Graph execution (the default) captures on the second call with the same buffers and
    replays from then on; every call, with fresh data in the same buffers, matches the float64
    reference and what direct execution computes."""
    import cupy as cp

    from ucudnn import Handle
    from ucudnn.measure.cache import Cache

    from gpu_support import OUTPUT

    p = ConvProblem(kind, math="fma", **LAYER)
    handles = {execution: Handle(cache=Cache(tmp_path / "bench.db"), execution=execution)
               for execution in ("graph", "direct")}
    from ucudnn.execute.backends.legacy import legacy_id

    algo = legacy_id(kind, 1)  # direct GEMM-class
    configuration = Configuration(tuple(MicroConfig(algo, 8, 0.0, 0) for _ in range(4)))  # many calls
    buffers = {execution: {k: cp.empty(s, cp.float32) for k, s in
                           (("x", p.x_shape), ("w", p.w_shape), ("y", p.y_shape))} for execution in handles}
    workspace = cp.empty(64 * 2**20, cp.uint8)
    programs = {e: h.program(p, configuration, 1.5, 0.5) for e, h in handles.items()}
    for step in range(4):
        host = host_operands(np.random.default_rng(10 + step), p)
        want = expected(p, host, 1.5, 0.5)
        got = {}
        for execution, program in programs.items():
            arrays = buffers[execution]
            for name, array in arrays.items():
                array[...] = cp.asarray(host[name])  # same addresses, new data
            program(arrays["x"].data.ptr, arrays["w"].data.ptr, arrays["y"].data.ptr, workspace.data.ptr,
                    workspace.nbytes)
            got[execution] = cp.asnumpy(arrays[OUTPUT[kind]])
        assert relative_error(got["graph"], want) <= 1e-5 and relative_error(got["direct"], want) <= 1e-5
        assert relative_error(got["graph"], got["direct"]) <= 1e-5
    graphed = programs["graph"]
    assert (graphed.direct_runs, graphed.captures, graphed.replays) == (1, 1, 3), graphed.capture_failure
    for handle in handles.values():
        handle.close()


@pytest.mark.parametrize("kind", list(ConvKind))
def test_favourite_ms_times_cudnns_favourite_and_gives_its_operands_back(ucudnn_handle, kind):
    """Handle.favourite_ms runs cuDNN's favourite on the whole batch as the handle runs kernels:
    a time of the order of the benchmark's for the same candidate, and nothing of its operands kept."""
    import cupy as cp

    p = ConvProblem(kind, **LAYER)
    pool = cp.get_default_memory_pool()
    ucudnn_handle.favourite_ms(p)  # the first call opens the timer's backends
    held = pool.used_bytes()
    ms = ucudnn_handle.favourite_ms(p)
    assert 0 < ms < 1e3
    assert pool.used_bytes() == held  # its operands and workspace went back
    favourite = ucudnn_handle.favourite(p)
    measured = [m for m in ucudnn_handle.assignments.benchmarker.measure(p, [p.batch], None)
                if m.algo == favourite.id and m.time_ms is not None]
    assert measured and 1 / 3 < ms / measured[0].time_ms < 3, (ms, measured)
