"""How micro-batches are timed (benchmark.sweep): as dispatch runs them, on consecutive slices."""
from __future__ import annotations

import numpy as np
import pytest

from ucudnn import reference
from ucudnn.benchmark import SWEEP_CALLS, sweep
from ucudnn.dispatch import NumpyExecutor, compile_plan, plan
from ucudnn.problem import ConvKind, ConvProblem

CONV2 = ConvProblem("BF", (256, 96, 27, 27), (256, 96, 5, 5), pads=2)  # batch quantum 2


def test_a_sweep_runs_consecutive_slices_like_a_configuration():
    swept, configuration = sweep(CONV2, algo=3, b=16)
    steps = plan(swept, configuration)
    assert len(steps) == SWEEP_CALLS and {s.algo for s in steps} == {3}
    assert [s.first_sample for s in steps] == [16 * i for i in range(SWEEP_CALLS)]
    assert [s.beta for s in steps] == [0.0] + [1.0] * (SWEEP_CALLS - 1), "BF accumulates as in dispatch"


@pytest.mark.parametrize("b, calls", [(256, 1), (128, 2), (64, 4), (32, 8), (2, 8), (1, 1), (3, 1)])
def test_sweep_length(b, calls):
    """Up to SWEEP_CALLS slices; sizes off the batch quantum (2 here) run alone, as they do last."""
    swept, configuration = sweep(CONV2, 0, b)
    assert len(configuration.micro) == calls and swept.batch == b * calls


@pytest.mark.parametrize("kind", list(ConvKind), ids=str)
def test_a_sweep_computes_the_convolution_of_its_samples(kind):
    """The timed calls do real work: a sweep equals the convolution of the samples it covers."""
    rng = np.random.default_rng(0)
    p = ConvProblem(kind, (12, 4, 8, 8), (4, 4, 3, 3), pads=1)  # 1 KiB a sample: quantum 1
    swept, configuration = sweep(p, 0, 4)
    assert len(configuration.micro) == 3
    arrays = {r: rng.uniform(-1, 1, s).astype(np.float32) for r, s in (("x", p.x_shape), ("w", p.w_shape), ("y", p.y_shape))}
    flat = {r: a.reshape(-1).copy() for r, a in arrays.items()}
    compile_plan(swept, configuration, NumpyExecutor())(flat["x"], flat["w"], flat["y"])
    out = {ConvKind.FORWARD: "y", ConvKind.BACKWARD_DATA: "x", ConvKind.BACKWARD_FILTER: "w"}[kind]
    covered = {r: a[:swept.batch] if r != "w" else a for r, a in arrays.items()}
    want = reference.convolve(swept, *(covered[r].astype(np.float64) for r in "xwy"))
    got = flat[out].reshape(arrays[out].shape)
    np.testing.assert_allclose(got[:swept.batch] if out != "w" else got, want, rtol=1e-5, atol=1e-5)
