"""The float64 reference convolution: forward against a naive loop, BD and BF by the adjoint identity."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ucudnn.core.problem import ConvProblem

import reference
from strategies import geometry


def naive_forward(p: ConvProblem, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """y[n, k, o] = sum_{c, r} x[n, g*Cg + c, o*s - pad + r*d] * w[k, c, r'] with r' = r
    (cross-correlation) or kernel - 1 - r (convolution), one element at a time."""
    n_, k_, *out = p.y_shape
    cg = p.w_shape[1]
    kg = k_ // p.groups
    kernel = p.w_shape[2:]
    y = np.zeros(p.y_shape)
    for n, k in itertools.product(range(n_), range(k_)):
        g = k // kg
        for o in itertools.product(*map(range, out)):
            acc = 0.0
            for c in range(cg):
                for r in itertools.product(*map(range, kernel)):
                    i = tuple(oi * s - q + ri * d for oi, s, q, ri, d in
                              zip(o, p.strides, p.pads, r, p.dilations))
                    if all(0 <= ii < size for ii, size in zip(i, p.x_shape[2:])):
                        rr = tuple(kk - 1 - ri for kk, ri in zip(kernel, r)) if p.mode == "convolution" else r
                        acc += float(x[(n, g * cg + c, *i)]) * float(w[(k, c, *rr)])
            y[(n, k, *o)] = acc
    return y


def operands(p: ConvProblem, rng: np.random.Generator):
    return (rng.standard_normal(p.x_shape), rng.standard_normal(p.w_shape), rng.standard_normal(p.y_shape))


@st.composite
def small_problems(draw, max_dims: int = 3):
    """Problems small enough for the naive loop (a few thousand multiply-adds)."""
    nd = draw(st.integers(1, max_dims))
    g = draw(geometry(nd, {1: 9, 2: 6, 3: 4}[nd], max_groups=3, max_pad=2, max_stride=3, max_group_channels=2))
    groups, cg = g["groups"], g["group_channels"]
    return ConvProblem(
        "F", (draw(st.integers(1, 2)), cg * groups, *g["sizes"]), (groups * draw(st.integers(1, 2)), cg, *g["kernel"]),
        pads=g["pads"], strides=g["strides"], dilations=g["dilations"], groups=groups, dtype="float64",
        mode=draw(st.sampled_from(["cross_correlation", "convolution"])),
    )


# (x_shape, w_shape, pads, strides, dilations, groups): every feature alone and together.
CASES = [
    ((2, 3, 7), (4, 3, 3), 0, 1, 1, 1),  # 1-D
    ((1, 2, 9), (2, 1, 2), 1, 2, 3, 2),  # 1-D, everything
    ((2, 3, 5, 6), (4, 3, 3, 2), 0, 1, 1, 1),  # plain 2-D
    ((1, 2, 5, 6), (3, 2, 3, 3), (1, 2), 1, 1, 1),  # pads
    ((1, 2, 7, 6), (3, 2, 3, 2), 0, (2, 3), 1, 1),  # strides
    ((1, 2, 7, 8), (3, 2, 2, 3), 0, 1, (2, 3), 1),  # dilation
    ((2, 4, 5, 5), (6, 2, 3, 3), 1, 1, 1, 2),  # groups
    ((1, 6, 5, 5), (6, 1, 3, 3), 1, 2, 1, 6),  # depthwise
    ((2, 6, 8, 7), (3, 2, 3, 2), (2, 1), (3, 2), (2, 2), 3),  # everything
    ((1, 2, 4, 5, 3), (2, 2, 2, 3, 1), 0, 1, 1, 1),  # 3-D
    ((1, 4, 5, 6, 5), (4, 2, 2, 2, 3), (1, 0, 1), (2, 1, 2), (1, 2, 1), 2),  # 3-D, everything
    ((1, 1, 3, 3), (1, 1, 3, 3), 0, 1, 1, 1),  # output 1x1
    ((1, 1, 1, 1), (1, 1, 3, 3), 1, 1, 1, 1),  # all-padding input
]
MODES = ["cross_correlation", "convolution"]


def _problem(case, mode="cross_correlation", kind="F") -> ConvProblem:
    x, w, pads, strides, dil, groups = case
    return ConvProblem(kind, x, w, pads=pads, strides=strides, dilations=dil, groups=groups,
                       dtype="float64", mode=mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES)
def test_forward_matches_naive_loop(case, mode, rng):
    p = _problem(case, mode)
    x, w, _ = operands(p, rng)
    y = reference.forward(p, x, w)
    assert y.shape == p.y_shape and y.dtype == np.float64
    np.testing.assert_allclose(y, naive_forward(p, x, w), rtol=1e-12, atol=1e-12)


@settings(max_examples=60)
@given(small_problems(), st.integers(0, 2**32 - 1))
def test_forward_matches_naive_loop_random(p, seed):
    x, w, _ = operands(p, np.random.default_rng(seed))
    np.testing.assert_allclose(reference.forward(p, x, w), naive_forward(p, x, w), rtol=1e-12, atol=1e-12)


def _adjoint_check(p: ConvProblem, rng: np.random.Generator):
    x, w, dy = operands(p, rng)
    y = reference.forward(p, x, w)
    dx = reference.backward_data(p, dy, w)
    dw = reference.backward_filter(p, x, dy)
    assert dx.shape == p.x_shape and dw.shape == p.w_shape
    assert dx.dtype == dw.dtype == np.float64
    lhs = float(np.vdot(y, dy))
    scale = float(np.abs(y).ravel() @ np.abs(dy).ravel()) + 1e-300
    assert abs(lhs - float(np.vdot(x, dx))) <= 1e-12 * scale
    assert abs(lhs - float(np.vdot(w, dw))) <= 1e-12 * scale


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES)
def test_adjoint_identity(case, mode, rng):
    """<F(x, w), dy> == <x, BD(dy, w)> == <w, BF(x, dy)>, for several random operands."""
    p = _problem(case, mode)
    for _ in range(3):
        _adjoint_check(p, rng)


@settings(max_examples=60)
@given(small_problems(), st.integers(0, 2**32 - 1))
def test_adjoint_identity_random(p, seed):
    _adjoint_check(p, np.random.default_rng(seed))


SMALL_CASES = [c for c in CASES if np.prod(c[0]) * np.prod(_problem(c).y_shape) <= 20000]


def test_small_cases_cover_every_dimension():
    assert {len(c[0]) - 2 for c in SMALL_CASES} == {1, 2, 3}
    assert any(c[5] > 1 for c in SMALL_CASES) and any(c[2] != 0 for c in SMALL_CASES)


@pytest.mark.parametrize("case", SMALL_CASES)
def test_backward_operators_are_exact_transposes(case):
    """Column by column: BD is the transpose of the matrix of x -> F(x, w), BF of w -> F(x, w)."""
    p = _problem(case)
    rng = np.random.default_rng(7)
    x, w, _ = operands(p, rng)
    fx = np.stack([reference.forward(p, e.reshape(p.x_shape), w).ravel() for e in np.eye(x.size)], axis=1)
    bd = np.stack([reference.backward_data(p, e.reshape(p.y_shape), w).ravel() for e in np.eye(fx.shape[0])], 1)
    np.testing.assert_allclose(bd, fx.T, rtol=0, atol=1e-12)
    fw = np.stack([reference.forward(p, x, e.reshape(p.w_shape)).ravel() for e in np.eye(w.size)], axis=1)
    bf = np.stack([reference.backward_filter(p, x, e.reshape(p.y_shape)).ravel() for e in np.eye(fw.shape[0])], 1)
    np.testing.assert_allclose(bf, fw.T, rtol=0, atol=1e-12)


@pytest.mark.parametrize("case", CASES)
def test_convolution_mode_flips_the_filter(case, rng):
    xc, cv = _problem(case, "cross_correlation"), _problem(case, "convolution")
    x, w, dy = operands(xc, rng)
    spatial = tuple(range(2, w.ndim))
    flipped = np.flip(w, axis=spatial)
    np.testing.assert_allclose(reference.forward(cv, x, w), reference.forward(xc, x, flipped), rtol=1e-13)
    np.testing.assert_allclose(reference.backward_data(cv, dy, w), reference.backward_data(xc, dy, flipped),
                               rtol=1e-13)
    np.testing.assert_allclose(reference.backward_filter(cv, x, dy),
                               np.flip(reference.backward_filter(xc, x, dy), axis=spatial), rtol=1e-13)


def test_convolution_mode_differs_from_cross_correlation(rng):
    case = CASES[8]
    xc, cv = _problem(case, "cross_correlation"), _problem(case, "convolution")
    x, w, dy = operands(xc, rng)
    assert not np.allclose(reference.forward(cv, x, w), reference.forward(xc, x, w))
    assert not np.allclose(reference.backward_data(cv, dy, w), reference.backward_data(xc, dy, w))
    assert not np.allclose(reference.backward_filter(cv, x, dy), reference.backward_filter(xc, x, dy))


def test_known_values_1d():
    p = ConvProblem("F", (1, 1, 3), (1, 1, 3), dtype="float64")
    x, w = np.array([[[1.0, 2.0, 3.0]]]), np.array([[[1.0, 0.0, -1.0]]])
    assert reference.forward(p, x, w).tolist() == [[[-2.0]]]
    cv = ConvProblem("F", (1, 1, 3), (1, 1, 3), dtype="float64", mode="convolution")
    assert reference.forward(cv, x, w).tolist() == [[[2.0]]]
    padded = ConvProblem("F", (1, 1, 3), (1, 1, 3), pads=1, dtype="float64")
    assert reference.forward(padded, x, w).tolist() == [[[-2.0, -2.0, 2.0]]]
    strided = ConvProblem("F", (1, 1, 5), (1, 1, 2), strides=2, dilations=2, dtype="float64")
    # windows at 0 and 2, taps at +0 and +2: [1*1 + 3*10, 3*1 + 5*10]
    y = reference.forward(strided, np.array([[[1.0, 2.0, 3.0, 4.0, 5.0]]]), np.array([[[1.0, 10.0]]]))
    assert y.tolist() == [[[31.0, 53.0]]]


def test_groups_are_independent_convolutions(rng):
    groups, cg, kg = 3, 2, 2
    p = ConvProblem("F", (2, groups * cg, 6, 5), (groups * kg, cg, 3, 2), pads=(1, 0), strides=(1, 2),
                    groups=groups, dtype="float64")
    x, w, dy = operands(p, rng)
    single = ConvProblem("F", (2, cg, 6, 5), (kg, cg, 3, 2), pads=(1, 0), strides=(1, 2), dtype="float64")
    y, dx, dw = reference.forward(p, x, w), reference.backward_data(p, dy, w), reference.backward_filter(p, x, dy)
    for g in range(groups):
        xs, ws, ys = slice(g * cg, (g + 1) * cg), slice(g * kg, (g + 1) * kg), slice(g * kg, (g + 1) * kg)
        np.testing.assert_allclose(y[:, ys], reference.forward(single, x[:, xs], w[ws]), rtol=1e-13)
        np.testing.assert_allclose(dx[:, xs], reference.backward_data(single, dy[:, ys], w[ws]), rtol=1e-13)
        np.testing.assert_allclose(dw[ws], reference.backward_filter(single, x[:, xs], dy[:, ys]), rtol=1e-13)


def test_samples_are_independent(rng):
    """What micro-batching relies on: F and BD of a slice are the slice of F and BD, BF sums over slices."""
    p = ConvProblem("F", (5, 4, 6, 6), (4, 2, 3, 3), pads=1, strides=2, groups=2, dtype="float64")
    x, w, dy = operands(p, rng)
    q = p.with_batch(2)
    np.testing.assert_allclose(reference.forward(p, x, w)[1:3], reference.forward(q, x[1:3], w), rtol=1e-13)
    np.testing.assert_allclose(reference.backward_data(p, dy, w)[1:3],
                               reference.backward_data(q, dy[1:3], w), rtol=1e-13)
    parts = [reference.backward_filter(p.with_batch(b), x[a:a + b], dy[a:a + b]) for a, b in ((0, 2), (2, 3))]
    np.testing.assert_allclose(reference.backward_filter(p, x, dy), parts[0] + parts[1], rtol=1e-12)


def test_float32_inputs_are_computed_in_float64(rng):
    p = ConvProblem("F", (1, 2, 5, 5), (2, 2, 3, 3), dtype="float32")
    x, w, dy = (a.astype(np.float32) for a in operands(p, rng))
    for result in (reference.forward(p, x, w), reference.backward_data(p, dy, w), reference.backward_filter(p, x, dy)):
        assert result.dtype == np.float64
    np.testing.assert_allclose(reference.forward(p, x, w), naive_forward(p, x, w), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["F", "BD", "BF"])
def test_convolve_dispatches_by_kind(kind, rng):
    p = _problem(CASES[8], kind=kind)
    x, w, y = operands(p, rng)
    expected = {"F": lambda: reference.forward(p, x, w), "BD": lambda: reference.backward_data(p, y, w),
                "BF": lambda: reference.backward_filter(p, x, y)}[kind]()
    np.testing.assert_array_equal(reference.convolve(p, x, w, y), expected)


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_layout_helpers(nd, rng):
    logical_shape = (2, 3, *range(4, 4 + nd))
    stored = reference.stored_shape(logical_shape, "nhwc")
    assert stored == (2, *range(4, 4 + nd), 3)
    assert reference.stored_shape(logical_shape, "nchw") == logical_shape
    a = rng.standard_normal(stored)
    logical = reference.to_logical(a, "nhwc")
    assert logical.shape == logical_shape
    for index in itertools.product(*map(range, logical_shape)):
        n, c, *spatial = index
        assert logical[index] == a[(n, *spatial, c)]
    np.testing.assert_array_equal(reference.from_logical(logical, "nhwc"), a)
    b = rng.standard_normal(logical_shape)
    assert reference.to_logical(b, "nchw") is b and reference.from_logical(b, "nchw") is b


def test_naive_loop_is_not_trivially_equal():
    """The naive loop itself: a hand-computed 2-D grouped, padded, strided case."""
    p = ConvProblem("F", (1, 2, 3, 3), (2, 1, 2, 2), pads=(1, 0), strides=(2, 1), groups=2, dtype="float64")
    x = np.arange(18, dtype=float).reshape(1, 2, 3, 3)
    w = np.array([[[[1.0, 0.0], [0.0, 0.0]]], [[[0.0, 0.0], [0.0, 1.0]]]])
    # y has H = (3 + 2 - 2) // 2 + 1 = 2, W = 2. Channel 0 reads x[0] at (2h - 1, w); channel 1 reads
    # x[1] at (2h - 1 + 1, w + 1).
    expected = np.array([[[[0.0, 0.0], [3.0, 4.0]], [[10.0, 11.0], [16.0, 17.0]]]])
    np.testing.assert_array_equal(naive_forward(p, x, w), expected)
    np.testing.assert_array_equal(reference.forward(p, x, w), expected)


def test_bfloat16_host_copies_round_like_torch():
    """The GPU tests' host bf16 (raw 16-bit patterns, gpu_support.stored) rounds to nearest even
    as torch does, and reads back exactly."""
    torch = pytest.importorskip("torch")
    from gpu_support import as_float64, stored

    values = np.random.default_rng(0).uniform(-1, 1, 1000)
    values[:3] = (1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8 + 2**-20))  # ties to even, and just past a tie
    bits = stored(values, "bfloat16")
    want = torch.tensor(values, dtype=torch.float32).to(torch.bfloat16)
    assert bits.dtype == np.uint16 and np.array_equal(bits, want.view(torch.int16).numpy().view(np.uint16))
    assert np.array_equal(as_float64(bits, "bfloat16"), want.double().numpy())
    assert np.array_equal(as_float64(stored(values, "float16"), "float16"), values.astype(np.float16))
