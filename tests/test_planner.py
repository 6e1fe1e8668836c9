"""ucudnn.plan.planner with no framework behind it: a 'framework' of NumPy arrays drives the Planner as
a second integration would (its layers route each call, then run its kernels), with no torch
installed. Kernels run through the NumPy executor (handle_doubles) and are checked against the
float64 reference."""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np
import pytest

from ucudnn.core.errors import DeviceMemoryError
from ucudnn.core.problem import ConvKind, ConvProblem
from ucudnn.core.transposition import as_forward
from ucudnn.measure.cache import Cache
from ucudnn.plan.config import Settings
from ucudnn.plan.delegation import SWEPT_UNDER_PRESSURE_MS, as_fast_as_favourites
from ucudnn.plan.framework import LAYER, UCUDNN, Framework, OwnTiming
from ucudnn.plan.memory import RECORDED_CALLS, Memory, quantized
from ucudnn.plan.moments import IN_STEP_HOLD_S
from ucudnn.plan.planner import Planner
from ucudnn.reports.summary import summary as summary_of

import reference
from fakes import favourite_ms, slower
from handle_doubles import NumpyHandle

F, BD, BF = ConvKind.FORWARD, ConvKind.BACKWARD_DATA, ConvKind.BACKWARD_FILTER
OWN = "numpy"


@dataclass(frozen=True)
class Call:
    """A layer call as the planner sees one: hashable, on a device, a problem per kind."""

    forward: ConvProblem
    device: str = "array0"

    def problem(self, kind: ConvKind) -> ConvProblem:
        return self.forward.with_kind(kind)


class Site:
    def __init__(self, call: Call, kinds=(F, BD, BF)):
        self.call, self.kinds, self.kernels, self.delegated = call, kinds, {}, None
        self.free, self.observed = {}, 0


class ArrayKernel:
    via = UCUDNN

    def __init__(self, problem, handle, assignment):
        self.problem, self.assignment = problem, assignment
        self.program = handle.program(problem, assignment.configuration)
        self.counted = (UCUDNN, problem.kind.value)

    def __call__(self, x, w, y):
        self.program(x.reshape(-1), w.reshape(-1), y.reshape(-1))


class OwnKernel:
    """The 'framework's own convolution': the reference, into the kernel's output."""

    via = OWN

    def __init__(self, problem):
        self.problem, self.counted = problem, (OWN, problem.kind.value)

    def __call__(self, x, w, y):
        p = self.problem
        if p.kind is F:
            result = reference.forward(p, x, w)
        elif p.kind is BD:
            result = reference.backward_data(p, y, w)
        else:
            result = reference.backward_filter(p, x, y)
        written = (x, w, y)[p.written]
        if written is None:
            return result
        written[...] = result
        return written


