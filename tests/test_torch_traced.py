"""CPU: converted layers in traced graphs (ucudnn/integrations/torch/traced.py, ops.py).
torch.compile(fullgraph=True) and torch.export see a layer ucudnn runs as one node, ucudnn's custom
op, whose real kernel runs through the layer's Context (here the NumPy doubles of
tests/torch_doubles.py), and a layer left to torch as torch's own convolution; the ops' fake
kernels give what the eager call gives."""
from __future__ import annotations

import copy
import warnings

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
from torch import nn  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import ucudnn.torch as ut  # noqa: E402
from ucudnn.core.errors import ConfigError, UcudnnWarning  # noqa: E402
from ucudnn.integrations.torch import ops  # noqa: E402
from ucudnn.integrations.torch.call import pack  # noqa: E402
from ucudnn.measure.cache import Cache  # noqa: E402
from ucudnn.plan.framework import OwnTiming  # noqa: E402

from torch_doubles import NumpyFramework  # noqa: E402

UCUDNN_OP = torch.ops.ucudnn.convolution.default
SLOW, INSTANT = OwnTiming(float("inf"), 0), OwnTiming(0.0, 0)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def torch_without_mkldnn():
    """torch's CPU reference through its native kernels, as the NumPy doubles compute."""
    with torch.backends.mkldnn.flags(enabled=False):
        yield


def context(tmp_path, torch_timing=lambda problem: SLOW, framework=None, **settings) -> ut.Context:
    """A context on the NumPy doubles (or `framework`): torch's kernels 'take' torch_timing(problem);
    by default forever, so that ucudnn runs every layer."""
    tmp_path.mkdir(exist_ok=True)
    settings.setdefault("workspace_limit", "64KiB")
    settings.setdefault("planning", "first_call")
    return ut.Context(framework=framework or NumpyFramework(torch_timing), cache=Cache(tmp_path / "bench.db"),
                      **settings)


def two_layers() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 2, 3, padding=1))


def second_layer_instant(problem) -> OwnTiming:
    """torch's kernels of the second layer (4 input channels) are instant: that layer is left to torch."""
    return INSTANT if problem.x_shape[1] == 4 and problem.w_shape[0] == 2 else SLOW


def step(model, x):
    xi = x.clone().requires_grad_()
    y = model(xi)
    y.square().sum().backward()
    grads = [xi.grad] + [p.grad for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return [y.detach()] + grads


def assert_matches(got, want):
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * max(1.0, b.abs().max().item()))


def recorded(graphs: list):
    """A torch.compile backend that keeps dynamo's graph and runs it through aot_autograd (the
    ops' fake kernels and autograd formula traced) in eager kernels."""
    from torch._dynamo.backends.registry import lookup_backend

    def backend(gm, inputs):
        graphs.append(gm)
        return lookup_backend("aot_eager")(gm, inputs)
    return backend


def targets(graph) -> list:
    return [node.target for node in graph.nodes if node.op in ("call_function", "call_method", "call_module")]


def test_compile_fullgraph_holds_ucudnns_op_and_torchs_convolution_for_a_delegated_layer(tmp_path,
                                                                                          torch_without_mkldnn):
    plain = two_layers()
    ours = ut.convert(copy.deepcopy(plain), context=context(tmp_path, second_layer_instant))
    graphs = []
    compiled = torch.compile(ours, fullgraph=True, backend=recorded(graphs))
    x = torch.randn(4, 3, 8, 8)
    for _ in range(2):
        assert_matches(step(compiled, x), step(plain, x))
    assert len(graphs) == 1  # one graph, no break, no recompile
    called = targets(graphs[0].graph)
    assert called.count(torch.ops.ucudnn.convolution) == 1
    assert called.count(torch.conv2d) == 1  # torch's own layer (torch.nn.functional.conv2d)
    runs = ut.context_of(ours).runs
    assert dict(runs) == {("ucudnn", "F"): 2, ("ucudnn", "BD"): 2, ("ucudnn", "BF"): 2}  # the graph's op's kernels


def test_delegated_layers_compile_as_torchs_own_model(tmp_path):
    plain = two_layers()
    ours = ut.convert(copy.deepcopy(plain), context=context(tmp_path, lambda problem: INSTANT))
    x = torch.randn(4, 3, 8, 8)
    graphs = {}
    for name, model in (("torch", plain), ("ucudnn", ours)):
        graphs[name] = []
        step(torch.compile(model, fullgraph=True, backend=recorded(graphs[name])), x)
    assert targets(graphs["ucudnn"][0].graph) == targets(graphs["torch"][0].graph)


def test_a_layer_not_decided_yet_is_planned_when_traced(tmp_path, torch_without_mkldnn):
    """planning='between_iterations' (the default) runs torch's convolution until a layer is
    planned between iterations; a graph has none: the layer is planned as it is traced."""
    plain = two_layers()
    ctx = context(tmp_path, planning=None)
    assert ctx.settings.planning == "between_iterations"
    ours = ut.convert(copy.deepcopy(plain), context=ctx)
    x = torch.randn(4, 3, 8, 8)
    assert_matches(step(torch.compile(ours, fullgraph=True, backend="aot_eager"), x), step(plain, x))
    assert ctx.summary()["pending"] == 0 and ctx.runs["ucudnn", "F"] == 2


