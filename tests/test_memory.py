"""CPU: ucudnn when GPU memory is short. Out-of-memory measurements are measured again later,
benchmark operands that do not fit raise DeviceMemoryError, a workspace that cannot be allocated
is planned again within less (WR kernels, WD's network, ucudnn.torch's borrowed workspaces), and
limits from the memory timeline (workspace_limit="auto")."""
from __future__ import annotations

import contextlib
import copy
import types
import warnings
from dataclasses import replace

import pytest

from ucudnn.core.errors import ConfigError, DeviceMemoryError, UcudnnWarning
from ucudnn.core.measurements import OK, OUT_OF_MEMORY, KernelTable, Measurement
from ucudnn.core.problem import ConvKind, ConvProblem
from ucudnn.measure.cache import Cache
from ucudnn.plan.assignment import ALLOCATION_GRANULE, NO_MEMORY

from fakes import FakeAllocator, FakeBenchmarker
from test_assignment import LAYERS, make_assignments

MiB = 2**20


# --- measurements and benchmark scratch --------------------------------------------------------------

def test_out_of_memory_rows_count_as_unmeasured_where_they_could_fit():
    table = KernelTable([Measurement("legacy:A0", 8, 1.0, 0, OK), Measurement("legacy:A2", 8, None, 100 * MiB, OUT_OF_MEMORY)])
    assert table.complete_for(8, 64 * MiB)  # it could not fit this limit anyway
    assert not table.complete_for(8, 128 * MiB) and not table.complete_for(8, None)


class PressuredBenchmarker(FakeBenchmarker):
    """FakeBenchmarker on a GPU with `free` bytes: candidates whose workspace does not fit are
    recorded out of memory, as CudnnBenchmarker records them."""

    def __init__(self, free: int):
        super().__init__()
        self.free = free

    def measure(self, problem, sizes, cap, backend=None, best=None, skip=()):
        return [m if m.workspace <= self.free or m.status != OK else Measurement(m.algo, m.batch, None, m.workspace, OUT_OF_MEMORY)
                for m in super().measure(problem, sizes, cap, backend)]


def test_a_run_under_pressure_takes_no_candidate_from_a_later_run(tmp_path):
    """Measured with 16 KiB free, the fast candidates are out of memory; a later run with the
    memory measures them again (same cache) and plans as an unpressured run does."""
    p = LAYERS[0]
    pressured, _, _ = make_assignments(tmp_path, bench=PressuredBenchmarker(16 * 2**10), workspace_limit="1MiB")
    assert pressured.get(p).workspace_size <= 16 * 2**10
    later, bench, _ = make_assignments(tmp_path, workspace_limit="1MiB")
    fresh, _, _ = make_assignments(tmp_path / "fresh", workspace_limit="1MiB")
    assert later.get(p).configuration == fresh.get(p).configuration
    assert bench.calls > 0  # the out-of-memory sizes were measured again


def test_benchmark_operands_that_do_not_fit_raise_device_memory_error(monkeypatch):
    from ucudnn.execute import gpu
    from ucudnn.measure import benchmark

    class OutOfMemory(MemoryError):
        pass

    def no_memory(shape, dtype, seed):
        raise OutOfMemory

    monkeypatch.setattr(gpu, "cupy", lambda: types.SimpleNamespace(cuda=types.SimpleNamespace(
        memory=types.SimpleNamespace(OutOfMemoryError=OutOfMemory))))
    monkeypatch.setattr(gpu, "random_array", no_memory)
    p = ConvProblem("F", (64, 3, 224, 224), (64, 3, 11, 11), strides=4, pads=2)
    with pytest.raises(DeviceMemoryError, match=r"out of GPU memory allocating \d+\.\d MiB .*ucudnn bench") as caught:
        benchmark.Scratch().operands(p)
    assert caught.value.nbytes == p.operand_bytes() and isinstance(caught.value, MemoryError)


# --- planning again within less -------------------------------------------------------------------------

class ScarceAllocator(FakeAllocator):
    """FakeAllocator that has only `free` bytes for any one buffer: larger ones raise MemoryError."""

    def __init__(self, free: int):
        super().__init__()
        self.free, self.refused = free, []

    def __call__(self, nbytes: int) -> int:
        if nbytes > self.free:
            self.refused.append(nbytes)
            raise MemoryError(nbytes)
        return super().__call__(nbytes)


def scarce(assignments, free: int) -> ScarceAllocator:
    allocator = assignments._allocate = ScarceAllocator(free)
    return allocator