class NumpyArrays:
    """A Framework of NumPy arrays on one pretend device, and its own Pool; its own convolution
    'takes' own_ms."""

    own = OWN

    @property
    def pool(self):
        return self

    def __init__(self, own_ms: float = math.inf, free: int = 0):
        self.cudnn_handles, self.own_ms, self.timed = {}, own_ms, []
        self.free = free  # what free_bytes() says: set it to move through a step's moments
        self.pressures = []  # per timing of its own kernel: the bytes left free for it (None: no blocker)
        self.scopes, self.depths = [], []  # planning scopes open; how many were open at each timing
        self.now = None  # what mark() reads, in ms (None: no marks; torch's kernels are timed, own_ms)
        self.holds = []  # per mark, how long the device was held before it
        self.outside = 0  # what outside_bytes() says: the process's bytes beside the framework's pool
        self.released, self.bounds = [], []  # release() and bound_beside() calls

    def make_handle(self, settings, cache, device):
        return NumpyHandle(settings, cache)

    def kernel(self, problem, handle, assignment):
        return ArrayKernel(problem, handle, assignment)

    def own_kernel(self, problem):
        return OwnKernel(problem)

    def time_own(self, problem, device, free=None):
        self.timed.append(problem.kind)
        self.depths.append(len(self.scopes))
        self.pressures.append(free)
        return OwnTiming(self.own_ms, 0, self.free if free is None else free)

    def own_candidate(self):
        return "torch:numpy"

    def device_guard(self, device):
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def planning_scope(self, device):
        self.scopes.append(device)  # scopes open now
        try:
            yield
        finally:
            self.scopes.pop()

    def settled_memory(self, device):
        return Memory(2**40, 0)

    def free_bytes(self, device):
        return self.free

    def outside_bytes(self, device):
        return self.outside

    def flushes(self, device):
        return 0

    def grown(self, device):
        return 0

    @staticmethod
    def result_for(problem, like):
        return np.empty(problem.written_shape, like.dtype)

    def synchronize(self, device):
        pass

    def release(self, device):  # nothing held beside the pretend pool; each release listed
        self.released.append(device)
        return 0

    def bound_beside(self, nbytes):  # each graph budget set, listed
        self.bounds.append(nbytes)

    def mark(self, device, hold_s=0.0):  # the pretend device's clock: tests set and move `now`
        self.holds.append(hold_s)
        return self.now

    @staticmethod
    def elapsed_ms(start, end):
        return end - start

    @staticmethod
    def transposed_weights(w, groups, layout):  # logical arrays: no layout to keep
        return reference.transposed_weights(w, groups)


def planner(tmp_path, framework, **settings) -> Planner:
    return Planner(Settings.load(env={}, planning="first_call", progress=False, **settings), framework,
                   Cache(tmp_path / "bench.db"))


def step(planner: Planner, site: Site, rng) -> dict:
    """One layer step through the planner: F, BD and BF of the site's call on random arrays;
    the results beside the reference's."""
    p = site.call.forward
    x, w, dy = (rng.standard_normal(shape).astype(np.float32) for shape in (p.x_shape, p.w_shape, p.y_shape))
    y, dx, dw = np.empty(p.y_shape, np.float32), np.empty(p.x_shape, np.float32), np.empty(p.w_shape, np.float32)
    if planner.route(site):
        return {}
    planner.run(site, F, x, w, y)
    planner.run(site, BD, dx, w, dy)
    planner.run(site, BF, x, dw, dy)
    return {"F": (y, reference.forward(p, x, w)), "BD": (dx, reference.backward_data(p, dy, w)),
            "BF": (dw, reference.backward_filter(p, x, dy))}


def test_a_framework_of_numpy_arrays_is_one(tmp_path):
    assert isinstance(NumpyArrays(), Framework)


def test_a_layer_the_framework_cannot_run_fast_is_micro_batched_and_equals_the_reference(tmp_path, rng):
    framework = NumpyArrays()
    plans = planner(tmp_path, framework, workspace_limit="100KiB")
    site = Site(Call(ConvProblem(F, (16, 8, 10, 10), (16, 8, 3, 3), pads=1)))
    for kind, (got, want) in step(plans, site, rng).items():
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=kind)
    kernels = summary_of(plans)["kernels"]
    assert framework.timed == [F, BD, BF]  # its own kernels timed first, then swept
    assert [k["via"] for k in kernels] == [UCUDNN] * 3 and all(k["parts"] > 1 for k in kernels), kernels
    assert {kind: n for (via, kind), n in plans.runs.items() if via == UCUDNN} == {"F": 1, "BD": 1, "BF": 1}


def test_a_layer_the_framework_runs_as_fast_within_the_limit_is_left_to_it(tmp_path, rng):
    framework = NumpyArrays(own_ms=0.0)
    plans = planner(tmp_path, framework)
    site = Site(Call(ConvProblem(F, (4, 3, 8, 8), (4, 3, 3, 3))))
    assert step(plans, site, rng) == {} and site.delegated
    assert step(plans, site, rng) == {} and plans.runs[OWN, LAYER] == 2 and framework.timed == [F, BD, BF]