def test_layers_decided_in_eager_calls_keep_their_decision_in_the_graph(tmp_path):
    ctx = context(tmp_path, second_layer_instant)
    ours = ut.convert(two_layers(), context=ctx)
    x = torch.randn(4, 3, 8, 8)
    step(ours, x)  # decided eagerly: the first layer through ucudnn, the second left to torch
    timed = len(ctx.framework.timed)
    graphs = []
    step(torch.compile(ours, fullgraph=True, backend=recorded(graphs)), x)
    assert len(ctx.framework.timed) == timed  # nothing planned again
    assert targets(graphs[0].graph).count(torch.ops.ucudnn.convolution) == 1


def test_export_holds_ucudnns_op_and_the_program_runs_it(tmp_path, torch_without_mkldnn):
    plain = two_layers()
    ours = ut.convert(copy.deepcopy(plain), context=context(tmp_path, second_layer_instant))
    x = torch.randn(4, 3, 8, 8)
    program = torch.export.export(ours, (x,))
    called = targets(program.graph)
    assert called.count(UCUDNN_OP) == 1 and called.count(torch.ops.aten.conv2d.default) == 1
    with torch.no_grad():
        torch.testing.assert_close(program.module()(x), plain(x), rtol=1e-4, atol=1e-5)


def test_strict_export_holds_ucudnns_op(tmp_path):
    ours = ut.convert(two_layers(), context=context(tmp_path))
    program = torch.export.export(ours, (torch.randn(4, 3, 8, 8),), strict=True)
    assert targets(program.graph).count(UCUDNN_OP) == 2


def test_a_graph_names_sites_of_its_own_process():
    with pytest.raises(ConfigError, match="was not traced in this process"):
        ops.traced(10**9)


def test_planning_while_traced_meets_real_tensors_and_adds_nothing_to_the_graph(tmp_path):
    """Timing torch's kernels (here a double that makes a tensor) runs outside the tracing modes."""
    seen = []

    class Timing(NumpyFramework):
        def time_own(self, problem, device, free=None):
            seen.append(type(torch.zeros(2) + 1))
            return super().time_own(problem, device, free)

    x = torch.randn(4, 3, 8, 8)
    for trace in ("export", "compile"):
        ctx = context(tmp_path / trace, framework=Timing(lambda problem: SLOW))  # a database each: torch's timings kept there
        ours = ut.convert(two_layers(), context=ctx)
        if trace == "export":
            called = targets(torch.export.export(ours, (x,)).graph)
            assert torch.ops.aten.zeros.default not in called and torch.ops.aten.add.Tensor not in called
        else:
            step(torch.compile(ours, fullgraph=True, backend="aot_eager"), x)
    assert len(seen) == 5 + 6 and set(seen) == {torch.Tensor}  # F, BD (not the first layer's in export), BF


def test_compile_fullgraph_recompiles_per_batch_size_and_graph_breaks_on_dynamic_sizes(tmp_path,
                                                                                      torch_without_mkldnn):
    """A graph holds one site per layer: fullgraph=True needs static sizes (dynamic=False), one
    graph per batch size; with dynamic sizes each converted layer runs between graphs."""
    plain = two_layers()
    for dynamic in (False, True):
        torch._dynamo.reset()
        ours = ut.convert(copy.deepcopy(plain), context=context(tmp_path))
        compiled = torch.compile(ours, fullgraph=not dynamic, dynamic=dynamic, backend="aot_eager")
        for batch in (4, 5, 4):
            x = torch.randn(batch, 3, 8, 8)
            assert_matches(step(compiled, x), step(plain, x))
        assert ut.context_of(ours).runs["ucudnn", "F"] == 2 * 3


@pytest.mark.slow
def test_compile_with_inductor_trains_as_eager(tmp_path, torch_without_mkldnn):
    plain = two_layers()
    ours = ut.convert(copy.deepcopy(plain), context=context(tmp_path, second_layer_instant))
    x = torch.randn(4, 3, 8, 8)
    assert_matches(step(torch.compile(ours, fullgraph=True, backend="inductor"), x), step(plain, x))


LAYERS = [  # (torch's layer, an input); 1-D, 2-D, 3-D and transposed
    (lambda: nn.Conv1d(4, 6, 3, stride=2, padding=1, groups=2), (3, 4, 11)),
    (lambda: nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect"), (3, 3, 7, 6)),
    (lambda: nn.Conv3d(2, 4, 3, padding=1, bias=False), (2, 2, 4, 5, 3)),
    (lambda: nn.ConvTranspose1d(4, 3, 5, stride=3, padding=2, output_padding=2), (2, 4, 9)),
    (lambda: nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2), (3, 4, 6, 5)),
    (lambda: nn.ConvTranspose3d(4, 2, 2, stride=2), (2, 4, 3, 4, 2)),
]


