"""Where device memory runs out inside a converted call (CPU, through the doubles): torch's own
kernel while a layer waits for its plan, ucudnn's kernel without a workspace, a sweep without
bytes, CUDA graphs beyond their budget; and the memory counters the timeline reads."""
from __future__ import annotations

import copy
import types

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

import ucudnn.torch as ut  # noqa: E402
from ucudnn.core import fallback  # noqa: E402
from ucudnn.core.errors import DeviceMemoryError, UcudnnWarning  # noqa: E402
from ucudnn.integrations.torch import TorchPool, kernels  # noqa: E402
from ucudnn.measure.cache import Cache  # noqa: E402
from ucudnn.plan.memory import MARGIN_BYTES, graph_budget  # noqa: E402

from torch_doubles import NumpyFramework  # noqa: E402

MiB = 2**20
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(fallback, "_warned", set())


def run_step(module, x):
    xi = x.clone().requires_grad_()
    y = module(xi)
    y.backward(torch.ones_like(y))
    grads = [xi.grad] + [p.grad for p in module.parameters()]
    for p in module.parameters():
        p.grad = None
    return [y.detach()] + grads


def assert_matches(got, want):
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * max(1.0, b.abs().max().item()))


def torch_runs_out(monkeypatch, kinds, error=None):
    """torch's own kernels of `kinds` raise torch's out-of-memory error (or `error`) on every call,
    and so does torch's layer's forward where `kinds` holds F; returns the list of kinds that raised."""
    raised = []
    made = kernels.torch_convolution

    def refuse(kind):
        raised.append(kind)
        raise error or torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    def convolution(problem):
        convolve = made(problem)
        return convolve if problem.kind.value not in kinds else lambda x, w, y: refuse(problem.kind.value)
    monkeypatch.setattr(kernels, "torch_convolution", convolution)
    if "F" in kinds:
        monkeypatch.setattr(nn.Conv2d, "_conv_forward", lambda self, input, weight, bias: refuse("F"))
    return raised


def waiting_model(tmp_path, **settings):
    """A converted model whose layers wait for their plan (planning between iterations) on the
    NumPy doubles, beside torch's own copy."""
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3))
    framework = NumpyFramework()
    context = ut.Context(framework=framework, cache=Cache(tmp_path / "bench.db"), workspace_limit="64KiB",
                         planning="between_iterations", **settings)
    return plain, ut.convert(copy.deepcopy(plain), context=context), context, framework


@pytest.mark.parametrize("kinds", [("F",), ("F", "BD", "BF")], ids=["forward", "and backward"])
def test_torch_s_call_out_of_memory_while_a_layer_waits_runs_ucudnn_s_within_what_is_free(tmp_path, monkeypatch, kinds):
    plain, ours, context, framework = waiting_model(tmp_path)
    x = torch.randn(4, 3, 8, 8)
    want = run_step(plain, x)
    raised = torch_runs_out(monkeypatch, kinds)
    with pytest.warns(UcudnnWarning, match="heuristic favourite"):
        got = run_step(ours, x)
    assert_matches(got, want)
    assert set(raised) == set(kinds) and context.summary()["pending"] == 2  # still waiting: nothing planned
    assert framework.releases == 1 and framework.bounds == [0] and context.planner.pressed
    raised.clear()
    assert_matches(run_step(ours, x), want)  # planned now; nothing of torch's own runs out again
    assert not raised


def test_a_rescued_kernel_serves_the_layer_s_later_calls_without_asking_torch_again(tmp_path, monkeypatch):
    plain, ours, context, framework = waiting_model(tmp_path, delegate=False)
    monkeypatch.setattr(context.planner, "plan_pending", lambda budget_s=None: len(context.planner.pending))  # never planned
    x = torch.randn(4, 3, 8, 8)
    want = run_step(plain, x)
    raised = torch_runs_out(monkeypatch, ("F",))
    for _ in range(3):
        assert_matches(run_step(ours, x), want)
    # the first layer's torch forward, then its stand-in twice (again once ucudnn's graphs and cached
    # blocks went back); the second's stand-in once (the device ran out: straight through the
    # Planner); from then on the stand-ins are ucudnn's
    assert raised == ["F"] * 4
    assert framework.releases == 1


def test_cudnn_s_status_for_memory_is_rescued_and_other_errors_are_not(tmp_path, monkeypatch):
    plain, ours, _, _ = waiting_model(tmp_path)
    x = torch.randn(4, 3, 8, 8)
    want = run_step(plain, x)
    torch_runs_out(monkeypatch, ("F",), RuntimeError("cuDNN error: CUDNN_STATUS_INTERNAL_ERROR"))
    with pytest.warns(UcudnnWarning):
        assert_matches(run_step(ours, x), want)
    plain, ours, _, _ = waiting_model(tmp_path / "other")
    torch_runs_out(monkeypatch, ("F",), RuntimeError("Expected all tensors to be on the same device"))
    with pytest.raises(RuntimeError, match="same device"):
        run_step(ours, x)