@pytest.mark.parametrize("optimizer", ["wr", "wd"])
def test_recorded_kernels_are_planned_before_their_first_run(tmp_path, optimizer, rng):
    """record(): WR plans each kernel now; WD records them for one solve (finalize)."""
    plans = planner(tmp_path, NumpyArrays(), optimizer=optimizer, workspace_limit="1MiB")
    site = Site(Call(ConvProblem(F, (8, 4, 8, 8), (8, 4, 3, 3), pads=1)))
    plans.record(site.call, site.kinds)
    plans.finalize()
    assert plans.solved() == (optimizer == "wd")
    for kind, (got, want) in step(plans, site, rng).items():
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=kind)


@pytest.mark.parametrize("factor, runs_as_forward", [(4.0, True), (1.0, False)])
def test_a_slow_data_gradient_runs_as_a_forward_convolution_of_dy(tmp_path, rng, monkeypatch, factor, runs_as_forward):
    """bd_as_forward: a stride-1 layer's BD is planned also as the F of dy with the weights'
    K and C swapped (ucudnn.core.transposition); where that plan is clearly faster it runs, with BD's
    results. Where it is not, BD's own plan runs."""
    slower(monkeypatch, BD, factor)
    plans = planner(tmp_path, NumpyArrays(), workspace_limit="100KiB", bd_as_forward=True)
    site = Site(Call(ConvProblem(F, (6, 4, 9, 9), (8, 2, 3, 3), pads=1, groups=2)))
    for kind, (got, want) in step(plans, site, rng).items():
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=kind)
    described = {k["kind"]: k for k in summary_of(plans)["kernels"]}
    assert ("as_forward" in described["BD"]) == runs_as_forward, described["BD"]
    if runs_as_forward:
        assert described["BD"]["as_forward"].startswith("F x=(6, 8, 9, 9) w=(4, 4, 3, 3)")
        assert described["BD"]["predicted_ms"] < described["F"]["predicted_ms"] * 1.5
    assert {kind: n for (via, kind), n in plans.runs.items() if via == UCUDNN} == {"F": 1, "BD": 1, "BF": 1}


def test_wd_keeps_the_data_gradient_its_division_planned(tmp_path, rng, monkeypatch):
    """WD divides one total among the kernels it solved: a forward convolution planned after the
    solve would be a kernel outside that division, so BD stays BD however slow."""
    slower(monkeypatch, BD, 4.0)
    plans = planner(tmp_path, NumpyArrays(), optimizer="wd", workspace_limit="100KiB")
    site = Site(Call(ConvProblem(F, (6, 4, 9, 9), (8, 2, 3, 3), pads=1, groups=2)))
    plans.record(site.call, site.kinds)
    plans.finalize()
    for kind, (got, want) in step(plans, site, rng).items():
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=kind)
    assert all("as_forward" not in k for k in summary_of(plans)["kernels"])


def test_with_the_setting_off_or_with_strides_the_data_gradient_stays_a_data_gradient(tmp_path, rng, monkeypatch):
    slower(monkeypatch, BD, 4.0)
    for settings, strides in (({"bd_as_forward": False}, 1), ({}, 2)):
        plans = planner(tmp_path / f"s{strides}", NumpyArrays(), workspace_limit="100KiB", **settings)
        site = Site(Call(ConvProblem(F, (6, 4, 9, 9), (8, 4, 3, 3), pads=1, strides=strides)))
        for kind, (got, want) in step(plans, site, rng).items():
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=kind)
        assert all("as_forward" not in k for k in summary_of(plans)["kernels"])