@pytest.mark.parametrize("case", range(len(LAYERS)), ids=lambda i: type(LAYERS[i][0]()).__name__ + f"-{i}")
@pytest.mark.parametrize("form", ["packed", "channels_last", "unbatched", "autocast"])
def test_traced_outputs_have_the_eager_outputs_shape_strides_and_dtype(case, form, tmp_path):
    """The exported program's output (the ops' fake kernels) against the eager call's, and each
    op's fake outputs against its real ones."""
    make, shape = LAYERS[case]
    if form == "channels_last" and len(shape) == 3:
        pytest.skip("1-D tensors have no channels-last format")
    torch.manual_seed(case)
    ours = ut.convert(make(), context=context(tmp_path))
    x = torch.randn(shape)
    if form == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)
    elif form == "unbatched":
        x = x[0]
    autocast = torch.autocast("cpu", dtype=torch.float16, enabled=form == "autocast")
    handles = len(ops._traced)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UcudnnWarning)  # no fallback: ucudnn runs the layer
        with autocast:
            eager = ours(x.clone().requires_grad_())
            program = torch.export.export(ours, (x,))
    traced = output_meta(program)
    assert (traced.shape, traced.dtype) == (eager.shape, eager.dtype)
    if traced.stride() != eager.stride():
        # allowed only where torch's own layer traces so too (torch 2.11: its fake reflection pad
        # drops channels_last)
        with autocast:
            theirs = make()
            their_strides = theirs(x).stride(), output_meta(torch.export.export(theirs, (x,))).stride()
        assert their_strides[0] != their_strides[1], (traced.stride(), eager.stride())
    assert targets(program.graph).count(UCUDNN_OP) == 1 and len(ops._traced) == handles + 1
    assert_fake_equals_real(ours, x, len(ops._traced) - 1)


def output_meta(program):
    """The (fake) output tensor an exported program's graph records."""
    return next(node for node in program.graph.nodes if node.op == "output").args[0][0].meta["val"]


def assert_fake_equals_real(layer, x, handle):
    """Each op on real operands and on fake ones of the same metadata: the same shapes, strides, dtypes."""
    site = ops.traced(handle)[1]
    operands = pack(layer, x, site.dtype, site.memory_format)
    out = torch.ops.ucudnn.convolution(*operands, handle)
    d_out = torch.randn_like(out)
    real = [out, *torch.ops.ucudnn.convolution_backward(d_out, operands[0], operands[1], handle, True, True),
            *torch.ops.ucudnn.convolution_backward(d_out, operands[0], operands[1], handle, False, True)]
    with FakeTensorMode() as mode:
        fake_operands = [None if t is None else mode.from_tensor(t) for t in operands]
        fake_d_out = mode.from_tensor(d_out)
        fake = [torch.ops.ucudnn.convolution(*fake_operands, handle),
                *torch.ops.ucudnn.convolution_backward(fake_d_out, *fake_operands[:2], handle, True, True),
                *torch.ops.ucudnn.convolution_backward(fake_d_out, *fake_operands[:2], handle, False, True)]
    for r, f in zip(real, fake):
        assert (f.shape, f.stride(), f.dtype, f.device) == (r.shape, r.stride(), r.dtype, r.device)
    assert real[3].numel() == 0  # the input's gradient, not asked for


def test_a_graph_is_traced_again_where_what_its_layers_were_decided_on_changes(tmp_path):
    """dynamo guards the graph on what a layer's decision read of torch's state: autocast, grad
    mode and cuDNN's TF32 flag each give a site, and a graph, of their own."""
    ctx = context(tmp_path)
    compiled = torch.compile(ut.convert(two_layers(), context=ctx), fullgraph=True, backend="aot_eager")
    x = torch.randn(2, 3, 8, 8)
    assert compiled(x).dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.float16):
        assert compiled(x).dtype == torch.float16
    with torch.no_grad():
        assert not compiled(x).requires_grad
    with torch.backends.cudnn.flags(allow_tf32=not torch.backends.cudnn.allow_tf32):
        compiled(x)
    first = [site for site in ctx.sites._sites.values() if site.call.w_shape == (4, 3, 3, 3)]
    assert sorted((s.call.dtype, s.call.math, len(s.kinds)) for s in first) == [
        ("float16", "tensor_op", 2), ("float32", "default", 1), ("float32", "default", 2), ("float32", "fma", 2)]


@pytest.mark.slow
def test_importing_ucudnn_torch_leaves_dynamo_unloaded_and_the_first_traced_call_loads_it():
    """An eager training process never loads torch._dynamo for ucudnn (about a second, and 127,000
    objects every full garbage collection then walks): the traced path is imported by the first
    traced call, inside dynamo's own tracing, with the graph whole."""
    import subprocess
    import sys

    code = """
import sys, warnings, torch
import ucudnn.torch as ut
assert "torch._dynamo" not in sys.modules, "loaded by import ucudnn.torch"
torch.manual_seed(0)
plain = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())
ours = ut.convert(__import__("copy").deepcopy(plain))
x = torch.randn(2, 3, 8, 8)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    got = torch.compile(ours, fullgraph=True, backend="aot_eager")(x)
torch.testing.assert_close(got, plain(x))
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "UCUDNN_PROGRESS": "0"})
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