def test_where_the_zero_workspace_kernel_itself_cannot_run_the_user_gets_torch_s_out_of_memory(tmp_path, monkeypatch):
    framework = NumpyFramework()
    context = ut.Context(framework=framework, cache=Cache(tmp_path / "bench.db"), workspace_limit="0",
                         planning="first_call", delegate=False)
    conv = ut.convert(nn.Conv2d(3, 4, 3), context=context)

    def no_result(problem, like):
        raise DeviceMemoryError(f"the result of {problem.describe()}", problem.written_bytes())
    monkeypatch.setattr(framework, "result_for", no_result)
    with pytest.warns(UcudnnWarning, match="gave back"), pytest.raises(torch.cuda.OutOfMemoryError, match="result of"):
        with torch.no_grad():
            conv(torch.randn(2, 3, 6, 6))
    assert framework.releases == 1  # what ucudnn held beside the pool went back before giving up


def test_a_sweep_that_cannot_get_its_bytes_leaves_the_layer_to_torch_and_the_step_goes_on(tmp_path, monkeypatch):
    from handle_doubles import NumpyHandle

    def no_bytes(self, problem):
        raise DeviceMemoryError("benchmark operands", 2**30, "free GPU memory")
    monkeypatch.setattr(NumpyHandle, "assignment", no_bytes)
    torch.manual_seed(0)
    plain = nn.Conv2d(3, 4, 3)
    context = ut.Context(framework=NumpyFramework(), cache=Cache(tmp_path / "bench.db"), workspace_limit="64KiB",
                         planning="first_call", delegate=False)
    ours = ut.convert(copy.deepcopy(plain), context=context)
    x = torch.randn(4, 3, 8, 8)
    with pytest.warns(UcudnnWarning, match="falls back to torch's own convolution"):
        assert_matches(run_step(ours, x), run_step(plain, x))
    assert {k["via"] for k in context.summary()["kernels"]} == {"torch"}


def test_graphs_hold_at_most_their_budget_and_are_given_back_under_pressure():
    from ucudnn.execute.graphs import GRAPH_MEMORY, GraphedProgram

    class Capturer:
        def capture(self, run):
            return types.SimpleNamespace(nbytes=3 * MiB)

        def launch(self, graph):
            pass

        def capturing(self):
            return False

    program = GraphedProgram(lambda *a: None, Capturer())
    before = GRAPH_MEMORY.budget
    try:
        GRAPH_MEMORY.budget = GRAPH_MEMORY.held + 5 * MiB
        for address in range(4):  # each seen twice: a capture on the second sight, while the budget admits it
            program(address, 0, 0)
            program(address, 0, 0)
        assert len(program.graphs) == 2 and program.graph_bytes == 6 * MiB and program.direct_runs == 6
        assert GRAPH_MEMORY.release() >= 6 * MiB and not program.graphs and program.graph_bytes == 0
    finally:
        GRAPH_MEMORY.budget = before


def test_the_graph_budget_is_a_share_of_the_least_room_and_nothing_without_one():
    assert graph_budget([]) == 0
    assert graph_budget([512 * MiB, 80 * MiB + MARGIN_BYTES]) == 20 * MiB
    assert graph_budget([MARGIN_BYTES // 2]) == 0


def test_under_auto_graphs_hold_nothing_while_layers_wait_and_their_budget_once_planned(tmp_path):
    torch.manual_seed(0)
    framework = NumpyFramework()
    framework.memory_now = framework.memory_now._replace(free=300 * MiB)
    context = ut.Context(framework=framework, cache=Cache(tmp_path / "bench.db"), planning="between_iterations")
    assert context.settings.auto
    model = ut.convert(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Conv2d(4, 4, 3)), context=context)
    x = torch.randn(2, 3, 8, 8)
    for _ in range(5):
        run_step(model, x)
    assert context.summary()["pending"] == 0
    least = min(room for _, _, rooms in context.planner.delegation.decided for room in rooms)
    assert framework.bounds == [0, graph_budget([least])] and 0 < framework.bounds[-1] < 300 * MiB // 4


def fake_cuda(monkeypatch, *, free, total, reserved, allocated, inactive):
    """torch.cuda's memory counters as a device in a known state would give them."""
    stats = {"reserved_bytes.all.current": reserved, "allocated_bytes.all.current": allocated,
             "inactive_split_bytes.all.current": inactive}
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: stats)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, total))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: reserved)


def test_free_bytes_is_the_device_s_free_memory_and_torch_s_cached_blocks_less_inactive_splits(monkeypatch):
    fake_cuda(monkeypatch, free=100 * MiB, total=80_000 * MiB, reserved=900 * MiB, allocated=700 * MiB,
              inactive=30 * MiB)
    assert TorchPool().free_bytes(torch.device("cuda", 0)) == (100 + 200 - 30) * MiB


def test_outside_bytes_is_what_the_process_holds_beyond_torch_s_pool(monkeypatch):
    fake_cuda(monkeypatch, free=100 * MiB, total=80_000 * MiB, reserved=900 * MiB, allocated=700 * MiB, inactive=0)
    assert TorchPool.outside_bytes(torch.device("cuda", 0)) == (80_000 - 100 - 900) * MiB