class Short(NumpyArrays):
    """The first kernel made of each of `problems` cannot borrow its workspace (DeviceMemoryError)."""

    def __init__(self, *problems):
        super().__init__()
        self.short = list(problems)

    def kernel(self, problem, handle, assignment):
        kernel = super().kernel(problem, handle, assignment)
        if problem in self.short:
            self.short.remove(problem)

            def run(x, w, y):
                raise DeviceMemoryError("a convolution workspace", assignment.workspace_size)
            kernel.program = run
        return kernel


def as_forward_short(tmp_path, monkeypatch, *also_short, workspace_limit="100KiB"):
    """A layer whose BD is planned as a forward convolution (BD's own candidates 4x slower) whose
    kernel cannot borrow its workspace, nor can the first kernel of each of `also_short`."""
    layer = ConvProblem(F, (6, 4, 9, 9), (8, 4, 3, 3), pads=1)
    slower(monkeypatch, BD, 4.0)
    plans = planner(tmp_path, Short(as_forward(layer.with_kind(BD)), *also_short), workspace_limit=workspace_limit,
                    bd_as_forward=True)
    site = Site(Call(layer))
    assert plans.route(site) is False  # planned: BD as a forward convolution
    assert "as_forward" in {k["kind"]: k for k in summary_of(plans)["kernels"]}["BD"]
    return plans, site


@pytest.mark.parametrize("workspace_limit", ["100KiB", "0"])
def test_a_forward_plan_whose_workspace_cannot_be_borrowed_gives_way_to_the_data_gradients_own_kernel(
        tmp_path, rng, monkeypatch, workspace_limit):
    """BD's own kernel, as planned, runs instead: nothing shrinks, nothing is planned again. With
    no workspace in BD's own plan, a shrink of it would have had nothing to shrink and fallen back
    to the framework's own convolution."""
    plans, site = as_forward_short(tmp_path, monkeypatch, workspace_limit=workspace_limit)
    for kind, (got, want) in step(plans, site, rng).items():
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=kind)
    summary = summary_of(plans)
    described = {k["kind"]: k for k in summary["kernels"]}["BD"]
    assert "as_forward" not in described and described["via"] == UCUDNN, described
    assert site.kernels[BD].via == UCUDNN and site.kernels[BD].problem == site.call.problem(BD)
    assert (described["workspace"] == 0) == (workspace_limit == "0"), described
    assert summary["shrinks"] == []


def test_where_the_data_gradients_own_kernel_cannot_borrow_its_workspace_either_it_shrinks(tmp_path, rng, monkeypatch):
    """Only where BD's own kernel cannot borrow its workspace either is BD planned again within less."""
    layer = ConvProblem(F, (6, 4, 9, 9), (8, 4, 3, 3), pads=1)
    plans, site = as_forward_short(tmp_path, monkeypatch, layer.with_kind(BD))
    for kind, (got, want) in step(plans, site, rng).items():
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=kind)
    summary = summary_of(plans)
    described = {k["kind"]: k for k in summary["kernels"]}["BD"]
    assert "as_forward" not in described and described["via"] == UCUDNN, described
    [shrink] = summary["shrinks"]
    assert shrink["kernel"] == site.call.problem(BD).describe() and shrink["failed"] > 0
    assert site.kernels[BD].via == UCUDNN and described["workspace"] <= shrink["failed"] // 2


@pytest.mark.parametrize("own_ms, swept", [(0.1, False), (1.0, True)])
def test_under_pressure_a_long_own_layer_is_swept_though_the_favourite_fits(tmp_path, rng, own_ms, swept):
    """With limits from the timeline and a moment far from ROOMY_BYTES, torch's benchmark mode
    may have settled for a slow plan: a layer whose own kernels take SWEPT_UNDER_PRESSURE_MS or
    more is swept (then kept where ucudnn is faster); a shorter one keeps its own with no sweep."""
    framework = NumpyArrays(own_ms=own_ms / 3, free=64 * 2**20)
    plans = Planner(Settings.load(env={}, timeline=True, planning="first_call", progress=False), framework,
                    Cache(tmp_path / "bench.db"))
    site = Site(Call(ConvProblem(F, (4, 3, 8, 8), (4, 3, 3, 3))))
    step(plans, site, rng)
    kernels = summary_of(plans)["kernels"]
    assert all(k["swept"] == swept for k in kernels), kernels
    assert framework.pressures == [quantized(64 * 2**20 - site.call.problem(k).written_bytes()) for k in (F, BD, BF)]


