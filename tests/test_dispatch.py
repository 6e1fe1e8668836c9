"""Dispatch: steps() + compose() through the real router over fakes of both backends
(tests/executors.py) on a fake device memory equals the undivided reference call, whatever
backend runs each part: which part zeroes, adds and writes a sum, and a workspace layout in which
no plan's workspace overlaps a buffer that must survive."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from ucudnn.core.accumulation import Combine
from ucudnn.core.errors import CandidateError, ConfigError
from ucudnn.core.problem import ConvProblem
from ucudnn.core.staging import slices_of
from ucudnn.core.workspace import align_up
from ucudnn.execute import dispatch as dispatching
from ucudnn.execute.backends import backend_of
from ucudnn.execute.dispatch import Step, compile_program
from ucudnn.optimizers.configuration import Configuration, MicroConfig

import reference
from executors import BLENDS, FakeMemory, dispatch, fake_backends, footprint, steps_run
from strategies import geometry

OUTPUT = {"F": "y", "BD": "x", "BF": "w"}  # what each kind writes; it reads the other two
TOLERANCE = {"float64": 1e-12, "float32": 1e-5, "float16": 4e-3}
# candidates of both backends, alternating: configurations of several parts mix them
ALGOS = ["legacy:A0", "engines:E0", "legacy:A1", "engines:E1", "legacy:A2", "engines:E2", "legacy:A3", "engines:E3"]


def blends(algo: str) -> bool:
    return BLENDS[backend_of(algo)]


def configuration(parts, algos=None) -> Configuration:
    algos = algos or [i % len(ALGOS) for i in range(len(parts))]
    return Configuration(tuple(MicroConfig(ALGOS[a], b, 0.5 * b, 64 * b) for a, b in zip(algos, parts)))


def _stored_to_logical(flat: np.ndarray, shape, layout: str) -> np.ndarray:
    """Independent of reference.to_logical: channels-last memory is (N, *spatial, C)."""
    nd = len(shape) - 2
    if layout == "nchw":
        return flat.reshape(shape).astype(np.float64)
    stored = flat.reshape((shape[0], *shape[2:], shape[1]))
    return stored.transpose(0, nd + 1, *range(1, nd + 1)).astype(np.float64)


def _logical_to_flat(a: np.ndarray, layout: str) -> np.ndarray:
    nd = a.ndim - 2
    return (a if layout == "nchw" else a.transpose(0, *range(2, nd + 2), 1)).ravel()


def make_operands(p: ConvProblem, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Flat packed arrays of p.dtype, every one random and non-zero (outputs are pre-filled)."""
    shapes = {"x": p.x_shape, "w": p.w_shape, "y": p.y_shape}
    return {k: rng.uniform(-1, 1, int(np.prod(s))).astype(p.dtype) for k, s in shapes.items()}


def expected_output(p: ConvProblem, flats: dict[str, np.ndarray], alpha: float, beta: float) -> np.ndarray:
    """alpha * conv + beta * prior, undivided, by the float64 reference; flat in memory order."""
    shapes = {"x": p.x_shape, "w": p.w_shape, "y": p.y_shape}
    logical = {k: _stored_to_logical(flats[k], shapes[k], p.layout) for k in flats}
    conv = reference.convolve(p, logical["x"], logical["w"], logical["y"])
    out = OUTPUT[p.kind.value]
    return _logical_to_flat(alpha * conv + beta * logical[out], p.layout)


def summed_scale(p: ConvProblem, flats: dict[str, np.ndarray], config: Configuration, alpha: float,
                 beta: float) -> float:
    """The largest magnitude BF's sum over the configuration's parts reaches on its way (the prior
    times beta, then each part times alpha added): where parts cancel, a half-precision sum
    rounds at each step relative to that, not to the final value."""
    logical = {k: _stored_to_logical(flats[k], s, p.layout) for k, s in
               {"x": p.x_shape, "w": p.w_shape, "y": p.y_shape}.items()}
    running, largest, start = beta * logical["w"], float(np.abs(beta * logical["w"]).max()), 0
    for m in config.micro:
        part = replace(p, x_shape=(m.batch, *p.x_shape[1:]))
        running = running + alpha * reference.convolve(part, logical["x"][start:start + m.batch], logical["w"],
                                                       logical["y"][start:start + m.batch])
        largest, start = max(largest, float(np.abs(running).max())), start + m.batch
    return largest