def test_wr_plans_again_within_half_until_the_workspace_fits(tmp_path):
    assignments, _, _ = make_assignments(tmp_path, workspace_limit="1MiB")
    allocator = scarce(assignments, 100 * 2**10)
    with pytest.warns(UcudnnWarning, match="planning again within"):
        plan = assignments.get(LAYERS[0])
    assert 0 < plan.workspace_size <= 100 * 2**10 and allocator.refused
    assert [s.failed for s in assignments.shrinks] == allocator.refused
    assert all(s.limit == s.failed // 2 and s.why == NO_MEMORY for s in assignments.shrinks)
    assert plan.configuration.batch == LAYERS[0].batch


def test_wd_solves_the_network_again_within_half_until_its_buffer_fits(tmp_path):
    assignments, _, _ = make_assignments(tmp_path, optimizer="wd", total_limit="4MiB")
    allocator = scarce(assignments, 300 * 2**10)
    for p in LAYERS:
        assignments.record(p)
    with pytest.warns(UcudnnWarning, match="the network's 4 kernels"):
        assignments.finalize()
    assert 0 < assignments.wd_result.total_workspace <= 300 * 2**10
    assert assignments.wd_limit == allocator.refused[-1] // 2 and len(assignments) == len(LAYERS)


def test_wd_finalize_with_a_total_uses_it(tmp_path):
    assignments, _, allocator = make_assignments(tmp_path, optimizer="wd", total_limit="4MiB")
    for p in LAYERS:
        assignments.record(p)
    assignments.finalize(total=200 * 2**10)
    assert assignments.wd_limit == 200 * 2**10 and allocator.sizes[0] <= 200 * 2**10


def test_shrink_halves_what_the_caller_could_not_borrow(tmp_path):
    assignments, _, _ = make_assignments(tmp_path, workspace_limit="1MiB")
    before = assignments.get(LAYERS[0]).workspace_size
    with pytest.warns(UcudnnWarning):
        after = assignments.shrink(LAYERS[0])
    assert after.workspace_size <= before // 2 and assignments.shrinks == [(LAYERS[0].describe(), before, before // 2, NO_MEMORY)]


def test_shrink_plans_from_the_measurements_at_hand_and_measures_only_where_they_hold_no_plan(tmp_path):
    """Planning again for lack of memory: measuring needs the operands' memory, which is short,
    so the tables already measured are used where they hold a plan within the new limit."""
    assignments, bench, _ = make_assignments(tmp_path, workspace_limit="64MiB")  # a pruned search would measure
    before = assignments.get(LAYERS[0]).workspace_size                              # more sizes within half of it
    calls = bench.calls
    with pytest.warns(UcudnnWarning):
        after = assignments.shrink(LAYERS[0])
    assert bench.calls == calls and 0 < after.workspace_size <= before // 2
    fresh, _, _ = make_assignments(tmp_path / "at-half", workspace_limit=before // 2)
    assert after.configuration.time_ms >= fresh.get(LAYERS[0]).configuration.time_ms - 1e-9

    empty, bench, _ = make_assignments(tmp_path / "empty", workspace_limit="1MiB")
    empty._assigned[LAYERS[1].key] = replace(empty.get(LAYERS[0]), workspace_size=before)  # as if assigned
    calls = bench.calls
    with pytest.warns(UcudnnWarning):
        empty.shrink(LAYERS[1])  # nothing measured for this kernel: it is measured now
    assert bench.calls > calls and empty.get(LAYERS[1]).configuration.batch == LAYERS[1].batch


def test_shrink_plans_within_what_the_caller_can_still_have_where_that_is_at_least_half(tmp_path):
    granule = ALLOCATION_GRANULE
    for n, (available_of, within_of) in enumerate([
            (lambda f: f - 3 * granule, lambda f: f - 3 * granule),  # less than failed: what is free
            (lambda f: f + granule, lambda f: f - granule),  # free, yet rounded above it: a granule below
            (lambda f: f // 10, lambda f: f // 2),  # under half: half
            (lambda f: None, lambda f: f // 2)]):  # nothing known: half
        assignments, _, _ = make_assignments(tmp_path / str(n), workspace_limit="64MiB")
        failed = assignments.get(LAYERS[0]).workspace_size
        assert failed > 8 * granule  # so that every case above is over half
        available = available_of(failed)
        said = "" if available is None else rf"\({available / 2**20:.1f} MiB free\); "
        with pytest.warns(UcudnnWarning, match=said + rf"planning again within {within_of(failed) / 2**20:.1f} MiB"):
            after = assignments.shrink(LAYERS[0], available=available)
        assert assignments.shrinks == [(LAYERS[0].describe(), failed, within_of(failed), NO_MEMORY)]
        assert after.workspace_size <= within_of(failed)


def test_a_granule_below_is_tried_once_then_half(tmp_path):
    """Where what is free seemed to hold the workspace and it failed twice, what is free is not
    what can be had: the second shrink halves rather than creep down a granule at a time (the
    rule, Assignments._smaller, on workspaces of known size; other kernels keep their own count)."""
    assignments, _, _ = make_assignments(tmp_path, workspace_limit="64MiB")
    mib = 2**20
    free = 256 * mib
    with pytest.warns(UcudnnWarning):
        limits = [assignments._smaller(64 * mib, "BD a", free), assignments._smaller(60 * mib, "BD a", free),
                  assignments._smaller(64 * mib, "BD b", free)]
    assert limits == [64 * mib - ALLOCATION_GRANULE, 30 * mib, 64 * mib - ALLOCATION_GRANULE]


# --- ucudnn.torch -------------------------------------------------------------------------------------------

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import ucudnn.torch as ut  # noqa: E402
from ucudnn.integrations.torch import TorchFramework, TorchPool  # noqa: E402
from ucudnn.plan.framework import OwnTiming  # noqa: E402
from ucudnn.plan.memory import RECORDED_CALLS, WATCHED_STEPS, Memory, quantized, workspace_limit  # noqa: E402

from test_torch_cpu import assert_matches, run_step  # noqa: E402
from torch_doubles import Clocked, NumpyFramework  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")


class ScarceFramework(NumpyFramework):
    """Borrowed workspaces larger than `free` bytes cannot be had, as from a GPU under pressure."""

    def __init__(self, free: int, **kwargs):
        super().__init__(**kwargs)
        self.free, self.refused = free, []

    def make_handle(self, settings, cache, device):
        handle = super().make_handle(settings, cache, device)
        handle.assignments._allocate = lambda nbytes: 0  # WR borrows at each call, as TorchFramework's handles do
        return handle

    def borrow(self, nbytes, device):
        if nbytes > self.free:
            self.refused.append(nbytes)
            raise DeviceMemoryError("a convolution workspace", nbytes)
        return super().borrow(nbytes, device)

    def settled_memory(self, device):
        return Memory(self.free, 0)


def test_a_workspace_that_cannot_be_borrowed_is_planned_within_what_the_device_has_free(tmp_path):
    """Where the device has at least half of what failed, the kernel is planned within that."""
    framework = ScarceFramework(free=2**30)
    context = ut.Context(framework=framework, cache=Cache(tmp_path / "bench.db"), workspace_limit="1MiB",
                         planning="first_call", delegate=False)
    conv = ut.convert(nn.Conv2d(8, 16, 3, padding=1), context=context)
    x = torch.randn(16, 8, 10, 10)
    with torch.no_grad():
        conv(x)
    planned = context.summary()["kernels"][0]["workspace"]
    framework.free = planned * 3 // 4
    with pytest.warns(UcudnnWarning, match="planning again within"):
        with torch.no_grad():
            conv(x)
    assert context.summary()["shrinks"] == [dict(kernel=context.summary()["shrinks"][0]["kernel"], failed=planned,
                                                 limit=planned * 3 // 4, why=NO_MEMORY)]
    assert 0 < context.summary()["kernels"][0]["workspace"] <= planned * 3 // 4


def test_a_workspace_torch_cannot_lend_is_planned_within_less_and_the_step_goes_on(tmp_path):
    torch.manual_seed(0)
    theirs = nn.Conv2d(8, 16, 3, padding=1)
    framework = ScarceFramework(free=20 * 2**10)
    context = ut.Context(framework=framework, cache=Cache(tmp_path / "bench.db"), workspace_limit="1MiB",
                         planning="first_call")
    ours = ut.convert(copy.deepcopy(theirs), context=context)
    x, dy = torch.randn(16, 8, 10, 10), torch.randn(16, 16, 10, 10)
    with pytest.warns(UcudnnWarning, match="planning again within"):
        got = run_step(ours, x, dy)
    assert_matches(got, run_step(theirs, x, dy))
    summary = context.summary()
    assert framework.refused and [s["failed"] for s in summary["shrinks"]] == framework.refused
    assert all(k["workspace"] <= 20 * 2**10 for k in summary["kernels"])
    refused = len(framework.refused)
    assert_matches(run_step(ours, x, dy), run_step(theirs, x, dy))
    assert len(framework.refused) == refused  # planned once: the next step borrows what fits


def test_a_second_site_adopts_the_shrunk_kernel_without_halving_it_again(tmp_path):
    """Two sites (no grad, grad) hold the same planned F kernel; memory then runs short: the
    first site to fail shrinks it, the other adopts the result."""
    framework = ScarceFramework(free=2**30)
    context = ut.Context(framework=framework, cache=Cache(tmp_path / "bench.db"), workspace_limit="1MiB",
                         planning="first_call")
    conv = ut.convert(nn.Conv2d(8, 16, 3, padding=1), context=context)
    x = torch.randn(16, 8, 10, 10)
    calls = [lambda: conv(x), lambda: conv(x.clone().requires_grad_())]
    with torch.no_grad():
        calls[0]()
    calls[1]()
    framework.free = 20 * 2**10
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UcudnnWarning)
        with torch.no_grad():
            calls[0]()
        before = context.summary()
        calls[1]()
    after = context.summary()
    assert before["shrinks"] and after["shrinks"] == before["shrinks"]
    assert after["kernels"] == before["kernels"]  # the same plan, not a smaller one or torch's


def test_cuda_backend_turns_torchs_out_of_memory_into_device_memory_error(monkeypatch):
    def no_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(torch, "empty", no_memory)
    with pytest.raises(DeviceMemoryError, match="2048.0 MiB for a convolution workspace"):
        TorchPool.borrow(2**31, torch.device("cpu"))


class Timeline(NumpyFramework):
    """free_bytes() walks through `moments` (bytes free, one value per call, round and round), as
    a training step's memory moves; `asked` counts the readings."""

    def __init__(self, moments, **kwargs):
        super().__init__(**kwargs)
        self.moments, self.asked = list(moments), 0

    def free_bytes(self, device):
        self.asked += 1
        return self.moments[(self.asked - 1) % len(self.moments)]


class ClockedTimeline(Timeline, Clocked):
    """A Timeline whose marks move (Clocked): layers' own kernels are seen in the step."""


def two_layers(tmp_path, framework, **settings):
    """Two converted layers of one shape (8 -> 8 channels) in a row, under a context of `framework`."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1))
    context = ut.Context(framework=framework, cache=Cache(tmp_path / "bench.db"), **settings)
    return model, ut.convert(copy.deepcopy(model), context=context), context


def by_room(context) -> dict:
    """summary()'s kernels by (kind, room)."""
    return {(k["kind"], k["room"]): k for k in context.summary()["kernels"]}


def test_auto_is_convert_s_default_and_a_limit_given_anywhere_is_fixed(tmp_path, monkeypatch):
    monkeypatch.delenv("UCUDNN_WORKSPACE_LIMIT", raising=False)
    monkeypatch.delenv("UCUDNN_TOTAL_LIMIT", raising=False)
    assert ut.Context(framework=NumpyFramework()).settings.auto
    assert ut.Context(framework=NumpyFramework(), total_limit="auto").settings.auto
    assert ut.Context(framework=NumpyFramework(), optimizer="wd", total_limit="auto").settings.optimizer == "wr"
    assert not ut.Context(framework=NumpyFramework(), workspace_limit="64MiB").settings.auto
    assert not ut.Context(framework=NumpyFramework(), optimizer="wd").settings.auto  # the paper's WD: a total of limits
    monkeypatch.setenv("UCUDNN_WORKSPACE_LIMIT", "32MiB")
    assert not ut.Context(framework=NumpyFramework()).settings.auto
    monkeypatch.setenv("UCUDNN_WORKSPACE_LIMIT", "auto")
    context = ut.Context(framework=NumpyFramework())
    assert context.settings.auto and "auto" in repr(context)


def test_auto_limits_refuse_what_contradicts_them():
    with pytest.raises(ConfigError, match="optimizer='wr'"):
        ut.Context(framework=NumpyFramework(), total_limit="auto", optimizer="wr")
    with pytest.raises(ConfigError, match="give one of them"):
        ut.Context(framework=NumpyFramework(), total_limit="auto", workspace_limit="64MiB")


def test_a_layer_runs_torch_s_convolution_while_its_moments_are_observed_then_is_planned_within_them(tmp_path):
    """Two layers of one shape at moments with different bytes free: each kernel is planned
    within what its own moment left (the least of RECORDED_CALLS calls, less what it writes,
    less the margin), so the one shape gets two plans; torch's own kernels are timed with
    only the room of their moment free."""
    # per iteration: conv1's F, conv2's F, conv2's backward, conv1's backward
    first = [900 * MiB, 40 * MiB, 30 * MiB, 700 * MiB]
    second = [800 * MiB, 48 * MiB, 36 * MiB, 600 * MiB]  # the optimizer's state now takes some
    framework = Timeline(first + second)
    model, ours, context = two_layers(tmp_path, framework, delegate=True)
    x = torch.randn(4, 8, 6, 6)
    for _ in range(RECORDED_CALLS):
        assert_matches(run_step(ours, x), run_step(model, x))
        assert not context.runs.get(("ucudnn", "F"))  # still torch's own convolution
    assert framework.asked == 4 * RECORDED_CALLS  # four moments a call
    got = run_step(ours, x)  # planned at the start of this iteration
    assert_matches(got, run_step(model, x))
    y_bytes, dx_bytes, dw_bytes = 4 * 8 * 36 * 4, 4 * 8 * 36 * 4, 8 * 8 * 9 * 4
    rooms = {("F", quantized(800 * MiB - y_bytes)), ("F", quantized(40 * MiB - y_bytes)),
             ("BD", quantized(30 * MiB - dx_bytes - dw_bytes)), ("BF", quantized(30 * MiB - dx_bytes - dw_bytes)),
             ("BD", quantized(600 * MiB - dx_bytes - dw_bytes)), ("BF", quantized(600 * MiB - dx_bytes - dw_bytes))}
    kernels = by_room(context)
    assert set(kernels) == rooms
    for (kind, room), kernel in kernels.items():
        assert kernel["limit"] == workspace_limit(room) and kernel["workspace"] <= kernel["limit"]
    assert sorted(framework.pressures) == sorted(room for _, room in rooms)  # torch timed at each moment
    assert framework.asked == 4 * RECORDED_CALLS  # planned layers are observed no more


def test_under_auto_each_kernel_is_planned_within_its_room_less_the_margin(tmp_path, monkeypatch):
    """The limit each Handle.within call receives, not summary()'s own reading of it: the room
    of the kernel's moment (quantized) less the margin (workspace_limit), never the room itself."""
    from handle_doubles import NumpyHandle

    asked = []
    within = NumpyHandle.within
    monkeypatch.setattr(NumpyHandle, "within", lambda self, problem, limit: asked.append(limit) or
                        within(self, problem, limit))
    first = [900 * MiB, 40 * MiB, 30 * MiB, 700 * MiB]
    framework = Timeline(first)
    model, ours, context = two_layers(tmp_path, framework, delegate=False)
    x = torch.randn(4, 8, 6, 6)
    for _ in range(RECORDED_CALLS + 1):
        run_step(ours, x)
    rooms = {k["room"] for k in context.summary()["kernels"]}
    assert asked and set(asked) <= {workspace_limit(room) for room in rooms}
    assert not set(asked) & rooms  # a kernel's whole room is never its limit


def test_each_layer_s_own_kernels_are_timed_in_the_step_while_observed(tmp_path):
    """A converted layer marks its forward and (its input taking a gradient) its backward as they
    run in its observed calls: every kernel reports its time in the step."""
    framework = ClockedTimeline([900 * MiB, 40 * MiB, 30 * MiB, 700 * MiB])
    model, ours, context = two_layers(tmp_path, framework, delegate=True)
    x = torch.randn(4, 8, 6, 6)
    for _ in range(RECORDED_CALLS + 1):
        assert_matches(run_step(ours, x), run_step(model, x))
    kernels = context.summary()["kernels"]
    assert {k["kind"] for k in kernels} == {"F", "BD", "BF"}
    assert all(k["in_step_ms"] > 0 for k in kernels), kernels
    assert framework.timed == []  # seen in the step, quick: delegated with none timed apart


def test_a_layer_whose_backward_was_not_seen_has_its_own_kernels_timed_apart(tmp_path):
    """Observed calls with no backward (forward passes with gradients on, none taken): no window
    for the backward kernels, so every kernel is timed on operands of its own."""
    framework = ClockedTimeline([900 * MiB, 40 * MiB])
    model, ours, context = two_layers(tmp_path, framework, delegate=True)
    x = torch.randn(4, 8, 6, 6, requires_grad=True)
    for _ in range(RECORDED_CALLS):
        ours(x)
    ours(x).sum().backward()
    timed = [p.kind.value for p in framework.timed]  # the layers' backward share one room: timed once
    assert sorted(timed) == ["BD", "BF", "F", "F"], timed
    assert all(not ours[i].weight._post_accumulate_grad_hooks for i in (0, 2))  # none left behind


def test_a_moment_with_no_room_plans_without_workspace_and_the_step_matches(tmp_path):
    framework = Timeline([0])
    model, ours, context = two_layers(tmp_path, framework, delegate=False)
    x = torch.randn(4, 8, 6, 6)
    for _ in range(RECORDED_CALLS + 1):
        got = run_step(ours, x)
    assert_matches(got, run_step(model, x))
    assert context.runs[("ucudnn", "F")] == 2
    assert all(k["limit"] == 0 and k["workspace"] == 0 for k in context.summary()["kernels"])


def test_the_margin_and_grid_keep_a_limit_below_its_room():
    for room in (0, 5 * MiB, 17 * MiB, 100 * MiB, 4 * 2**30, 37 * 2**30 + 12345):
        limit = workspace_limit(room)
        assert 0 <= limit <= max(0, room - room // 16 - 16 * MiB) and limit == quantized(limit)
    assert quantized(100 * MiB) == 96 * MiB and quantized(5 * MiB + 7) == 5 * MiB
    assert workspace_limit(4 * 2**30) >= 3 * 2**30  # a roomy moment keeps most of its bytes


def test_under_auto_a_workspace_that_cannot_be_borrowed_shrinks_and_the_step_goes_on(tmp_path):
    """The timeline promised 1 GiB; at run time only 20 KiB can be had: planned again within
    less, then torch's own where nothing fits, never an error."""
    class Promised(ScarceFramework):
        def free_bytes(self, device):
            return 2**30

    framework = Promised(free=20 * 2**10)
    model, ours, context = two_layers(tmp_path, framework, delegate=False)
    x = torch.randn(16, 8, 10, 10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UcudnnWarning)
        for _ in range(RECORDED_CALLS + 2):
            got = run_step(ours, x)
    assert_matches(got, run_step(model, x))
    summary = context.summary()
    assert framework.refused and summary["shrinks"]
    assert all(k["workspace"] <= 20 * 2**10 for k in summary["kernels"] if k["via"] == "ucudnn")


def planned_two_layers(tmp_path, **settings):
    """two_layers() on a framework that borrows each workspace at each call, with all the memory
    it asks for, planned (`auto` unless a limit is given) and run one step more; summary()'s
    kernels that borrow workspace."""
    framework = ScarceFramework(free=2**40)
    model, ours, context = two_layers(tmp_path, framework, delegate=False, **settings)
    x = torch.randn(16, 8, 10, 10)
    for _ in range(RECORDED_CALLS + 2):
        run_step(ours, x)
    borrowing = [k for k in context.summary()["kernels"] if k["via"] == "ucudnn" and k["workspace"]]
    assert borrowing, "the fake benchmark plans kernels with workspace"
    return framework, model, ours, context, x, borrowing


def test_a_workspace_that_flushes_torchs_cache_is_planned_within_half_and_results_hold(tmp_path):
    """Borrowing a workspace that makes the allocator give its whole cache back (a device sync)
    costs more than a smaller plan (ucudnn.plan.memory): a watched kernel that flushed is planned
    within half, until none flushes; the step's results stay torch's."""
    framework, model, ours, context, x, borrowing = planned_two_layers(tmp_path)
    framework.flush_at = min(k["workspace"] for k in borrowing) - 1  # every borrow flushes
    run_step(ours, x)  # not watched: the step before it did not flush
    with pytest.warns(UcudnnWarning, match="flushing the framework's cache to borrow"):
        run_step(ours, x)  # watched: its kernels flush, and are planned within half as the next step starts
        got = run_step(ours, x)
    assert_matches(got, run_step(model, x))
    shrinks = context.summary()["shrinks"]
    assert {s["failed"] for s in shrinks} == {k["workspace"] for k in borrowing}
    assert all(s["limit"] == s["failed"] // 2 for s in shrinks)  # nothing known of what is free: half
    assert {s["why"] for s in shrinks} == {"flushing the framework's cache to borrow"}
    assert max(k["workspace"] for k in context.summary()["kernels"]) <= max(k["workspace"] for k in borrowing) // 2


def test_a_kernel_whose_smaller_plan_costs_more_than_a_flush_keeps_its_workspace(tmp_path, monkeypatch):
    """A flush costs a step FLUSH_MS; a plan within half predicted slower by more is no trade:
    the kernel stays as planned, watched no more."""
    from ucudnn.plan import flushes

    monkeypatch.setattr(flushes, "FLUSH_MS", -float("inf"))  # any smaller plan costs more than a flush
    framework, model, ours, context, x, borrowing = planned_two_layers(tmp_path)
    framework.flush_at = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", UcudnnWarning)
        for _ in range(2):
            assert_matches(run_step(ours, x), run_step(model, x))
    flushed = framework.flushed
    run_step(ours, x)
    assert flushed and not context.summary()["shrinks"]
    assert [k["workspace"] for k in context.summary()["kernels"] if k["via"] == "ucudnn" and k["workspace"]] \
        == [k["workspace"] for k in borrowing]


def test_kernels_are_not_watched_for_flushes_while_layers_wait_for_their_plan(tmp_path, monkeypatch):
    """Planning gives torch's cache back between its slices: a flush then says nothing of the
    steady step, and would spend the watch's steps."""
    framework, model, ours, context, x, _ = planned_two_layers(tmp_path)
    monkeypatch.setattr(context.planner, "plan_pending", lambda budget_s=None: 0)
    context.planner.pending._sites[object()] = None  # a layer waiting for its plan
    framework.flush_at = 0
    for _ in range(WATCHED_STEPS + 1):
        run_step(ours, x)
    assert framework.flushed and not context.summary()["shrinks"]
    context.planner.pending._sites.clear()
    with pytest.warns(UcudnnWarning, match="flushing the framework's cache"):
        for _ in range(2):  # the first watched, the second starts weighing what flushed
            run_step(ours, x)


class FlushingOwn(NumpyFramework):
    """torch's own kernels flush the cache at every run (their workspace or result, as under
    pressure); its BF is instant and needs no workspace, its F and BD cannot fit: a layer that
    ucudnn keeps, with torch's own BF in place of ucudnn's plan."""

    def __init__(self):
        super().__init__(lambda p: OwnTiming(0.0, 0) if p.kind is ConvKind.BACKWARD_FILTER else OwnTiming(0.0, 2**50))

    def own_kernel(self, problem):
        own = super().own_kernel(problem)
        framework = self

        class Flushing:
            via, counted = own.via, own.counted

            def __init__(self):
                self.problem = problem

            def __call__(self, x, w, y):
                framework.flushed += 1
                return own(x, w, y)
        return Flushing()


@pytest.mark.parametrize("flush_ms, via", [(None, "ucudnn"), (-float("inf"), "torch")], ids=["put-back", "kept"])
def test_torchs_own_kernel_that_flushes_gives_way_to_ucudnns_plan_it_replaced(tmp_path, monkeypatch, flush_ms, via):
    """A faster own kernel plus a flush a step is slower than ucudnn's plan it was put in place of
    (unless that plan is slower still by more than a flush costs)."""
    from ucudnn.plan import flushes

    if flush_ms is not None:
        monkeypatch.setattr(flushes, "FLUSH_MS", flush_ms)
    torch.manual_seed(0)
    plain = nn.Conv2d(3, 4, 3)
    context = ut.Context(framework=FlushingOwn(), cache=Cache(tmp_path / "bench.db"), planning="first_call")
    conv = ut.convert(copy.deepcopy(plain), context=context)
    x = torch.randn(4, 3, 6, 6)
    assert_matches(run_step(conv, x), run_step(plain, x))
    assert context.runs["torch", "BF"] == 1  # torch's own BF in place of ucudnn's plan
    for _ in range(3):  # the first step after planning is watched, then ucudnn's plan runs, or torch's kept
        assert_matches(run_step(conv, x), run_step(plain, x))
    assert {k["kind"]: k["via"] for k in context.summary()["kernels"]}["BF"] == via
    assert context.runs[via, "BF"] >= 2


def test_kernels_are_watched_for_flushes_in_steps_after_one_that_flushed(tmp_path):
    """A plan that changes moves the cached blocks the next step finds: a kernel that did not
    flush in the first step after planning can flush in a later one. Steps after one that
    flushed are watched; others are not (reading the count costs tens of microseconds)."""
    framework, model, ours, context, x, _ = planned_two_layers(tmp_path)
    assert context.summary()["flush_watch"]["watched"] == 1  # the first step after planning, which did not flush
    framework.flush_at = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", UcudnnWarning)
        run_step(ours, x)  # after a step with no flush: not watched
    assert framework.flushed and not context.summary()["shrinks"]
    with pytest.warns(UcudnnWarning, match="flushing the framework's cache"):
        run_step(ours, x)  # after one that flushed: watched
        assert_matches(run_step(ours, x), run_step(model, x))  # what flushed weighed as it starts
    assert context.summary()["shrinks"] and context.summary()["flush_watch"]["watched"] == 3


def test_the_flush_watch_follows_a_bounded_number_of_steps_and_only_with_auto(tmp_path):
    framework, _, ours, context, x, _ = planned_two_layers(tmp_path)
    for _ in range(WATCHED_STEPS):
        run_step(ours, x)
    framework.flush_at = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", UcudnnWarning)
        for _ in range(2):
            run_step(ours, x)  # past the watch: a flush reads nothing
    assert framework.flushed and not context.summary()["shrinks"]
    assert context.summary()["flush_watch"]["steps"] == WATCHED_STEPS
    fixed, _, ours, context, x, _ = planned_two_layers(tmp_path / "fixed", workspace_limit="64MiB")
    fixed.flush_at = 0
    run_step(ours, x)
    run_step(ours, x)
    assert fixed.flushed and not context.summary()["shrinks"]  # a fixed limit keeps the paper's plan
    assert "flush_watch" not in context.summary()


def test_transposed_weights_that_cannot_be_had_give_way_to_the_data_gradients_own_kernel(monkeypatch):
    def no_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")

    w = torch.randn(8, 4, 3, 3)
    monkeypatch.setattr(torch, "empty", no_memory)
    with pytest.raises(DeviceMemoryError, match="transposed weights"):
        TorchFramework.transposed_weights(w, 1, "nchw")


def test_a_handle_that_cannot_be_created_is_tried_again_after_torch_empties_its_cache(monkeypatch):
    """cudnnCreate takes memory outside torch's pool: under pressure, torch's cached blocks go
    back to the device first."""
    from ucudnn import handle as handles
    from ucudnn.core.errors import CudnnError
    from ucudnn.plan.config import Settings

    made, emptied = [], []

    def handle(settings, **kwargs):
        made.append(settings)
        if len(made) == 1:
            raise CudnnError("cudnnCreate", 4000, "CUDNN_STATUS_INTERNAL_ERROR")
        return "handle"

    monkeypatch.setattr(handles, "Handle", handle)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    monkeypatch.setattr(TorchFramework, "stream", lambda self, device: 0)
    assert TorchFramework().make_handle(Settings.load(env={}), None, torch.device("cpu")) == "handle"
    assert len(made) == 2 and emptied == [True]


def test_torch_gets_its_cached_blocks_back_as_the_outermost_planning_scope_ends(monkeypatch):
    """Nested planning scopes (a slice around its kernels) give torch's cache back to the device
    once, as the outermost ends: not after every kernel, whose blocker would be remapped each time."""
    from ucudnn.execute import gpu

    emptied = []
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(using_allocator=lambda allocate: contextlib.nullcontext()))
    monkeypatch.setattr(gpu, "cupy", lambda: fake)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    pool, device = TorchPool(), torch.device("cpu")
    with pool.planning_scope(device):
        for _ in range(3):
            with pool.planning_scope(device):
                pass
        assert emptied == []
    assert emptied == [True]


def test_a_flushed_kernel_is_weighed_as_the_next_step_starts_not_in_the_middle_of_its_step(tmp_path):
    """In the middle of a step the kernel's moment leaves little free to measure the sizes a
    smaller plan needs; as the next step starts the step's activations are gone."""
    framework, model, ours, context, x, borrowing = planned_two_layers(tmp_path)
    framework.flush_at = 0
    run_step(ours, x)  # not watched: the step before it did not flush
    with warnings.catch_warnings():
        warnings.simplefilter("error", UcudnnWarning)
        run_step(ours, x)  # watched: its kernels flush, and are weighed only once it is over
    assert not context.summary()["shrinks"]
    framework.flush_at = float("inf")
    with pytest.warns(UcudnnWarning, match="flushing the framework's cache"):
        assert_matches(run_step(ours, x), run_step(model, x))
    assert context.summary()["shrinks"]


def test_kernels_that_flushed_are_weighed_a_planning_slice_a_step(tmp_path, monkeypatch):
    """Weighing measures: like planning between iterations, it takes about PLANNING_SLICE_S as a
    step starts (at least one kernel), and the rest wait for the next step."""
    from ucudnn.plan import flushes

    framework, model, ours, context, x, borrowing = planned_two_layers(tmp_path)
    framework.flush_at = 0
    run_step(ours, x)  # not watched
    run_step(ours, x)  # watched: every borrowing kernel flushes
    framework.flush_at = float("inf")
    monkeypatch.setattr(flushes, "PLANNING_SLICE_S", 0.0)
    shrunk = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UcudnnWarning)
        for _ in range(2 * len(borrowing)):  # a site adopting a kernel another site shrank also takes a turn
            assert_matches(run_step(ours, x), run_step(model, x))
            shrunk.append(len(context.summary()["shrinks"]))
    assert shrunk[0] == 1 and all(b - a <= 1 for a, b in zip(shrunk, shrunk[1:])), shrunk
    assert shrunk[-1] == len(borrowing) and not context.planner.flushes.flushed


def test_the_flush_watch_opens_after_a_flushing_step_and_closes_for_good_after_its_steps():
    """A watch left open past its last step would read the allocator's count at every run."""
    from ucudnn.plan.memory import FlushWatch

    watch, counts, reads = FlushWatch(), iter(range(100)), []

    def read():  # a flush in every step
        reads.append(None)
        return next(counts)
    opened = []
    for _ in range(WATCHED_STEPS + 3):
        watch.step(read)
        opened.append(watch.open)
    assert opened == [True] * WATCHED_STEPS + [False] * 3 and watch.spent and len(reads) == WATCHED_STEPS
    quiet = FlushWatch()
    for _ in range(3):
        quiet.step(lambda: 7)  # no flush since the first step
    assert not quiet.open and quiet.watched == 1 and not quiet.spent


def test_the_watch_and_the_weighing_settle_a_step_that_flushed_into_one_that_does_not(tmp_path):
    """End to end, as a training loop meets it: borrows above a threshold flush every time they
    are made; the watched steps find the kernels, the next steps' starts shrink them, and the
    loop settles with no flush a step, its results torch's, the watch closed."""
    framework, model, ours, context, x, borrowing = planned_two_layers(tmp_path)
    framework.flush_at = min(k["workspace"] for k in borrowing) // 3  # every planned workspace flushes
    flushes = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UcudnnWarning)
        for _ in range(WATCHED_STEPS + 2):
            before = framework.flushed
            assert_matches(run_step(ours, x), run_step(model, x))
            flushes.append(framework.flushed - before)
    assert flushes[0] > 0 and flushes[-4:] == [0] * 4, flushes
    assert all(k["workspace"] <= framework.flush_at for k in context.summary()["kernels"] if k["via"] == "ucudnn")
    assert context.planner.flushes.watch.spent and not context.planner.flushes.watch.open