@pytest.mark.parametrize("own_of_favourite, swept", [(1.0, False), (1.25, False), (2.0, True)])
def test_under_pressure_a_long_layer_as_fast_as_cuDNNs_favourites_is_not_swept(tmp_path, rng, own_of_favourite, swept):
    """Under pressure a long layer is swept only where its own kernels ran slower than cuDNN's
    favourites, which fit their rooms, timed once at the whole batch, by more than FAVOURITE_SLACK:
    else torch's benchmark mode did not settle for a slow plan, and the layer keeps its own with
    no sweep."""
    site = Site(Call(ConvProblem(F, (32, 64, 28, 28), (64, 64, 3, 3))))
    favourites = {favourite_ms(site.call.problem(kind)) for kind in site.kinds}  # the fakes time the three alike
    assert len(favourites) == 1 and 3 * min(favourites) >= SWEPT_UNDER_PRESSURE_MS  # a long layer
    framework = NumpyArrays(own_ms=own_of_favourite * min(favourites), free=2 * 2**30)  # under ROOMY_BYTES
    plans = Planner(Settings.load(env={}, timeline=True, planning="first_call", progress=False), framework,
                    Cache(tmp_path / "bench.db"))
    step(plans, site, rng)
    kernels = summary_of(plans)["kernels"]
    assert all(k["swept"] == swept for k in kernels), kernels
    assert all(k["delegated"] != swept for k in kernels)
    assert {k["favourite_ms"] for k in kernels} == favourites  # reported beside torch's


def test_a_favourite_that_cannot_be_timed_leaves_the_decision_to_a_sweep():
    """Groups of kernels timed together are weighed together; a favourite not timed (inf) never
    spares a sweep."""
    own = [OwnTiming(1.0, 0), OwnTiming(2.0, 0), OwnTiming(2.0, 0)]
    assert as_fast_as_favourites(own, [1.0, 1.5, 1.7], [[0], [1, 2]])  # 4.0 <= 1.25 * 3.2
    assert not as_fast_as_favourites(own, [1.0, 1.0, 1.0], [[0], [1, 2]])
    assert not as_fast_as_favourites(own, [1.0, math.inf, 1.7], [[0], [1, 2]])
    assert not as_fast_as_favourites(own, [1.0, 1.5, 1.7], [[0], [1], [2]])  # kernel by kernel: 2.0 > 1.25 * 1.5


def test_a_site_s_moments_are_frozen_after_recorded_calls_while_it_waits(tmp_path, monkeypatch, rng):
    """A layer still waiting for its plan after RECORDED_CALLS calls observes no more: a plan
    spread over several slices is made for the rooms it started with."""
    framework = NumpyArrays(free=64 * 2**20)
    plans = Planner(Settings.load(env={}, timeline=True, progress=False), framework, Cache(tmp_path / "bench.db"))
    monkeypatch.setattr(plans, "plan_pending", lambda budget_s=None: len(plans.pending))
    site = Site(Call(ConvProblem(F, (4, 3, 8, 8), (4, 3, 3, 3))))
    seen = []
    for call in range(RECORDED_CALLS + 2):
        framework.free = (64 - call) * 2**20
        assert plans.route(site)  # torch's own, waiting
        seen.append(plans.observing(site))
    assert seen == [True] * RECORDED_CALLS + [False] * 2
    assert site.free[F] == (64 - RECORDED_CALLS + 1) * 2**20 - site.call.problem(F).written_bytes()