def run_and_check(p: ConvProblem, config: Configuration, alpha: float, beta: float, seed: int) -> list[Step]:
    rng = np.random.default_rng(seed)
    flats = make_operands(p, rng)
    original = {k: v.copy() for k, v in flats.items()}
    expected = expected_output(p, flats, alpha, beta)
    sums = p.kind.value == "BF" and p.dtype == "float16"  # rounded at each part: judged against the sum's way
    scale = summed_scale(p, flats, config, alpha, beta) if sums else 0.0
    ran = steps_run(dispatch(p, config, flats["x"], flats["w"], flats["y"], alpha=alpha, beta=beta))
    out = OUTPUT[p.kind.value]
    tol = TOLERANCE[p.dtype]
    assert flats[out].dtype == np.dtype(p.dtype) and flats[out].shape == original[out].shape
    scale = max(float(np.abs(expected).max()), scale, 1e-30)
    np.testing.assert_allclose(flats[out].astype(np.float64), expected, rtol=tol, atol=tol * scale)
    for name in set(flats) - {out}:  # the operands it reads are left alone
        np.testing.assert_array_equal(flats[name], original[name])
    assert ran == dispatching.steps(p, config, blends, alpha, beta)
    check_steps(p, config, ran, alpha, beta)
    return ran


def check_steps(p: ConvProblem, config: Configuration, steps: list[Step], alpha: float, beta: float) -> None:
    assert len(steps) == len(config.micro)
    n0 = 0
    for i, (step, part) in enumerate(zip(steps, config.micro)):
        assert step.first_sample == n0
        assert step.x_offset == n0 * p.sample_bytes("x")
        assert step.y_offset == n0 * p.sample_bytes("y")
        assert step.algo == part.algo
        assert step.problem == p.with_batch(part.batch)
        assert step.problem.shape_key() == p.shape_key()
        assert step.alpha == alpha
        assert (step.part, step.parts) == (i, len(steps))
        check_route(step, alpha, beta)
        n0 += part.batch
    assert n0 == p.batch


def check_route(step: Step, alpha: float, beta: float) -> None:
    """Each part's route, stated independently of ucudnn.core.accumulation's code."""
    r, first, last = step.route, step.part == 0, step.part == step.parts - 1
    half, blends_ = step.problem.dtype == "float16", blends(step.algo)
    added = beta if first else 1.0
    if not blends_:
        assert (r.alpha, r.beta) == (1.0, 0.0)  # a graph API call never blends
    if step.accumulates and half:
        assert r.target == "partial" and r.accumulator > 0 and r.partial > 0
        want = [Combine("partial", "accumulator", 1.0, 0.0 if first else 1.0)]
        assert list(r.combines) == want + ([Combine("accumulator", "output", alpha, beta)] if last else [])
    elif step.accumulates:
        assert r.accumulator == 0
        if blends_:
            assert (r.target, r.alpha, r.beta, r.combines) == ("output", alpha, added, ())
        else:
            assert r.target == "partial" and r.combines == (Combine("partial", "output", alpha, added),)
    elif blends_ or (alpha, beta) == (1.0, 0.0):
        assert (r.target, r.alpha, r.beta, r.combines, r.buffer_bytes) == ("output", alpha, beta, (), 0)
    else:
        assert r.target == "scratch" and r.combines == (Combine("scratch", "output", alpha, beta),)
        assert r.buffer_bytes == 0  # scratch is the call's own, not workspace


# -------------------------------------------------------------------------------- strategies

@st.composite
def dispatch_cases(draw, max_batch: int = 11):
    nd = draw(st.sampled_from([1, 2, 2, 2, 3]))
    g = draw(geometry(nd, {1: 8, 2: 5, 3: 4}[nd], max_groups=2, max_pad=1, max_stride=2, max_group_channels=3))
    groups, cg = g["groups"], g["group_channels"]
    batch = draw(st.integers(1, max_batch))
    p = ConvProblem(
        draw(st.sampled_from(["F", "BD", "BF"])), (batch, cg * groups, *g["sizes"]),
        (groups * draw(st.integers(1, 2)), cg, *g["kernel"]), pads=g["pads"], strides=g["strides"],
        dilations=g["dilations"],
        groups=groups, dtype=draw(st.sampled_from(["float64", "float32", "float16"])),
        layout=draw(st.sampled_from(["nchw", "nhwc"])), mode=draw(st.sampled_from(["cross_correlation", "convolution"])),
    )
    # A random composition of the batch: cut points anywhere (none: one part).
    cuts = sorted(draw(st.sets(st.integers(1, batch - 1), max_size=batch - 1)) if batch > 1 else [])
    parts = [b - a for a, b in zip([0, *cuts], [*cuts, batch])]
    algos = draw(st.lists(st.integers(0, len(ALGOS) - 1), min_size=len(parts), max_size=len(parts)))
    coefficient = st.floats(-3, 3, allow_nan=False).filter(lambda v: abs(v) > 1e-3)
    alpha = draw(st.one_of(st.just(1.0), coefficient))
    beta = draw(st.one_of(st.just(0.0), st.just(1.0), coefficient))
    return p, configuration(parts, algos), alpha, beta, draw(st.integers(0, 2**32 - 1))


@settings(max_examples=150)
@given(dispatch_cases())
@example((ConvProblem("BF", (7, 2, 5, 5), (2, 2, 3, 3), dtype="float64"), configuration([3, 1, 3]), 0.5, 2.0, 1))
@example((ConvProblem("BF", (7, 2, 5, 5), (2, 2, 3, 3), dtype="float32", layout="nhwc"),
          configuration([1] * 7), -1.5, 0.25, 2))
@example((ConvProblem("F", (9, 4, 4, 4), (2, 2, 3, 3), pads=1, groups=2, dtype="float64", layout="nhwc"),
          configuration([9]), 2.0, -0.5, 3))
@example((ConvProblem("BF", (61, 3, 9, 9), (4, 3, 3, 3), strides=2, dtype="float16", layout="nhwc"),
          configuration([16, 16, 16, 8, 4, 1], [0, 0, 0, 1, 2, 3]), 1.0, 0.0, 4))  # the mixed BF of an odd batch
@example((ConvProblem("BF", (33, 3, 9, 9), (4, 3, 3, 3), dtype="float16"), configuration([16, 16, 1], [0, 0, 1]),
          1.0, 0.0, 5))
@example((ConvProblem("BF", (9, 1, 6), (1, 1, 2), dtype="float16", math="tensor_op"), configuration([1, 2, 4, 2], [0, 0, 0, 0]),
          2.0, 1.0, 825334))  # parts that cancel: a half sum rounds relative to what it passes through
def test_dispatch_equals_undivided_reference(case):
    p, config, alpha, beta, seed = case
    run_and_check(p, config, alpha, beta, seed)


CONFIGS = {
    7: [[7], [4, 2, 1], [1] * 7, [2, 5], [3, 3, 1]],
    13: [[8, 4, 1], [13], [5, 5, 3], [1, 12]],
    16: [[8, 8], [16], [4] * 4, [1, 15]],
}