def test_a_slice_of_planning_holds_one_planning_scope_around_its_kernels(tmp_path, monkeypatch, rng):
    """plan_pending opens the framework's planning scope once for its slice, so that what a
    kernel's planning cached (torch: a blocker's gigabytes) is not given back and taken again
    kernel by kernel; the kernels' own scopes nest inside it."""
    framework = NumpyArrays(own_ms=0.0, free=64 * 2**20)
    plans = Planner(Settings.load(env={}, timeline=True, progress=False), framework, Cache(tmp_path / "bench.db"))
    sites = [Site(Call(ConvProblem(F, (4, c, 8, 8), (4, c, 3, 3)))) for c in (3, 5)]
    for _ in range(RECORDED_CALLS):
        for site in sites:
            assert plans.route(site)  # torch's own while it waits: F observed ...
            plans.observe(site, site.kinds[1:])  # ... and its backward as it starts
    plans.plan_pending()
    assert len(framework.timed) == 6 and all(depth == 2 for depth in framework.depths), framework.depths
    assert framework.scopes == []


def on_a_clock(tmp_path) -> tuple[NumpyArrays, Planner]:
    """A framework whose marks read a fake clock (`now`, ms), and a planner with limits from the
    memory timeline over it."""
    framework = NumpyArrays(own_ms=0.0, free=64 * 2**20)
    framework.now = 0.0
    return framework, Planner(Settings.load(env={}, timeline=True, progress=False), framework, Cache(tmp_path / "bench.db"))


def observed_call(plans, framework, site, forward_ms: float, backward_ms: float) -> None:
    """One observed call of the site's layer on the fake clock: its forward takes `forward_ms`,
    its backward kernels together `backward_ms` (as InStep's windows see them)."""
    assert plans.route(site)  # its forward starts ...
    framework.now += forward_ms
    plans.observed_end(site, site.kinds[:1])  # ... and ends
    plans.observe(site, site.kinds[1:])
    framework.now += backward_ms
    plans.observed_end(site, site.kinds[1:])


def test_a_layer_s_own_kernels_are_reported_as_they_ran_in_its_observed_calls(tmp_path, rng):
    """While a layer waits for its plan, the time from each of its kernel groups' start to its end
    (the forward kernel; the backward kernels together) is marked in each observed call; the
    least per group is reported on each of its kinds, beside the timing on operands of its own.
    Each window's start holds the device first, so that it times the device, not the host."""
    framework, plans = on_a_clock(tmp_path)
    site = Site(Call(ConvProblem(F, (4, 3, 8, 8), (4, 3, 3, 3))))
    for forward_ms, backward_ms in [(3.0, 9.0)] + [(2.0, 11.0)] * (RECORDED_CALLS - 1):
        observed_call(plans, framework, site, forward_ms, backward_ms)
    plans.plan_pending()
    got = {k["kind"]: k["in_step_ms"] for k in summary_of(plans)["kernels"]}
    assert got == {"F": 2.0, "BD": 9.0, "BF": 9.0}
    assert framework.holds == [IN_STEP_HOLD_S, 0.0] * 2 * RECORDED_CALLS  # (start, end) of F and of BD+BF, each call


def test_layers_of_one_call_are_judged_on_the_least_window_any_of_them_took(tmp_path, rng):
    """The framework runs one plan per call wherever its layers are (torch's benchmark mode keeps
    a plan per problem), so a window that held a stall of the host is not the plan's time: r3d_18's
    first 64-channel layer took 0.97 ms a forward in its window, the next layer of the same shape
    0.41 ms, and 0.30 ms steady (docs/results.md, "Forty steps")."""
    framework, plans = on_a_clock(tmp_path)
    call = Call(ConvProblem(F, (4, 3, 8, 8), (4, 3, 3, 3)))
    first, second = Site(call), Site(call)
    for _ in range(RECORDED_CALLS):
        for site, forward_ms, backward_ms in ((first, 0.97, 0.63), (second, 0.41, 0.59)):
            observed_call(plans, framework, site, forward_ms, backward_ms)
    plans.plan_pending()
    got = {k["kind"]: k["in_step_ms"] for k in summary_of(plans)["kernels"]}
    assert got == {"F": pytest.approx(0.41), "BD": pytest.approx(0.59), "BF": pytest.approx(0.59)}
    assert framework.timed == []