@pytest.mark.parametrize("kind", ["F", "BD", "BF"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16"])
@pytest.mark.parametrize("batch", sorted(CONFIGS))
def test_dispatch_fixed_configurations(kind, layout, dtype, batch, rng):
    p = ConvProblem(kind, (batch, 4, 6, 5), (6, 2, 3, 2), pads=(1, 0), strides=(2, 1), dilations=(1, 2),
                    groups=2, dtype=dtype, layout=layout)
    for parts in CONFIGS[batch]:
        alpha, beta = rng.uniform(-2, 2), rng.uniform(-2, 2)
        run_and_check(p, configuration(parts), alpha, beta, int(rng.integers(2**32)))


@pytest.mark.parametrize("kind", ["F", "BD", "BF"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_dispatch_3d_and_1d(kind, layout, rng):
    for x, w, pads in (((5, 2, 4, 3, 4), (2, 2, 2, 2, 3), (0, 1, 1)), ((6, 3, 9), (4, 3, 3), (2,))):
        p = ConvProblem(kind, x, w, pads=pads, strides=2, dtype="float64", layout=layout, mode="convolution")
        run_and_check(p, configuration([x[0] - 2, 1, 1]), 1.25, -0.75, int(rng.integers(2**32)))


@pytest.mark.parametrize("kind", ["F", "BD", "BF"])
def test_beta_zero_does_not_read_the_output(kind, rng):
    """As in cuDNN, beta = 0 overwrites the output: NaN already there must not leak through."""
    p = ConvProblem(kind, (5, 3, 5, 5), (4, 3, 3, 3), pads=1, dtype="float64", layout="nhwc")
    flats = make_operands(p, rng)
    out = OUTPUT[kind]
    expected = expected_output(p, {**flats, out: np.zeros_like(flats[out])}, 1.5, 0.0)
    flats[out][:] = np.nan
    dispatch(p, configuration([2, 2, 1]), flats["x"], flats["w"], flats["y"], 1.5, 0.0)
    assert not np.isnan(flats[out]).any()
    np.testing.assert_allclose(flats[out], expected, rtol=1e-12, atol=1e-12)


def test_defaults_are_alpha_one_beta_zero(rng):
    p = ConvProblem("F", (4, 2, 5, 5), (3, 2, 3, 3), dtype="float64")
    flats = make_operands(p, rng)
    expected = expected_output(p, flats, 1.0, 0.0)
    dispatch(p, configuration([3, 1]), flats["x"], flats["w"], flats["y"])
    np.testing.assert_allclose(flats["y"], expected, rtol=1e-12)
    steps = dispatching.steps(p, configuration([3, 1]), blends)
    assert [(s.alpha, s.beta, s.route.target) for s in steps] == [(1.0, 0.0, "output"), (1.0, 0.0, "output")]


# ---------------------------------------------------------------------------------------- plan

@pytest.mark.parametrize("kind", ["F", "BD", "BF"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("dtype, itemsize", [("float32", 4), ("float64", 8), ("float16", 2)])
def test_plan_offsets_and_coefficients(kind, layout, dtype, itemsize):
    p = ConvProblem(kind, (13, 6, 10, 9), (4, 3, 3, 3), pads=(1, 0), strides=(1, 2), groups=2,
                    dtype=dtype, layout=layout)
    steps = dispatching.steps(p, configuration([8, 4, 1], [5, 1, 0]), blends, alpha=0.75, beta=0.25)
    x_sample, y_sample = 6 * 10 * 9 * itemsize, 4 * 10 * 4 * itemsize
    assert p.y_shape == (13, 4, 10, 4)
    assert [s.first_sample for s in steps] == [0, 8, 12]
    assert [s.x_offset for s in steps] == [0, 8 * x_sample, 12 * x_sample]
    assert [s.y_offset for s in steps] == [0, 8 * y_sample, 12 * y_sample]
    assert [s.problem.batch for s in steps] == [8, 4, 1]
    assert [s.algo for s in steps] == [ALGOS[5], ALGOS[1], ALGOS[0]]
    assert [s.alpha for s in steps] == [0.75] * 3
    for s in steps:
        check_route(s, 0.75, 0.25)


@settings(max_examples=100)
@given(dispatch_cases(max_batch=40))
def test_plan_properties(case):
    p, config, alpha, beta, _ = case
    check_steps(p, config, dispatching.steps(p, config, blends, alpha, beta), alpha, beta)


@pytest.mark.parametrize("parts", [[4, 4], [8, 2], [10], [1] * 8, [3, 3, 2], [3, 3, 2, 1, 1], []])
@pytest.mark.parametrize("kind", ["F", "BD", "BF"])
def test_mismatched_configuration_batch(parts, kind):
    p = ConvProblem(kind, (9, 2, 5, 5), (2, 2, 3, 3))
    config = configuration(parts)
    with pytest.raises(ConfigError) as info:
        dispatching.steps(p, config, blends)
    message = str(info.value)
    assert str(sum(parts)) in message and "9" in message


def test_mismatched_configuration_runs_nothing():
    p = ConvProblem("F", (4, 2, 5, 5), (2, 2, 3, 3), dtype="float64")
    backends = fake_backends(FakeMemory())
    with pytest.raises(ConfigError):
        compile_program(p, configuration([2, 1]), backends)
    assert steps_run(backends) == []


def test_executor_writes_only_its_slice(rng):
    """One F step on samples [2, 5) of a 7-sample y must leave the other samples untouched."""
    p = ConvProblem("F", (7, 2, 4, 4), (3, 2, 3, 3), pads=1, dtype="float64", layout="nhwc")
    flats = make_operands(p, rng)
    before = flats["y"].copy()
    memory = FakeMemory()
    backends = fake_backends(memory)
    step = dispatching.steps(p, configuration([2, 3, 2]), blends, 1.0, 0.0)[1]
    addresses = [memory.place(flats[r]) for r in "xwy"]
    backends.prepare(step)(*addresses, memory.alloc(1024), 1024)
    flats["y"][...] = memory.view(addresses[2], flats["y"].size, "float64")
    per_sample = int(np.prod(p.y_shape[1:]))
    changed = np.flatnonzero(flats["y"] != before)
    assert changed.min() >= 2 * per_sample and changed.max() < 5 * per_sample
    logical_x = _stored_to_logical(flats["x"], p.x_shape, "nhwc")
    logical_w = _stored_to_logical(flats["w"], p.w_shape, "nhwc")
    y = reference.forward(p.with_batch(3), logical_x[2:5], logical_w)
    np.testing.assert_allclose(flats["y"][2 * per_sample:5 * per_sample], _logical_to_flat(y, "nhwc"), rtol=1e-12)


# ------------------------------------------------------------------- sums across backends

@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("algos", [[0, 1, 0], [1, 0, 1], [1, 1, 0], [0, 0, 1]], ids=str)
@pytest.mark.parametrize("alpha, beta", [(1.0, 0.0), (0.5, 1.0), (2.0, -0.75)])
def test_a_sum_mixing_backends_equals_the_undivided_call(dtype, algos, alpha, beta, rng):
    """The parts of one backward-filter sum on both backends, in every order: each adds into
    the same sum (half: one float32 accumulator, rounded once at the end)."""
    p = ConvProblem("BF", (11, 3, 9, 9), (5, 3, 3, 3), strides=2, dtype=dtype, layout="nhwc")
    run_and_check(p, configuration([4, 6, 1], algos), alpha, beta, int(rng.integers(2**32)))


def test_the_accumulator_is_the_same_bytes_for_every_part_and_no_plan_workspace_overlaps_it():
    p = ConvProblem("BF", (13, 3, 9, 9), (5, 3, 3, 3), dtype="float16")
    parts = dispatching.steps(p, configuration([8, 4, 1], [0, 1, 2]), blends)
    # dw: 135 elements; in float32 540 bytes, 768 aligned to 256; its fp16 partial 270, 512
    assert {s.route.accumulator for s in parts} == {768}
    assert {s.route.partial_offset for s in parts} == {768} and {s.route.partial for s in parts} == {512}
    assert {s.route.buffer_bytes for s in parts} == {1280}  # the plan's workspace starts after both


def test_float32_parts_of_a_blending_backend_need_no_buffer():
    p = ConvProblem("BF", (13, 3, 9, 9), (5, 3, 3, 3))
    legacy, engines = dispatching.steps(p, configuration([8, 5], [0, 1]), blends)
    assert legacy.route.buffer_bytes == 0 and engines.route.buffer_bytes == 768  # dw (540 bytes), its partial


def test_a_workspace_below_what_a_part_needs_is_refused_before_anything_runs(rng):
    p = ConvProblem("BF", (11, 3, 9, 9), (5, 3, 3, 3), dtype="float16")
    config = configuration([4, 6, 1], [0, 1, 0])
    flats = make_operands(p, rng)
    before = flats["w"].copy()
    needs = footprint(p, config)
    with pytest.raises(CandidateError, match=f"needs {needs} bytes.*given {needs - 1}.*re-measure"):
        dispatch(p, config, flats["x"], flats["w"], flats["y"], workspace_size=needs - 1)
    np.testing.assert_array_equal(flats["w"], before)


def test_a_blend_on_a_backend_that_cannot_blend_goes_through_scratch(rng):
    p = ConvProblem("F", (6, 3, 7, 7), (4, 3, 3, 3), dtype="float32")
    run_and_check(p, configuration([6], [1]), 1.0, 0.5, int(rng.integers(2**32)))
    step, = dispatching.steps(p, configuration([6], [1]), blends, 1.0, 0.5)
    assert step.route.target == "scratch"


# ------------------------------------------------------------------- slices off the alignment

@pytest.mark.parametrize("kind", ["F", "BD", "BF"])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("alpha, beta", [(1.0, 0.0), (0.75, 0.25)])
def test_parts_that_start_off_the_alignment_are_staged_and_equal_the_undivided_call(kind, dtype, layout,
                                                                                   alpha, beta, rng):
    """Samples of 3x5x5 elements start off the 256-byte alignment at most parts: those parts run
    through staged copies (their plans see aligned slices: executors.MemoryBackend checks), on
    both backends, with the blends that read the output."""
    p = ConvProblem(kind, (13, 3, 5, 5), (4, 3, 3, 3), pads=1, dtype=dtype, layout=layout)
    config = configuration([3, 5, 1, 4], [0, 1, 2, 3])
    ran = run_and_check(p, config, alpha, beta, int(rng.integers(2**32)))
    slices = slices_of(p)
    assert [s.staged for s in ran] == [slices.staged(s.first_sample) for s in ran]
    assert [bool(s.staged) for s in ran] == [False, True, True, True]
    for s in ran:
        staged = sum(align_up(s.problem.sample_bytes(t) * s.problem.batch) for t in s.staged)
        assert s.buffer_bytes == s.route.buffer_bytes + staged


def test_staged_slices_lie_between_the_routes_buffers_and_the_plans_workspace():
    p = ConvProblem("BF", (13, 3, 5, 5), (4, 3, 3, 3), dtype="float16")
    step = dispatching.steps(p, configuration([3, 10], [1, 1]), blends)[1]
    assert step.staged == ("x", "y")  # 3 samples of 150 and 96 bytes
    x_bytes, y_bytes = align_up(10 * 150), align_up(10 * 4 * 3 * 3 * 2)
    assert step.staging_offsets() == {"x": step.route.buffer_bytes, "y": step.route.buffer_bytes + x_bytes}
    assert step.buffer_bytes == step.route.buffer_bytes + x_bytes + y_bytes


def test_buffers_off_the_alignment_are_refused_for_a_divided_kernel_and_allowed_whole():
    p = ConvProblem("F", (4, 3, 5, 5), (4, 3, 3, 3), dtype="float32")
    divided = compile_program(p, configuration([2, 2]), fake_backends(FakeMemory()))
    with pytest.raises(ConfigError, match="x at 0x104.*multiple of 256 bytes.*a copy"):
        divided(0x104, 0x1000, 0x2000, 0x3000, 10**6)
    calls = []
    whole = Step(p, "legacy:A0", 0, 0, 0, 1.0, 0.0, dispatching.accumulation.route(p, 0, 1, 1.0, 0.0, True))
    call = dispatching.compose(whole, dispatching.Plan(lambda *a: calls.append(a), 0), None, None, None)
    call(0x104, 0x1000, 0x2000, 0, 0)  # one call on the caller's buffers: cuDNN's own rules apply
    assert calls == [(0x104, 0x1000, 0x2000, 0x2000, 0, 0)]