def test_a_layer_is_judged_on_its_third_call_where_the_pool_has_stopped_growing(tmp_path, rng):
    """The first step holds torch's benchmark search; in the second, the optimizer's state pushes
    the pool past the first step's peak and the windows it grows in run up to 2x (r3d_18's
    64-channel forward: 0.61 ms against 0.30 in the third; docs/results.md, "Three observed
    calls"). Judged on the least of three calls, a layer that saves nothing is left to torch,
    where two calls would have kept it for a saving the second step made up."""
    framework, plans = on_a_clock(tmp_path)
    site = Site(Call(ConvProblem(F, (4, 3, 8, 8), (4, 3, 3, 3))))
    assert RECORDED_CALLS == 3
    for forward_ms, backward_ms in ((40.0, 60.0), (0.3, 0.4), (0.06, 0.05)):
        observed_call(plans, framework, site, forward_ms, backward_ms)
    plans.plan_pending()
    kernels = summary_of(plans)["kernels"]
    assert all(k["delegated"] for k in kernels), kernels
    assert {k["kind"]: k["in_step_ms"] for k in kernels} == {"F": pytest.approx(0.06), "BD": pytest.approx(0.05),
                                                            "BF": pytest.approx(0.05)}


def test_a_layer_slow_in_the_step_is_judged_on_that_across_slices_of_planning(tmp_path, rng):
    """Torch's own kernels timed apart can be fast where the step ran them slowly (torch's plan
    cache settled for a slow plan at the kernel's moment: wav2vec2's last layer, 78 ms a backward
    in the step, 0.3 ms timed apart). The step's windows decide, also where the layer's sweep
    spans several slices of plan_pending, and nothing is timed apart."""
    framework, plans = on_a_clock(tmp_path)
    site = Site(Call(ConvProblem(F, (4, 3, 8, 8), (4, 3, 3, 3))))
    for _ in range(RECORDED_CALLS):
        observed_call(plans, framework, site, 0.01, 78.0)
    slices = 1
    while plans.plan_pending(0.0):  # a slice runs out after each kernel planned
        slices += 1
    assert slices > 1 and framework.timed == []
    assert not any(k["delegated"] for k in summary_of(plans)["kernels"])


def test_rooms_are_lessened_by_what_the_process_took_beside_the_pool_since_they_were_observed(tmp_path, rng):
    """Planning loads cuDNN's handle and kernels' code outside the framework's pool: the moments
    observed before it have that much less free once it ran, and each observed room is lessened
    by it once, as the layer's planning begins (never raised where the process gave some back)."""
    MiB = 2**20
    sites = [Site(Call(ConvProblem(F, (4, c, 8, 8), (4, c, 3, 3)))) for c in (3, 5)]
    framework = NumpyArrays(own_ms=0.0, free=256 * MiB)
    plans = Planner(Settings.load(env={}, timeline=True, progress=False), framework, Cache(tmp_path / "bench.db"))
    for _ in range(RECORDED_CALLS):
        for site in sites:
            assert plans.route(site)
            plans.observe(site, site.kinds[1:])
    observed = [dict(site.free) for site in sites]
    framework.outside = 40 * MiB  # taken after the last observation
    slices = 1
    while plans.plan_pending(0.0):  # a slice runs out after each kernel planned
        slices += 1
    assert slices == 2  # one a site
    for site, before in zip(sites, observed):
        assert site.free == {kind: free - 40 * MiB for kind, free in before.items()}
    rooms = {(k["kind"], k["room"]) for k in summary_of(plans)["kernels"]}
    assert ("F", quantized(observed[0][F] - 40 * MiB)) in rooms


def test_each_observed_window_is_reported_with_what_the_allocator_did_inside_it(tmp_path, rng):
    """Where a window ran long, the summary says whether the allocator flushed inside it (a cost
    the step pays) or took memory from the device (the pool growing to the step's peak, paid
    once), window by window in call order; the counts are read outside the window's marks."""
    framework, plans = on_a_clock(tmp_path)
    flushes, grown = [0], [0]
    framework.flushes, framework.grown = (lambda device: flushes[0]), (lambda device: grown[0])
    site = Site(Call(ConvProblem(F, (4, 3, 8, 8), (4, 3, 3, 3))))
    assert plans.route(site)  # the first call's forward: a flush inside its window
    flushes[0] += 1
    framework.now += 3.0
    plans.observed_end(site, site.kinds[:1])
    plans.observe(site, site.kinds[1:])  # its backward: the pool grows twice
    grown[0] += 2
    framework.now += 9.0
    plans.observed_end(site, site.kinds[1:])
    for _ in range(RECORDED_CALLS - 1):
        observed_call(plans, framework, site, 2.0, 11.0)
    plans.plan_pending()
    got = {k["kind"]: k["in_step_windows"] for k in summary_of(plans)["kernels"]}
    later = RECORDED_CALLS - 1
    assert got == {"F": [[3.0, 1, 0]] + [[2.0, 0, 0]] * later, "BD": [[9.0, 0, 2]] + [[11.0, 0, 0]] * later,
                   "BF": [[9.0, 0, 2]] + [[11.0, 0, 0]] * later}
    from ucudnn.reports import kernels
    table = kernels.table(summary_of(plans))
    assert "| 3.00 (1, 0), 2.00" in table and "| 9.00 (0, 2), 11.00" in table
    assert "| 3.00 (1, 0), 2.00 |" in kernels.table({"kernels": [dict(summary_of(plans)["kernels"][0],
                                                                      in_step_windows=[[3.0, 1], [2.0, 0]])]})


def test_a_window_missing_a_mark_is_no_window():
    """No mark while a CUDA graph is captured (None): that call's window is left out."""
    from ucudnn.plan.moments import InStep, least

    in_step = InStep()
    in_step.start((F,), 1.0)
    in_step.end((F,), None)
    in_step.start((F,), None)
    in_step.end((F,), 5.0)
    in_step.start((F,), 2.0)
    in_step.end((F,), 2.5)
    assert least(in_step.each(lambda a, b: b - a)) == {(F,): 0.5}


def test_where_the_time_goes_reads_the_summary_kernel_by_kernel(tmp_path, rng):
    """ucudnn.reports.kernels: a row per kernel of the planner's summary with its room, limit,
    plan and the framework's own time, and the plot of them, from the summary as it is."""
    from ucudnn.reports import kernels

    framework, plans = on_a_clock(tmp_path)
    site = Site(Call(ConvProblem(F, (4, 3, 8, 8), (4, 3, 3, 3))))
    for _ in range(RECORDED_CALLS):
        observed_call(plans, framework, site, 5.0, 9.0)
    plans.plan_pending()
    summary = summary_of(plans)
    rows = kernels.table(summary).splitlines()
    assert rows[0].startswith("| kind | kernel | room MiB | limit MiB | ucudnn plan |")
    body = [r for r in rows[2:] if r.startswith("| ")]
    assert [r.split(" | ")[0] for r in body] == ["| F", "| BD", "| BF"]
    assert all(" | ucudnn | -" in r for r in body)  # runs ucudnn's plans; no flushes counted
    pytest.importorskip("matplotlib")
    kernels.plot_kernels(summary, tmp_path / "kernels.png", "a layer")
    assert (tmp_path / "kernels.png").stat().st_size > 0
