"""CPU: the PyTorch integration. Conversion (nested modules, identity, hooks, state_dict, pickling),
torch's fallback (exact results, one warning per reason), and the whole ucudnn path of a layer
(prepare, autograd Function, plans, micro-batched dispatch, WD recording) run on the CPU through
a NumPy framework: Assignments with a fake benchmarker and the float64 NumPy executor in place of cuDNN."""
from __future__ import annotations

import contextlib
import copy
import inspect
import io
import pickle
import warnings

import pytest

torch = pytest.importorskip("torch")
# The NumPy executor reads the prior output (torch.empty: any bit pattern) even when beta is 0.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
from torch import nn  # noqa: E402

import ucudnn.torch as ut  # noqa: E402
from ucudnn.core.errors import ConfigError, NoAlgorithmError, UcudnnWarning  # noqa: E402
from ucudnn.core.problem import ConvKind  # noqa: E402
from ucudnn.integrations import torch as integration  # noqa: E402
from ucudnn.integrations.torch import call as calls, layers as ut_layers  # noqa: E402
from ucudnn.integrations.torch.sites import Sites  # noqa: E402
from ucudnn.measure.cache import Cache  # noqa: E402
from ucudnn.plan.framework import OwnTiming  # noqa: E402
from ucudnn.plan.memory import Memory  # noqa: E402

from torch_doubles import NumpyFramework  # noqa: E402


@pytest.fixture
def numpy_context(tmp_path):
    def make(database: str = "bench.db", framework=None, **settings):
        settings.setdefault("workspace_limit", "64KiB")  # small: the fake fast algorithms split the batch
        # a layer planned on its first call: what these tests check of a plan then holds from the
        # first step (the default plans between iterations: its own tests pass planning=None)
        settings.setdefault("planning", "first_call")
        return ut.Context(framework=framework or NumpyFramework(), cache=Cache(tmp_path / database), **settings)
    return make


class Net(nn.Module):
    """Convolutions at several depths, beside modules convert() must leave alone."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.blocks = nn.ModuleList([
            nn.Sequential(nn.Conv2d(8, 8, 3, padding="same", groups=2), nn.ReLU()),
            nn.Sequential(nn.Sequential(nn.Conv2d(8, 6, 1, bias=False)), nn.BatchNorm2d(6)),
        ])
        self.named = nn.ModuleDict({"down": nn.Conv2d(6, 4, 3, stride=2, dilation=2, padding_mode="reflect",
                                                      padding=2)})
        self.other = nn.Conv1d(2, 2, 1)
        self.up = nn.ConvTranspose2d(4, 4, 2)

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.up(self.named["down"](x))


def plain_convs(model):
    return [m for m in model.modules() if type(m) is nn.Conv2d]


def converted_convs(model):
    return [m for m in model.modules() if isinstance(m, ut.Conv2d)]


# --- conversion ------------------------------------------------------------------------------------

def test_convert_replaces_every_conv2d_in_place_nested_ones_too():
    torch.manual_seed(0)
    model = Net()
    before = {name: id(m) for name, m in model.named_modules()}
    params = {name: p for name, p in model.named_parameters()}
    convs = plain_convs(model)
    assert len(convs) == 4
    assert ut.convert(model, workspace_limit="8MiB") is model
    assert not plain_convs(model)
    assert converted_convs(model) == convs  # the same objects, now of ucudnn's class
    assert {name: id(m) for name, m in model.named_modules()} == before
    assert all(p is params[name] for name, p in model.named_parameters())  # optimizers keep working
    assert type(model.other) is ut_layers.Conv1d and type(model.up) is ut_layers.ConvTranspose2d
    contexts = {id(m.ucudnn_context) for m in convs}
    assert len(contexts) == 1 and convs[0].ucudnn_context.settings.workspace_limit == 8 * 2**20


def test_context_of_names_the_one_context_of_a_converted_model():
    from ucudnn.core.errors import ConfigError

    model = Net()
    with pytest.raises(ConfigError, match="Net has converted layers of 0 ucudnn contexts"):
        ut.context_of(model)
    ut.convert(model, workspace_limit="8MiB")
    assert ut.context_of(model) is converted_convs(model)[0].ucudnn_context
    converted_convs(model)[1].ucudnn_context = ut.Context(workspace_limit="1MiB")
    with pytest.raises(ConfigError, match="of 2 ucudnn contexts; context_of needs exactly one"):
        ut.context_of(model)


def test_convert_takes_a_bare_conv_and_keeps_hooks():
    conv = nn.Conv2d(2, 3, 3)
    seen = []
    conv.register_forward_hook(lambda module, inputs, output: seen.append(output.shape))
    assert ut.convert(conv) is conv and isinstance(conv, ut.Conv2d)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UcudnnWarning)
        conv(torch.randn(1, 2, 5, 5))
    assert seen == [torch.Size([1, 3, 3, 3])]


def test_convert_leaves_subclasses_alone_and_says_so():
    class Standardized(nn.Conv2d):  # changes forward: ucudnn would not run what it computes
        def _conv_forward(self, input, weight, bias):
            return super()._conv_forward(input, weight - weight.mean(), bias)

    model = nn.Sequential(Standardized(2, 2, 1), nn.Conv2d(2, 2, 1))
    with pytest.warns(UcudnnWarning, match="Standardized"):
        ut.convert(model)
    assert type(model[0]) is Standardized and isinstance(model[1], ut.Conv2d)


def test_convert_settings_and_their_errors():
    model = ut.convert(nn.Conv2d(1, 1, 1), optimizer="WD", policy="all", total_limit="1GiB")
    s = model.ucudnn_context.settings
    assert (s.optimizer, s.policy, s.total_limit, s.auto) == ("wd", "all", 2**30, False)
    with pytest.raises(ConfigError, match="workspace_limit is not used beside total_limit"):
        ut.convert(nn.Conv2d(1, 1, 1), workspace_limit="8MiB", total_limit="1GiB")
    with pytest.raises(ConfigError, match="optimizer"):
        ut.convert(nn.Conv2d(1, 1, 1), optimizer="fastest")
    with pytest.raises(ConfigError, match="not both"):
        ut.convert(nn.Conv2d(1, 1, 1), workspace_limit="1MiB", context=ut.Context())


def test_conv2d_has_torch_constructor_and_initialization():
    assert inspect.signature(ut.Conv2d) == inspect.signature(nn.Conv2d)
    torch.manual_seed(3)
    ours = ut.Conv2d(4, 6, (3, 5), stride=2, padding=1, groups=2, padding_mode="circular")
    torch.manual_seed(3)
    theirs = nn.Conv2d(4, 6, (3, 5), stride=2, padding=1, groups=2, padding_mode="circular")
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), theirs.state_dict().values()))
    assert ours.ucudnn_context is None  # the default context, made on first use
    assert "ucudnn=wr@" in repr(ours)


def test_state_dict_round_trip():
    torch.manual_seed(1)
    original = Net()
    converted = ut.convert(copy.deepcopy(original))
    theirs, ours = original.state_dict(), converted.state_dict()
    assert list(theirs) == list(ours)
    assert all(torch.equal(theirs[k], ours[k]) for k in theirs)
    fresh = Net()
    fresh.load_state_dict(ours)  # strict: ucudnn adds no parameter or buffer
    assert all(torch.equal(theirs[k], v) for k, v in fresh.state_dict().items())
    torch.manual_seed(2)
    other = ut.convert(Net())
    other.load_state_dict(theirs)
    assert all(torch.equal(theirs[k], v) for k, v in other.state_dict().items())
    buffer = io.BytesIO()
    torch.save(ours, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    assert all(torch.equal(theirs[k], v) for k, v in loaded.items())


def test_converted_models_pickle_and_deepcopy():
    model = ut.convert(Net(), workspace_limit="2MiB", optimizer="wd")
    twin = copy.deepcopy(model)
    assert twin.stem is not model.stem and twin.stem.ucudnn_context is model.stem.ucudnn_context
    revived = pickle.loads(pickle.dumps(model))
    assert isinstance(revived.stem, ut.Conv2d)
    assert revived.stem.ucudnn_context.settings == model.stem.ucudnn_context.settings
    assert revived.stem.ucudnn_context is revived.named["down"].ucudnn_context


def test_auto_delegate_and_options_round_trip_through_pickle(monkeypatch):
    """`auto` and `delegate` are settings (what the Planner is built with), concurrent_backward a
    torch option: an unpickled model's context has all three as pickled, whatever the variables
    of the process that unpickles it say."""
    monkeypatch.delenv("UCUDNN_WORKSPACE_LIMIT", raising=False)
    monkeypatch.delenv("UCUDNN_TOTAL_LIMIT", raising=False)
    monkeypatch.delenv("UCUDNN_CONCURRENT_BACKWARD", raising=False)
    model = ut.convert(Net(), delegate=False, concurrent_backward=True)  # auto: the default
    context = model.stem.ucudnn_context
    assert (context.settings.auto, context.settings.delegate, context.options.concurrent_backward) == \
        (True, False, True)
    assert (context.planner.auto, context.planner.delegate) == (True, False)  # settings the Planner reads
    pickled = pickle.dumps(model)
    monkeypatch.setenv("UCUDNN_WORKSPACE_LIMIT", "32MiB")  # would make a new context's limit fixed
    monkeypatch.setenv("UCUDNN_CONCURRENT_BACKWARD", "0")
    revived = pickle.loads(pickled).stem.ucudnn_context
    assert revived is not context and revived.settings == context.settings
    assert revived.options == context.options
    assert (revived.settings.auto, revived.settings.delegate, revived.limit_name) == (True, False, "auto")
    fixed = pickle.loads(pickle.dumps(ut.convert(Net(), workspace_limit="2MiB"))).stem.ucudnn_context
    assert (fixed.settings.auto, fixed.planner.auto, fixed.planner.delegate, fixed.options.concurrent_backward) == \
        (False, False, True, False)


@pytest.mark.parametrize("argv, keywords, message", [
    (["--total-workspace", "1GiB", "--optimizer", "wr"], dict(total_limit="1GiB", optimizer="wr"),
     ("--total-workspace 1.0GiB is the WD optimizer's limit, but --optimizer wr plans each kernel alone; "
      "drop one of them, or use --optimizer wd",
      "total_limit='1GiB' is the WD optimizer's limit, but optimizer='wr' plans each kernel alone; "
      "drop one of them, or use optimizer='wd'")),
    (["--total-workspace", "1GiB", "--workspace", "8MiB"], dict(total_limit="1GiB", workspace_limit="8MiB"),
     ("--workspace is not used beside --total-workspace", "workspace_limit is not used beside total_limit")),
])
def test_one_rule_says_a_total_limit_means_wd_to_the_cli_and_to_torch(monkeypatch, argv, keywords, message):
    """`ucudnn optimize`'s flags and a torch Context's keywords reach one rule (plan.config's
    _one_meaning), which names each value as its user gave it; and a total alone means WD in both."""
    from ucudnn.cli import build_parser, commands
    from ucudnn.plan import config

    for variable in ("UCUDNN_TOTAL_LIMIT", "UCUDNN_WORKSPACE_LIMIT", "UCUDNN_OPTIMIZER"):
        monkeypatch.delenv(variable, raising=False)
    calls = []
    rule = config._one_meaning
    monkeypatch.setattr(config, "_one_meaning", lambda *args: calls.append(args) or rule(*args))
    args = build_parser().parse_args(["optimize", "--net", "alexnet", *argv])
    with pytest.raises(ConfigError) as cli:
        commands._settings(args)
    with pytest.raises(ConfigError) as torch_context:
        ut.Context(framework=NumpyFramework(), **keywords)
    assert message[0] in str(cli.value) and message[1] in str(torch_context.value)
    assert len(calls) == 2  # one rule, reached once from each
    cli_settings = commands._settings(build_parser().parse_args(["optimize", "--net", "alexnet", "--total-workspace",
                                                                 "1GiB"]))
    torch_settings = ut.Context(framework=NumpyFramework(), total_limit="1GiB").settings
    assert (cli_settings.optimizer, cli_settings.total_limit) == (torch_settings.optimizer,
                                                                   torch_settings.total_limit) == ("wd", 2**30)


# --- fallback to torch -------------------------------------------------------------------------------

FALLBACK_LAYERS = [
    dict(in_channels=3, out_channels=4, kernel_size=3),
    dict(in_channels=4, out_channels=6, kernel_size=3, stride=2, padding=1, dilation=2, groups=2),
    dict(in_channels=3, out_channels=3, kernel_size=4, padding="same"),
    dict(in_channels=3, out_channels=2, kernel_size=3, padding=2, padding_mode="reflect", bias=False),
    dict(in_channels=2, out_channels=2, kernel_size=(1, 3), padding="valid", padding_mode="circular"),
]


@pytest.mark.parametrize("layer", FALLBACK_LAYERS, ids=lambda layer: ",".join(f"{k}={v}" for k, v in layer.items()))
@pytest.mark.parametrize("channels_last", [False, True])
def test_cpu_fallback_gives_torchs_results(layer, channels_last):
    torch.manual_seed(0)
    theirs = nn.Conv2d(**layer)
    ours = ut.convert(copy.deepcopy(theirs))
    x = torch.randn(5, layer["in_channels"], 9, 8)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    results = []
    for module in (theirs, ours):
        xi = x.clone().requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UcudnnWarning)
            y = module(xi)
        y.backward(torch.ones_like(y))
        results.append([y, xi.grad] + [p.grad for p in module.parameters()])
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_fallback_warns_once_per_reason_and_counts():
    conv = ut.convert(nn.Conv2d(2, 2, 3))
    x = torch.randn(1, 2, 5, 5)
    with pytest.warns(UcudnnWarning, match=r"input on cpu \(ucudnn runs CUDA tensors only\)"):
        conv(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UcudnnWarning)
        conv(x)
        conv(x[0])  # unbatched: same reason, no second warning
    assert conv.ucudnn_context.fallbacks["input on cpu (ucudnn runs CUDA tensors only)"] == 3


def test_invalid_calls_get_torchs_own_errors_without_warning():
    conv = ut.convert(nn.Conv2d(2, 2, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UcudnnWarning)
        with pytest.raises(RuntimeError):
            conv(torch.randn(1, 3, 5, 5))  # wrong channel count
        with pytest.raises(RuntimeError):
            conv(torch.randn(1, 2, 2, 2))  # output would be empty


def test_geometry_and_math():
    g = calls.geometry
    assert g(nn.Conv2d(1, 1, 3, padding="same", dilation=2)).pads == (2, 2)
    assert g(nn.Conv2d(1, 1, 3, padding="valid")).pads == (0, 0)
    assert g(nn.Conv2d(1, 1, 3, padding=(1, 2), padding_mode="replicate")).pads == (0, 0)
    assert g(nn.Conv2d(1, 1, (3, 5), padding=(1, 2), stride=(2, 1))) == calls.Geometry((1, 2), (2, 1), (1, 1), 1)
    assert "asymmetrically" in g(nn.Conv2d(1, 1, 4, padding="same"))
    allow = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = False
        assert calls.math_type("float32") == "fma"
        torch.backends.cudnn.allow_tf32 = True
        assert calls.math_type("float32") == "default"
        for flag in (False, True):  # half types run on tensor cores whatever TF32 says, as in torch
            torch.backends.cudnn.allow_tf32 = flag
            assert calls.math_type("float16") == calls.math_type("bfloat16") == "tensor_op"
    finally:
        torch.backends.cudnn.allow_tf32 = allow


@pytest.mark.parametrize("kind", list(ConvKind), ids=str)
def test_torch_kernel_writes_what_autograd_computes(kind):
    """The per-kernel fallback (for kernels ucudnn cannot plan) against torch's autograd."""
    torch.manual_seed(0)
    x = torch.randn(3, 4, 9, 7, requires_grad=True)
    w = torch.randn(6, 2, 3, 2, requires_grad=True)
    call = calls.Call(x.device, tuple(x.shape), tuple(w.shape), calls.Geometry((1, 0), (2, 1), (1, 2), 2),
                            "float32", "default", "nchw")
    y = torch.nn.functional.conv2d(x, w, None, (2, 1), (1, 0), (1, 2), 2)
    dy = torch.randn_like(y)
    y.backward(dy)
    out = {"x": torch.zeros_like(x), "w": torch.zeros_like(w), "y": torch.zeros_like(y)}
    operands = {"x": x.detach(), "w": w.detach(), "y": dy}
    written = {ConvKind.FORWARD: "y", ConvKind.BACKWARD_DATA: "x", ConvKind.BACKWARD_FILTER: "w"}[kind]
    operands[written] = out[written]
    kernel = integration.kernels.TorchKernel(call.problem(kind))
    assert kernel(operands["x"], operands["w"], operands["y"]) is out[written]
    want = {"y": y.detach(), "x": x.grad, "w": w.grad}[written]
    torch.testing.assert_close(out[written], want)
    operands[written] = None  # no tensor given: torch's own result, with no second one of its size
    torch.testing.assert_close(kernel(operands["x"], operands["w"], operands["y"]), want)


# --- the ucudnn path, with NumPy standing in for cuDNN -----------------------------------------------

UCUDNN_LAYERS = FALLBACK_LAYERS[:2] + FALLBACK_LAYERS[3:] + [
    dict(in_channels=4, out_channels=4, kernel_size=3, padding="same", dilation=2, groups=4)]


def assert_matches(got, want):
    """fp32 results of the same convolution summed in another order: the bound scales with the
    largest magnitude (torch's own float32 dw can be off by 2e-6 of it)."""
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * max(1.0, b.abs().max().item()))


def run_step(module, x, dy=None):
    xi = x.clone().requires_grad_()
    y = module(xi)
    y.backward(torch.ones_like(y) if dy is None else dy)
    grads = [xi.grad] + [p.grad for p in module.parameters()]
    for p in module.parameters():
        p.grad = None
    return [y.detach()] + grads


@pytest.mark.parametrize("layer", UCUDNN_LAYERS, ids=lambda layer: ",".join(f"{k}={v}" for k, v in layer.items()))
@pytest.mark.parametrize("form", ["packed", "channels_last", "unbatched"])
def test_ucudnn_path_matches_torch(layer, form, numpy_context):
    theirs = nn.Conv2d(**layer)
    _, x, got = twins_step(theirs, ut.Conv2d, (8, layer["in_channels"], 9, 8), form, numpy_context(), 0)
    last = torch.channels_last
    assert got[0].is_contiguous(memory_format=last) == theirs(x).is_contiguous(memory_format=last)


@pytest.fixture
def torch_without_mkldnn():
    """torch 2.13's CPU convolutions through oneDNN corrupt the heap on some 1-D, 3-D and
    transposed layers with channels-last weights (glibc aborts a later allocation; torch alone,
    without ucudnn, reproduces it); torch's native CPU kernels, the reference here, do not."""
    with torch.backends.mkldnn.flags(enabled=False):
        yield


ND_LAYERS = [  # (torch's layer, its converted twin, an input): 1-D and 3-D, groups, dilation, padding modes
    (nn.Conv1d(4, 6, 3, stride=2, padding=1, dilation=2, groups=2), ut_layers.Conv1d, (8, 4, 19)),
    (nn.Conv1d(3, 5, 4, padding="same", padding_mode="reflect", bias=False), ut_layers.Conv1d, (8, 3, 12)),
    (nn.Conv3d(4, 6, 3, stride=(1, 2, 1), padding=1, groups=2), ut_layers.Conv3d, (8, 4, 5, 7, 6)),
    (nn.Conv3d(2, 3, (1, 3, 2), padding_mode="circular", padding=(0, 1, 1)), ut_layers.Conv3d, (8, 2, 3, 5, 4)),
]


def twins_step(theirs: nn.Module, twin: type, shape: tuple, form: str, context, seed: int):
    """torch's layer and its ucudnn twin (on `context`), one step each on an input of `shape`
    packed, channels-last or unbatched (`form`): the twin, its results, which equal torch's."""
    if form == "channels_last" and len(shape) == 3:
        pytest.skip("1-D tensors have no channels-last format")
    torch.manual_seed(seed)
    theirs.reset_parameters()
    ours = copy.deepcopy(theirs)
    ours.__class__, ours.ucudnn_context = twin, context
    x = torch.randn(*shape)
    if form == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)
    elif form == "unbatched":
        x = x[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UcudnnWarning)  # no fallback
        got = run_step(ours, x)
    want = run_step(theirs, x)
    assert got[0].shape == want[0].shape
    assert_matches(got, want)
    assert {kind for (via, kind) in context.runs if via == "ucudnn"} == {"F", "BD", "BF"}
    return ours, x, got


@pytest.mark.parametrize("case", range(len(ND_LAYERS)), ids=lambda i: f"{ND_LAYERS[i][1].__name__}-{i}")
@pytest.mark.parametrize("form", ["packed", "channels_last", "unbatched"])
def test_1d_and_3d_layers_match_torch_through_ucudnn(case, form, numpy_context, torch_without_mkldnn):
    """Conv1d (run as 2-D of height 1) and Conv3d through ucudnn's path, micro-batched by the fake
    algorithms: outputs, input and weight gradients equal torch's, a 3-D output channels_last_3d
    where torch's would be on the GPU; a 1-D layer's kernels are 2-D problems."""
    theirs, twin, shape = ND_LAYERS[case]
    ours, _, got = twins_step(theirs, twin, shape, form, numpy_context(), case)
    if twin is ut_layers.Conv3d:  # torch's rule on the GPU (its native CPU kernels return NCDHW):
        # channels_last_3d where the input the convolution sees (after F.pad, which packs) suggests it
        last = form == "channels_last" and theirs.padding_mode == "zeros"
        assert got[0].is_contiguous(memory_format=torch.channels_last_3d) == last
    dims = {len(k["kernel"].split("x=(")[1].split(")")[0].split(",")) for k in ours.ucudnn_context.summary()["kernels"]}
    assert dims == {4 if twin is ut_layers.Conv1d else 5}


TRANSPOSED_LAYERS = [  # stride, output_padding, groups, dilation, bias; 1-D, 2-D, 3-D
    (nn.ConvTranspose2d(6, 4, 4, stride=2, padding=1), ut_layers.ConvTranspose2d, (8, 6, 5, 7)),
    (nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2, dilation=2, bias=False),
     ut_layers.ConvTranspose2d, (8, 4, 6, 5)),
    (nn.ConvTranspose1d(4, 3, 5, stride=3, padding=2, output_padding=2), ut_layers.ConvTranspose1d, (8, 4, 9)),
    (nn.ConvTranspose3d(4, 2, 2, stride=2), ut_layers.ConvTranspose3d, (8, 4, 3, 4, 2)),
]


@pytest.mark.parametrize("case", range(len(TRANSPOSED_LAYERS)), ids=lambda i: f"{TRANSPOSED_LAYERS[i][1].__name__}-{i}")
@pytest.mark.parametrize("form", ["packed", "channels_last", "unbatched"])
def test_transposed_layers_match_torch_through_ucudnn(case, form, numpy_context, torch_without_mkldnn):
    """A transposed layer runs the convolution it transposes backwards: its forward as BD, its
    input's gradient as F, its weight's as BF, micro-batched by the fake algorithms; outputs and
    gradients equal torch's, output_padding, groups and dilation included."""
    theirs, twin, shape = TRANSPOSED_LAYERS[case]
    ours, x, _ = twins_step(theirs, twin, shape, form, numpy_context(), case)
    context = ours.ucudnn_context
    with torch.no_grad():  # inference: the forward alone, which is BD
        before = dict(context.runs)
        ours(x)
    assert {kind for (via, kind), n in context.runs.items() if n > before.get((via, kind), 0)} == {"BD"}


@pytest.mark.parametrize("seed", range(8))
def test_random_1d_3d_and_transposed_layers_match_torch_through_ucudnn(seed, numpy_context, torch_without_mkldnn):
    """The GPU test's random layers of every new kind (tests/test_gpu_torch.py), here in float32
    through the NumPy doubles: the glue (shapes, lifting, transposition, layouts) on many geometries."""
    import numpy as np

    from test_gpu_torch import ND_KINDS, random_nd_layer

    rng = np.random.default_rng(seed)
    for kind, twin in ND_KINDS.items():
        theirs, x, what = random_nd_layer(rng, kind, torch.float32, device="cpu")
        ours = copy.deepcopy(theirs)
        ours.__class__, ours.ucudnn_context = twin, numpy_context()
        with warnings.catch_warnings():
            warnings.simplefilter("error", UcudnnWarning)
            got = run_step(ours, x)
        assert_matches(got, run_step(theirs, x)), what
        assert {k for (via, k) in ours.ucudnn_context.runs if via == "ucudnn"} == {"F", "BD", "BF"}, what


def test_a_transposed_layer_with_output_padding_of_the_stride_runs_torchs_own_with_the_reason(numpy_context, torch_without_mkldnn):
    """torch allows output_padding below the dilation; from an output padded by the stride or
    more, the convolution it transposes gives a larger result than the layer's input."""
    theirs = nn.ConvTranspose2d(2, 2, 3, stride=1, dilation=2, output_padding=1)
    ours = copy.deepcopy(theirs)
    ours.__class__, ours.ucudnn_context = ut_layers.ConvTranspose2d, numpy_context()
    x = torch.randn(2, 2, 5, 5)
    with pytest.warns(UcudnnWarning, match=r"output_padding=\(1, 1\) not below stride=\(1, 1\)"):
        got = run_step(ours, x)
    assert_matches(got, run_step(theirs, x))
    assert not any(via == "ucudnn" for via, _ in ours.ucudnn_context.runs)


def test_a_transposed_layer_given_output_size_runs_torchs_own_with_a_warning(numpy_context, torch_without_mkldnn):
    theirs = nn.ConvTranspose2d(2, 2, 3, stride=2)
    ours = copy.deepcopy(theirs)
    ours.__class__, ours.ucudnn_context = ut_layers.ConvTranspose2d, numpy_context()
    x = torch.randn(2, 2, 4, 4)
    with pytest.warns(UcudnnWarning, match="output_size"):
        got = ours(x, output_size=[10, 10])
    torch.testing.assert_close(got, theirs(x, output_size=[10, 10]))
    assert not ours.ucudnn_context.runs


def test_convert_turns_every_kind_of_convolution_layer_into_its_twin_and_leaves_subclasses(numpy_context):
    class Standardized(nn.Conv3d):  # a subclass that changes forward: left alone, with a warning
        def forward(self, input):
            return super().forward(input)

    kinds = [nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d]
    model = nn.Sequential(*(kind(2, 2, 1) for kind in kinds), Standardized(2, 2, 1))
    context = numpy_context()
    with pytest.warns(UcudnnWarning, match="Standardized"):
        ut.convert(model, context=context)
    assert [type(m) for m in model] == [ut_layers.TWINS[kind] for kind in kinds] + [Standardized]
    assert all(m.ucudnn_context is context for m in model[:-1])
    assert all(type(m).torch_class is kind for m, kind in zip(model, kinds))


def test_a_subclass_that_keeps_torchs_forward_is_converted_and_matches_torch(numpy_context):
    """torchvision's video models build their layers from nn.Conv3d subclasses that only add a
    constructor and a static method (Conv3DSimple): converted, their own members kept."""
    class Simple(nn.Conv3d):
        def __init__(self, channels):
            super().__init__(channels, channels, 3, padding=1, bias=False)

        @staticmethod
        def stride_of(stride):
            return stride, stride, stride

    torch.manual_seed(0)
    theirs = nn.Sequential(Simple(4), nn.ReLU(), Simple(4))
    ours = ut.convert(copy.deepcopy(theirs), context=numpy_context())
    assert all(isinstance(m, Simple) and isinstance(m, ut_layers.Converted) for m in ours[::2])
    assert type(ours[0]) is type(ours[2]) and type(ours[0]).torch_class is Simple and ours[0].stride_of(2) == (2, 2, 2)
    assert ut_layers.twin_of(Simple) is type(ours[0])  # made once
    x = torch.randn(2, 4, 5, 6, 6)
    assert_matches(run_step(ours, x), run_step(theirs, x))
    assert ours[0].ucudnn_context.runs["ucudnn", "F"] == 2


@pytest.mark.parametrize("concurrent", [False, True])
def test_a_concurrent_backward_runs_bf_beside_bd_and_joins_before_returning(concurrent, tmp_path):
    """concurrent_backward (TorchOptions): in each layer's backward, BF runs on the framework's side
    stream (its operands marked as used there) while BD runs on the current one, and the current
    stream waits for the side one before the backward returns; results equal torch's either way."""
    from ucudnn.plan.config import Settings

    torch.manual_seed(0)
    framework = NumpyFramework()
    settings = Settings.load(workspace_limit="64KiB", planning="first_call")
    context = ut.Context(settings, framework=framework, cache=Cache(tmp_path / "bench.db"),
                         concurrent_backward=concurrent)
    plain = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3))
    model = ut.convert(copy.deepcopy(plain), context=context)
    ran = []
    run = context.planner.run
    context.planner.run = lambda site, kind, *operands: ran.append((kind.value, framework.aside)) or run(site, kind, *operands)
    x = torch.randn(4, 3, 8, 8)
    assert_matches(run_step(model, x), run_step(plain, x))
    backward = [r for r in ran if r[0] != "F"]
    if concurrent:
        assert backward == [("BF", True), ("BD", False), ("BF", True), ("BD", False)]
        assert framework.streams == ["opened", "joined"] * 2 and len(framework.marked) == 2 * 3
    else:
        assert all(not aside for _, aside in backward) and framework.streams == []


def test_micro_batches_really_run(numpy_context):
    """With a tight limit the fake fast algorithms only fit small micro-batches: every kernel is
    split, and the results (BF accumulating over micro-batches) still match torch."""
    torch.manual_seed(0)
    theirs = nn.Conv2d(8, 16, 3, padding=1)
    context = numpy_context(workspace_limit="100KiB")
    ours = ut.convert(copy.deepcopy(theirs), context=context)
    x = torch.randn(16, 8, 10, 10)
    dy = torch.randn(16, 16, 10, 10)
    assert_matches(run_step(ours, x, dy), run_step(theirs, x, dy))
    kernels = context.summary()["kernels"]
    assert {k["kind"] for k in kernels} == {"F", "BD", "BF"}
    assert all(k["parts"] > 1 and 0 < k["workspace"] <= 100 * 2**10 for k in kernels), kernels
    steps = context.handle(torch.device("cpu")).steps
    assert len(steps) == sum(k["parts"] for k in kernels)


def test_no_grad_runs_forward_only(numpy_context):
    context = numpy_context()
    conv = ut.convert(nn.Conv2d(3, 4, 3), context=context)
    with torch.no_grad():
        y = conv(torch.randn(4, 3, 6, 6))
    assert not y.requires_grad and dict(context.runs) == {("ucudnn", "F"): 1}


def test_autocast_computes_in_the_autocast_dtype(numpy_context):
    """Under autocast every layer computes in float16, whatever its input's dtype: the second
    layer gets float16 from the first and still has float32 weights, as in torch."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3, bias=False))
    context = numpy_context()
    ours = ut.convert(copy.deepcopy(model), context=context)
    x = torch.randn(4, 3, 8, 8)
    results = []
    for module in (model, ours):
        with torch.autocast("cpu", dtype=torch.float16):
            y = module(x)
        y.float().square().sum().backward()
        results.append([y.detach()] + [p.grad for p in module.parameters()])
    assert y.dtype == torch.float16 and all(p.grad.dtype == torch.float32 for p in ours.parameters())
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2 * max(1.0, b.abs().max().item()))
    kernels = context.summary()["kernels"]
    assert sorted(k["kind"] for k in kernels) == ["BD", "BF", "BF", "F", "F"]
    assert all("float16" in k["kernel"] for k in kernels)


def test_compile_keeps_results(numpy_context):
    """Traced graphs in detail: tests/test_torch_traced.py."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 2, 3))
    context = numpy_context()
    ours = ut.convert(copy.deepcopy(model), context=context)
    x = torch.randn(4, 3, 8, 8)
    compiled = torch.compile(ours, backend="aot_eager")
    assert_matches(run_step(compiled, x), run_step(model, x))
    assert context.runs["ucudnn", "F"] == 2


def test_wd_learns_the_network_from_a_sample_then_solves_once(numpy_context):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1, bias=False),
                          nn.ReLU(), nn.Conv2d(8, 4, 1))
    context = numpy_context(optimizer="wd", workspace_limit="32KiB")
    ours = ut.convert(copy.deepcopy(model), context=context, sample_input=torch.randn(8, 3, 6, 6))
    assert not context.runs  # the sample pass ran through torch
    result = context.handle(torch.device("cpu")).wd_result
    kinds = sorted(key.split("|")[0] for key in result.configurations)
    assert kinds == sorted(["F"] * 3 + ["BD"] * 2 + ["BF"] * 3)  # no BD for the first layer's input
    assert result.total_workspace <= 8 * 32 * 2**10
    x = torch.randn(8, 3, 6, 6)
    assert_matches(run_step(ours, x), run_step(model, x))
    assert context.summary()["wd"][0]["total_workspace"] == result.total_workspace
    assert result is context.handle(torch.device("cpu")).wd_result  # solved once


def test_wd_without_sample_learns_during_the_first_pass(numpy_context, monkeypatch):
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Conv2d(4, 4, 3))
    context = numpy_context(optimizer="wd")
    ut.convert(model, context=context)
    x = torch.randn(4, 3, 8, 8)
    model(x).sum().backward()
    assert not context.runs  # first pass: torch, recording
    model(x).sum().backward()
    assert context.handle(torch.device("cpu")).wd_result is not None
    assert {kind for (via, kind) in context.runs if via == "ucudnn"} == {"F", "BD", "BF"}


def test_learning_under_no_grad_records_forward_kernels_only(numpy_context):
    context = numpy_context(optimizer="wd")
    model = ut.convert(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Conv2d(4, 4, 3)), context=context)
    with torch.no_grad(), ut.network(model):
        model(torch.randn(2, 3, 8, 8))
    keys = context.handle(torch.device("cpu")).wd_result.configurations
    assert [key.split("|")[0] for key in keys] == ["F", "F"]


def test_unsupported_dtype_falls_back(numpy_context):
    torch.manual_seed(0)
    theirs = nn.Conv2d(2, 3, 3).double()
    context = numpy_context()
    ours = ut.convert(copy.deepcopy(theirs), context=context)
    x = torch.randn(2, 2, 5, 5, dtype=torch.float64)
    with pytest.warns(UcudnnWarning, match="dtype torch.float64"):
        assert torch.equal(ours(x), theirs(x))
    assert not context.runs


@contextlib.contextmanager
def deterministic_torch(flag: str):
    """torch's deterministic setting `flag` on inside, restored after."""
    if flag == "use_deterministic_algorithms":
        torch.use_deterministic_algorithms(True)
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(False)
    else:
        with torch.backends.cudnn.flags(deterministic=True):
            yield


@pytest.mark.parametrize("flag", ["use_deterministic_algorithms", "cudnn.deterministic"])
def test_deterministic_torch_plans_deterministic_kernels(flag, numpy_context, monkeypatch):
    """Under either of torch's deterministic settings ucudnn runs the layer (no fallback) with
    kernels whose candidates are deterministic only (ConvProblem.deterministic, its own key)."""
    torch.manual_seed(0)
    context = numpy_context()
    conv = ut.convert(nn.Conv2d(2, 3, 3), context=context)
    handle = context.handle(torch.device("cpu"))
    planned, assignment = [], handle.assignment
    monkeypatch.setattr(handle, "assignment", lambda problem: planned.append(problem) or assignment(problem))
    x = torch.randn(4, 2, 6, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UcudnnWarning)
        with deterministic_torch(flag):
            assert calls.deterministic_algorithms()
            run_step(conv, x)
        run_step(conv, x)
    assert not calls.deterministic_algorithms()
    # each BD also planned as the forward convolution of dy it equals (bd_as_forward), deterministic alike
    assert [(p.kind.value, p.deterministic) for p in planned] == [
        ("F", True), ("BD", True), ("F", True), ("BF", True), ("F", False), ("BD", False), ("F", False), ("BF", False)]
    assert context.runs["ucudnn", "BF"] == 2 and not context.fallbacks


def test_unplannable_kernels_run_through_torch(numpy_context):
    """A kernel ucudnn cannot plan (no algorithm fits) runs through torch, with one warning."""
    context = numpy_context()
    torch.manual_seed(0)
    plain = nn.Conv2d(2, 2, 3)
    conv = ut.convert(copy.deepcopy(plain), context=context)

    def refuse(problem):
        raise NoAlgorithmError(f"no algorithm of {problem.describe()} fits")

    context.handle(torch.device("cpu")).assignment = refuse
    x = torch.randn(3, 2, 6, 6)
    with pytest.warns(UcudnnWarning, match="no algorithm"):
        got = run_step(conv, x)
    for a, b in zip(got, run_step(plain, x)):
        torch.testing.assert_close(a, b)
    assert {via for (via, _) in context.runs} == {"torch"}


def test_import_ucudnn_torch_exports():
    assert ut.Conv2d is integration.Conv2d and ut.convert is integration.convert
    assert set(integration.__all__) <= set(dir(ut))


# --- call sites: what a steady-state call skips ---------------------------------------------------

def count_resolves_and_compiles(monkeypatch, context):
    """Counters of resolve's slow path (_resolve) and of kernel compilations (handle.program)."""
    counts = {"resolve": 0, "program": 0}
    resolve, handle = calls._resolve, context.handle(torch.device("cpu"))
    program = handle.program

    def counting_resolve(*args):
        counts["resolve"] += 1
        return resolve(*args)

    def counting_program(*args, **kwargs):
        counts["program"] += 1
        return program(*args, **kwargs)

    monkeypatch.setattr(calls, "_resolve", counting_resolve)
    monkeypatch.setattr(handle, "program", counting_program)
    return counts


def test_steady_state_calls_resolve_and_compile_once(numpy_context, monkeypatch):
    context = numpy_context()
    conv = ut.convert(nn.Conv2d(3, 4, 3), context=context)
    counts = count_resolves_and_compiles(monkeypatch, context)
    x = torch.randn(4, 3, 6, 6)
    for _ in range(3):
        run_step(conv, x)
    assert counts == {"resolve": 1, "program": 3}  # one signature; F, BD, BF compiled once each
    assert len(context.sites) == 1 and context.runs["ucudnn", "BF"] == 3
    twin = ut.convert(nn.Conv2d(3, 4, 3), context=context)  # an equal layer: a site of its own, the same kernels
    run_step(twin, x)
    assert counts == {"resolve": 2, "program": 3}


@pytest.mark.parametrize("change", ["shape", "dtype", "layout", "module", "padding", "deterministic"])
def test_a_new_signature_resolves_again(change, numpy_context, monkeypatch):
    torch.manual_seed(0)
    context = numpy_context()
    conv = ut.convert(nn.Conv2d(3, 4, 3), context=context)
    counts = count_resolves_and_compiles(monkeypatch, context)
    x = torch.randn(4, 3, 6, 6)
    run_step(conv, x)
    expected = 2
    if change == "shape":
        x = torch.randn(2, 3, 7, 6)
    elif change == "dtype":
        conv.half()  # ucudnn runs it (NumPy's float16), a kernel of its own
        x = x.half()
    elif change == "layout":
        x = x.contiguous(memory_format=torch.channels_last)
    elif change == "module":
        conv = ut.convert(nn.Conv2d(3, 4, 3, bias=False, stride=2), context=context)
    elif change == "padding":
        conv.padding = (1, 1)
    with deterministic_torch("use_deterministic_algorithms") if change == "deterministic" else contextlib.nullcontext():
        got = run_step(conv, x)
    assert counts["resolve"] == expected
    plain = nn.Conv2d(3, 4, 3)
    plain.__dict__.update({k: v for k, v in conv.__dict__.items() if k != "ucudnn_context"})
    want = run_step(plain, x)
    for a, b in zip(got, want):  # float16: NumPy's float64 rounds once, torch's CPU kernel more often
        tolerance = 1e-2 if change == "dtype" else 1e-4
        torch.testing.assert_close(a.float(), b.float(), rtol=tolerance,
                                   atol=tolerance * max(1.0, b.abs().max().item()))


def test_autocast_and_tf32_are_part_of_the_signature(numpy_context, monkeypatch):
    context = numpy_context()
    conv = ut.convert(nn.Conv2d(3, 4, 3), context=context)
    counts = count_resolves_and_compiles(monkeypatch, context)
    x = torch.randn(4, 3, 6, 6)
    run_step(conv, x)
    with torch.autocast("cpu", dtype=torch.float16):
        conv(x)
    allow = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = not allow
        conv(x)
    finally:
        torch.backends.cudnn.allow_tf32 = allow
    assert counts["resolve"] == 3
    math = {k["kernel"].split("math=")[1].split()[0] for k in context.summary()["kernels"] if "float32" in k["kernel"]}
    assert math == {"default", "fma"}


def test_fallback_decisions_are_remembered_but_still_counted_and_warned_once(monkeypatch):
    conv = ut.convert(nn.Conv2d(2, 2, 3))
    context = conv.ucudnn_context
    resolved = []
    resolve = calls._resolve
    monkeypatch.setattr(calls, "_resolve", lambda *args: resolved.append(1) or resolve(*args))
    x = torch.randn(1, 2, 5, 5)
    with pytest.warns(UcudnnWarning, match="input on cpu") as caught:
        conv(x)
        conv(x)
    assert len(resolved) == 1 and len(caught) == 1
    assert context.fallbacks["input on cpu (ucudnn runs CUDA tensors only)"] == 2


def test_reset_forgets_sites_and_a_backward_in_flight_uses_the_new_plans(numpy_context, monkeypatch):
    context = numpy_context()
    conv = ut.convert(nn.Conv2d(3, 4, 3), context=context)
    x = torch.randn(4, 3, 6, 6)
    run_step(conv, x)
    counts = count_resolves_and_compiles(monkeypatch, context)
    y = conv(x.clone().requires_grad_())
    context.reset()
    assert len(context.sites) == 0
    y.sum().backward()  # BD and BF planned and compiled afresh, not the forgotten kernels
    assert counts == {"resolve": 0, "program": 2}
    run_step(conv, x)
    assert counts == {"resolve": 1, "program": 3}


def test_sites_are_bounded():
    sites = Sites(max_sites=2)
    call = calls.Call(torch.device("cpu"), (1, 1, 3, 3), (1, 1, 1, 1), calls.Geometry((0, 0), (1, 1), (1, 1), 1),
                            "float32", "default", "nchw")
    first = sites.get("a", lambda: (call, (ConvKind.FORWARD,)))
    first.kernels["F"] = object()
    assert sites.get("a", lambda: pytest.fail("resolved again")) is first
    assert sites.get("b", lambda: "a reason") == "a reason" and sites.get("c", lambda: None) is None
    assert len(sites) == 1 and not first.kernels and sites.resolved == 3


def test_stream_changes_reach_the_handle(numpy_context):
    """A kernel follows torch's current stream: the handle is pointed at it when it changes."""
    context = numpy_context()
    conv = ut.convert(nn.Conv2d(3, 4, 3), context=context)
    handle = context.handle(torch.device("cpu"))
    seen = []
    handle.set_stream = lambda stream: (seen.append(stream), setattr(handle, "stream", stream))
    streams = iter([7, 7, 7, 9, 9, 9])
    context.framework.stream = lambda device: next(streams)
    x = torch.randn(4, 3, 6, 6)
    run_step(conv, x)
    run_step(conv, x)
    assert seen == [7, 9]


@pytest.mark.parametrize("keyword, value, named", [("policy", "foo", "policy='foo'"),
                                                   ("total_limit", "lots", "total_limit='lots'")])
def test_convert_errors_name_its_own_keywords(keyword, value, named):
    """convert's keywords are the settings' own names (ucudnn.plan.config.Settings), so an error names
    what the caller wrote."""
    with pytest.raises(ConfigError) as error:
        ut.convert(nn.Conv2d(1, 1, 1), **{keyword: value})
    assert named in str(error.value)


# --- delegation: layers ucudnn would not speed up run torch's own convolution ----------------------

def test_worth_delegating_rule():
    from ucudnn.plan.delegation import worth_delegating
    from ucudnn.plan.framework import OwnTiming as T
    limit = 64 * 2**20
    assert worth_delegating([1.0, 1.0], [T(1.0, 0), T(1.02, limit)], [limit, limit], host_cost_ms=0.05)
    assert worth_delegating([0.5], [T(1.0, 0)], [limit], host_cost_ms=0.6)  # saves less than the host cost
    assert not worth_delegating([0.5], [T(1.0, 0)], [limit], host_cost_ms=0.05)  # ucudnn clearly faster
    assert not worth_delegating([5.0], [T(1.0, limit + 1)], [limit])  # torch's plan needs more than the limit
    assert not worth_delegating([1.0, 1.0], [T(1.0, 0), T(1.0, limit)], [limit, limit - 1])  # each kernel its own room
    assert not worth_delegating([], [], [])


def delegating_context(numpy_context, torch_timing, **settings):
    return numpy_context(framework=NumpyFramework(torch_timing), **settings)


def test_a_layer_torch_runs_as_fast_within_the_limit_is_delegated(numpy_context):
    torch.manual_seed(0)
    context = delegating_context(numpy_context, lambda problem: OwnTiming(0.0, 1024))
    plain = nn.Conv2d(3, 4, 3)
    conv = ut.convert(copy.deepcopy(plain), context=context)
    x = torch.randn(4, 3, 6, 6)
    for _ in range(3):
        got = run_step(conv, x)
    for a, b in zip(got, run_step(plain, x)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # torch's own layer: the same arithmetic
    assert dict(context.runs) == {("torch", "layer"): 3}
    assert [p.kind.value for p in context.framework.timed] == ["F", "BD", "BF"]  # timed once each
    assert all(context.framework.timed_planning)  # their operands go back to the device afterwards
    kernels = context.summary()["kernels"]
    assert {k["kind"] for k in kernels} == {"F", "BD", "BF"}
    assert all(k["delegated"] and k["via"] == "torch" and k["own_ms"] == 0.0 for k in kernels)
    # torch's kernels and cuDNN's favourites fit the limit: no sweep of ucudnn's candidates at all
    assert not any(k["swept"] for k in kernels) and not context.planner.kernels.planned
    assert all(k["planning_s"] > 0 for k in kernels) and context.summary()["planning_s"] > 0


def test_a_later_process_reads_torchs_timings_from_the_database_and_decides_alike(numpy_context, tmp_path):
    """torch's timings taken with nothing out of reach are kept (timings.py): a new context on
    the same database times nothing and delegates the same layers; they are no candidates of
    ucudnn's optimizers, and the database's rules accept them."""
    from ucudnn.measure.cache.database import BenchmarkDatabase
    from ucudnn.plan.delegation import ROOMY_BYTES

    x = torch.randn(4, 3, 6, 6)
    # torch's F fits and is fast; its BD needs more than the limit: that layer is swept
    timing = lambda p: OwnTiming(0.5, 2**40 if p.kind.value == "BD" else 0, ROOMY_BYTES)  # noqa: E731
    decided = []
    for _ in range(2):
        context = delegating_context(numpy_context, timing)
        model = ut.convert(nn.Conv2d(3, 4, 3), context=context)
        run_step(model, x)
        decided.append(({k["kind"]: (k["delegated"], k["swept"]) for k in context.summary()["kernels"]},
                        len(context.framework.timed)))
    assert decided[0][1] == 3 and decided[1] == (decided[0][0], 0)  # the second timed nothing
    with BenchmarkDatabase(tmp_path / "bench.db") as db:
        db.check()
        problem = next(iter(context.planner.delegation.own_timings))[1].problem(ConvKind.BACKWARD_DATA)
        table = db.table(problem, context.handle(torch.device("cpu")).assignments.benchmarker.device)
    kept = [m for m in table if m.algo.startswith("torch:")]
    assert [(m.time_ms, m.workspace) for m in kept] == [(0.5, 2**40)]
    assert kept and all(not m.algo.startswith("torch:") for m in table.only(["legacy", "engines"]))


def test_torchs_timings_under_memory_pressure_are_neither_kept_nor_read(numpy_context):
    """Taken with less than ROOMY_BYTES free, a timing describes the moment: timed again."""
    from ucudnn.plan.delegation import ROOMY_BYTES

    x = torch.randn(4, 3, 6, 6)
    for free, timed in ((ROOMY_BYTES // 2, 3), (ROOMY_BYTES, 3), (ROOMY_BYTES // 2, 3), (ROOMY_BYTES, 0)):
        context = delegating_context(numpy_context, lambda p: OwnTiming(0.01, 0, free))
        context.framework.memory_now = Memory(free, 0)
        run_step(ut.convert(nn.Conv2d(3, 4, 3), context=context), x)
        assert len(context.framework.timed) == timed, free


def test_the_sweep_decides_where_cudnns_favourite_does_not_fit(numpy_context):
    """torch's kernel fits, but the plan cuDNN rates best does not (torch settled for less):
    ucudnn's candidates are swept, and the faster side runs the layer."""
    x = torch.randn(4, 3, 6, 6)
    for torch_ms, delegated in ((1e6, False), (0.0, True)):
        context = delegating_context(numpy_context, lambda problem: OwnTiming(torch_ms, 0),
                                     workspace_limit="1KiB")  # the fakes' favourite needs ~4 KiB here
        run_step(ut.convert(nn.Conv2d(3, 4, 3), context=context), x)
        kernels = context.summary()["kernels"]
        assert all(k["swept"] and k["delegated"] == delegated for k in kernels), torch_ms


def test_a_layer_planned_over_several_slices_asks_cudnns_favourite_once(numpy_context, monkeypatch):
    """Between iterations a layer's kernels may be swept in different slices; what was asked on
    the way (cuDNN's favourites, torch's timings) is asked once."""
    from ucudnn.plan import planner

    from fakes import favourite

    monkeypatch.setattr(planner, "PLANNING_SLICE_S", 0.0)  # one round of a sweep a slice
    context = delegating_context(numpy_context, lambda problem: OwnTiming(1e6, 0), planning="between_iterations",
                                 workspace_limit="1KiB")  # torch's timing under pressure; the favourite does not fit
    asked = []
    monkeypatch.setattr(context.framework.handle_class, "favourite",
                        lambda self, problem: asked.append(problem.kind.value) or favourite(problem))
    model, x = ut.convert(nn.Conv2d(3, 4, 3), context=context), torch.randn(4, 3, 6, 6)
    slices = []  # the kernels planned so far, at each step's end: a sweep goes on over several slices
    for _ in range(40):
        run_step(model, x)
        slices.append(len(context.planner.kernels.planned))
        if not context.summary()["pending"]:
            break
    assert context.summary()["pending"] == 0 and len(context.planner.kernels.planned) == 3
    assert len(slices) > 3 + 2  # more steps than kernels (and the two observed first): sweeps went on over slices
    assert asked == ["F"] and [p.kind.value for p in context.framework.timed] == ["F", "BD", "BF"]


def test_settled_by_own_rule():
    from ucudnn.plan.delegation import ROOMY_BYTES, settled_by_own
    from ucudnn.plan.framework import OwnTiming as T

    limit, asked = 8 * 2**20, []

    def favourites(fit):
        return lambda: asked.append(fit) or fit

    roomy, tight = ROOMY_BYTES, ROOMY_BYTES - 1
    assert settled_by_own([T(1.0, limit, roomy), T(9.0, 0, roomy)], [limit] * 2, favourites(False)) and not asked
    assert settled_by_own([T(1.0, limit, tight)], [limit], favourites(True)) and asked == [True]
    assert not settled_by_own([T(1.0, 0, tight)], [limit], favourites(False))  # cuDNN's favourite is kept out
    assert not settled_by_own([T(1.0, limit + 1, roomy)], [limit], favourites(True))  # torch's own needs more
    assert not settled_by_own([T(float("inf"), 0, roomy)], [limit], favourites(True))  # operands did not fit
    assert not settled_by_own([], limit, favourites(True))
    assert asked == [True, False]


@pytest.mark.parametrize("torch_ms, torch_workspace", [(1e6, 0), (0.0, 2**40)], ids=["ucudnn-faster", "over-limit"])
def test_a_layer_ucudnn_speeds_up_or_torch_cannot_fit_is_not_delegated(torch_ms, torch_workspace, numpy_context):
    torch.manual_seed(0)
    context = delegating_context(numpy_context, lambda problem: OwnTiming(torch_ms, torch_workspace),
                                 workspace_limit="1KiB")  # cuDNN's favourite (the fakes' ~4 KiB) does not fit
    plain = nn.Conv2d(3, 4, 3)
    conv = ut.convert(copy.deepcopy(plain), context=context)
    x = torch.randn(4, 3, 6, 6)
    assert_matches(run_step(conv, x), run_step(plain, x))
    assert dict(context.runs) == {("ucudnn", "F"): 1, ("ucudnn", "BD"): 1, ("ucudnn", "BF"): 1}
    assert not any(k["delegated"] for k in context.summary()["kernels"])


def test_a_kernel_torch_runs_faster_within_the_limit_runs_torchs_own_in_a_layer_ucudnn_keeps(numpy_context):
    """torch's F and BD cannot run within the limit; its BF can and is faster than ucudnn's plan:
    the layer stays with ucudnn, its BF runs torch's own convolution."""
    from ucudnn.plan.delegation import own_kernels_faster
    from ucudnn.plan.framework import OwnTiming as T

    apart = [[0], [1], [2]]  # timed one by one
    assert own_kernels_faster([2.0], [T(1.0, 512)], [1024], [[0]]) == {0}
    assert own_kernels_faster([2.0], [T(1.0, 2048)], [1024], [[0]]) == set()  # over its room
    assert own_kernels_faster([1.0, 1.0, 9.0], [T(2.0, 0), T(float("inf"), 0), T(1.0, 0)], [1024] * 3, apart) == {2}
    # seen in the step: the backward kernels' even shares are weighed together, as one group
    assert own_kernels_faster([1.0, 0.5, 9.0], [T(2.0, 0), T(4.0, 0), T(4.0, 0)], [1024] * 3, [[0], [1, 2]]) == {1, 2}
    assert own_kernels_faster([1.0, 0.5, 3.0], [T(2.0, 0), T(4.0, 0), T(4.0, 0)], [1024] * 3, [[0], [1, 2]]) == set()
    timing = lambda p: T(0.0, 0) if p.kind.value == "BF" else T(0.0, 2**40)  # noqa: E731
    context = delegating_context(numpy_context, timing, workspace_limit="1KiB")
    plain = nn.Conv2d(3, 4, 3)
    conv = ut.convert(copy.deepcopy(plain), context=context)
    x = torch.randn(4, 3, 6, 6)
    assert_matches(run_step(conv, x), run_step(plain, x))
    assert dict(context.runs) == {("ucudnn", "F"): 1, ("ucudnn", "BD"): 1, ("torch", "BF"): 1}
    via = {k["kind"]: (k["via"], k["delegated"]) for k in context.summary()["kernels"]}
    assert via == {"F": ("ucudnn", False), "BD": ("ucudnn", False), "BF": ("torch", False)}


def test_delegation_off_and_wd_never_time_torch(numpy_context):
    fast_torch = lambda problem: OwnTiming(0.0, 0)  # noqa: E731
    x = torch.randn(4, 3, 6, 6)
    for settings in (dict(delegate=False), dict(optimizer="wd")):
        context = delegating_context(numpy_context, fast_torch, **settings)
        conv = ut.convert(nn.Conv2d(3, 4, 3), context=context)
        with ut.network(conv):
            conv(x)
        run_step(conv, x)
        assert not context.framework.timed and context.runs["ucudnn", "F"] == 1, settings
    with pytest.raises(ConfigError, match="delegate"):
        ut.convert(nn.Conv2d(1, 1, 1), context=context, delegate=False)


def test_grad_mode_is_part_of_the_signature_and_of_what_is_timed(numpy_context):
    context = delegating_context(numpy_context, lambda problem: OwnTiming(0.0, 0))
    conv = ut.convert(nn.Conv2d(3, 4, 3), context=context)
    x = torch.randn(4, 3, 6, 6)
    with torch.no_grad():
        conv(x)
    assert [p.kind.value for p in context.framework.timed] == ["F"]
    run_step(conv, x)  # a training call: its own site, BD and BF timed too
    assert [p.kind.value for p in context.framework.timed] == ["F", "BD", "BF"] and len(context.sites) == 2
    conv.weight.requires_grad_(False)
    conv(x.clone().requires_grad_()).sum().backward()  # F and BD only: a third site, nothing new to time
    assert len(context.sites) == 3 and len(context.framework.timed) == 3


def test_an_oom_while_timing_torch_means_no_delegation(monkeypatch):
    """Under memory pressure torch's kernel may not even be timeable: the layer stays with ucudnn
    and the training step goes on."""
    def out_of_memory(self, problem, device, free):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(integration.TorchFramework, "_time_own", out_of_memory)
    problem = calls.Call(torch.device("cpu"), (2, 3, 8, 8), (4, 3, 3, 3), calls.Geometry((0, 0), (1, 1), (1, 1), 1),
                               "float32", "default", "nchw").problem(ConvKind.FORWARD)
    timing = integration.TorchFramework().time_own(problem, torch.device("cpu"))
    assert timing.ms == float("inf") and timing.workspace == 0
    from ucudnn.plan.delegation import worth_delegating
    assert not worth_delegating([1.0], [timing], [2**30])


def test_a_parametrized_weight_is_read_through_its_parametrization(numpy_context):
    """torch.nn.utils.parametrize moves `weight` out of _parameters into a property: the layer's
    site must see the weight the parametrization computes, and its gradient reaches the original."""
    from torch.nn.utils import parametrize

    class Double(nn.Module):
        def forward(self, w):
            return 2 * w

    torch.manual_seed(0)
    plain = nn.Conv2d(3, 4, 3)
    conv = ut.convert(copy.deepcopy(plain), context=numpy_context())
    for module in (plain, conv):
        parametrize.register_parametrization(module, "weight", Double())
    assert "weight" not in conv._parameters
    x = torch.randn(4, 3, 6, 6)
    assert_matches(run_step(conv, x), run_step(plain, x))
    assert conv.ucudnn_context.runs  # ran through ucudnn, not a fallback


def test_planning_between_iterations_runs_torch_until_the_plan_is_ready(numpy_context):
    """planning='between_iterations': a layer that needs a sweep runs torch's own convolution
    (nothing is measured in its first iteration); the next iteration starts with planning it,
    and from then on it runs as planned, with torch's results. It is the default."""
    torch.manual_seed(0)
    context = numpy_context(planning=None, delegate=False)
    plain = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3))
    model = ut.convert(copy.deepcopy(plain), context=context)
    x = torch.randn(4, 3, 8, 8)
    assert_matches(run_step(model, x), run_step(plain, x))
    assert dict(context.runs) == {("torch", "layer"): 2} and not context.planner.kernels.planned
    assert context.summary()["pending"] == 2 and context.summary()["planning"] == "between_iterations"
    assert_matches(run_step(model, x), run_step(plain, x))  # planned at the first layer's call
    assert context.summary()["pending"] == 0
    assert context.runs["ucudnn", "F"] == 2 and context.runs["ucudnn", "BF"] == 2
    assert {k["kind"] for k in context.summary()["kernels"] if k["swept"]} == {"F", "BD", "BF"}


def test_planning_between_iterations_keeps_to_its_budget_and_plan_pending_finishes(numpy_context, monkeypatch):
    """With a slice of 0 s, each iteration's planning measures at most one round of one sweep (the
    slice is spent once a round completed a size), the waiting layers running torch's own kernels
    meanwhile; a sweep goes on where the last slice left it (the table is the state: no size of a
    kernel measured twice); plan_pending() plans the rest at once."""
    from ucudnn.plan import planner

    from fakes import FakeBenchmarker

    monkeypatch.setattr(planner, "PLANNING_SLICE_S", 0.0)
    rounds, measure = [], FakeBenchmarker.measure  # each call: a round of one backend (the fakes have one)
    monkeypatch.setattr(FakeBenchmarker, "measure", lambda self, problem, sizes, *args, **kwargs:
                        rounds.append([(problem.key, b) for b in sizes]) or measure(self, problem, sizes, *args, **kwargs))
    context = numpy_context(planning="between_iterations", delegate=False)
    model = ut.convert(nn.Sequential(*[nn.Conv2d(3 + i, 4 + i, 3, padding=1) for i in range(3)]), context=context)
    x = torch.randn(2, 3, 6, 6)
    run_step(model, x)  # torch's own everywhere, nothing planned
    assert context.summary()["pending"] == 3 and not context.planner.kernels.planned and not rounds
    measured = []
    for _ in range(6):
        before = len(rounds)
        run_step(model, x)
        measured.append(len(rounds) - before)
    assert max(measured) == 1 and context.summary()["pending"] > 0  # a round a step, and more to do
    assert context.plan_pending() == 0
    sizes = [size for each in rounds for size in each]
    assert len(set(sizes)) == len(sizes) and len(rounds) > 6  # the next slice measured nothing again
    run_step(model, x)
    assert context.runs["ucudnn", "F"] >= 3


def test_the_planning_setting_is_checked():
    with pytest.raises(ConfigError, match="planning"):
        ut.Context(planning="lazy")


def test_planning_between_iterations_times_nothing_in_the_first_iteration(numpy_context):
    """The first iteration runs torch's own convolution with nothing timed, as torch's own would;
    at the start of the second, torch's kernels are timed and the layer is settled by torch
    (no sweep) or swept and planned."""
    from ucudnn.plan.delegation import ROOMY_BYTES

    x = torch.randn(4, 3, 6, 6)
    for workspace, swept in ((0, False), (2**40, True)):  # fits the limit: settled; needs more: swept
        context = delegating_context(  # a database each: the first keeps torch's timings (timings.py)
            numpy_context, lambda problem: OwnTiming(1.0, workspace, ROOMY_BYTES),
            planning="between_iterations", database=f"{workspace}.db")
        model = ut.convert(nn.Conv2d(3, 4, 3), context=context)
        run_step(model, x)
        assert context.summary()["pending"] == 1 and context.runs["torch", "layer"] == 1
        assert context.framework.timed == []
        run_step(model, x)
        assert len(context.framework.timed) == 3 and context.summary()["pending"] == 0
        assert context.runs["ucudnn", "F"] == swept and context.runs["torch", "layer"] == 2 - swept
        assert {k["swept"] for k in context.summary()["kernels"]} == {swept}


AS_FORWARD_LAYERS = [  # stride-1 layers whose BD has a forward twin; a transposed layer's forward is its BD
    (nn.Conv2d(4, 6, 3, padding=1, groups=2), ut.Conv2d, (8, 4, 9, 8)),
    (nn.Conv1d(4, 4, 3, padding=2, dilation=2), ut_layers.Conv1d, (8, 4, 19)),
    (nn.Conv3d(2, 4, (3, 1, 3), padding=(1, 0, 2)), ut_layers.Conv3d, (8, 2, 4, 5, 6)),
    (nn.ConvTranspose2d(6, 4, 3, padding=1, bias=False), ut_layers.ConvTranspose2d, (8, 6, 5, 7)),
]


@pytest.mark.parametrize("case", range(len(AS_FORWARD_LAYERS)), ids=lambda i: f"{AS_FORWARD_LAYERS[i][1].__name__}-{i}")
@pytest.mark.parametrize("form", ["packed", "channels_last"])
def test_a_slow_data_gradient_runs_as_a_forward_convolution_with_torchs_results(case, form, tmp_path, monkeypatch,
                                                                                 torch_without_mkldnn):
    """bd_as_forward with BD's plans slow: the data gradient runs as the forward convolution of dy
    (the weights transposed in their own memory format), outputs and gradients equal torch's."""
    from ucudnn.plan.config import Settings

    from fakes import slower

    slower(monkeypatch, ConvKind.BACKWARD_DATA, 4.0)
    settings = Settings.load(workspace_limit="64KiB", planning="first_call", bd_as_forward=True)
    context = ut.Context(settings, framework=NumpyFramework(), cache=Cache(tmp_path / "bench.db"))
    theirs, twin, shape = AS_FORWARD_LAYERS[case]
    ours, _, _ = twins_step(theirs, twin, shape, form, context, case)
    backward = [k for k in ours.ucudnn_context.summary()["kernels"] if k["kind"] == "BD"]
    assert len(backward) == 1 and backward[0]["as_forward"].startswith("F "), backward


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("shape, groups", [((3, 1, 2, 1), 1), ((6, 2, 3, 3), 2), ((4, 1, 3, 3, 3), 1)])
def test_transposed_weights_are_stored_in_the_kernels_layout_whatever_ws_strides_suggest(shape, groups, layout):
    """The data gradient's forward twin reads its weights' copy in its kernel's layout. A weight of
    one channel per group has strides that fit either layout; its copy has K channels and fits
    one: it must be the kernel's (a copy kept in w's stride order gave dx a relative error of 0.55
    on a GPU for Conv2d(1, 3, (2, 1)) in channels-last)."""
    import numpy as np

    from reference import transposed_weights

    w = torch.randn(shape)  # packed: with one channel per group, also channels-last by its strides
    copy_ = integration.TorchFramework.transposed_weights(w, groups, layout)
    fmt = calls.memory_format(layout, w.dim())
    assert copy_.is_contiguous(memory_format=fmt)
    assert copy_.stride() == torch.empty(copy_.shape, memory_format=fmt).stride()
    np.testing.assert_array_equal(copy_.numpy(), transposed_weights(w.numpy(), groups))


OWN_LAYERS = {  # delegated layers: True where their backward can run BF beside BD (_aten_arguments)
    "conv2d": (lambda: nn.Conv2d(3, 4, 3, stride=2, padding=1, groups=1), (4, 3, 9, 8), True),
    "grouped-bias-dilated": (lambda: nn.Conv2d(4, 6, 3, padding=2, dilation=2, groups=2), (3, 4, 7, 7), True),
    "conv1d": (lambda: nn.Conv1d(3, 5, 3, padding=1, bias=False), (4, 3, 11), True),
    "conv3d": (lambda: nn.Conv3d(2, 3, (1, 3, 3), padding=(0, 1, 1)), (2, 2, 3, 5, 5), True),
    "same": (lambda: nn.Conv2d(3, 4, 3, padding="same"), (4, 3, 6, 6), False),
    "reflect": (lambda: nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect"), (4, 3, 6, 6), False),
    "transposed": (lambda: nn.ConvTranspose2d(3, 4, 3, stride=2), (4, 3, 5, 5), False),
    "unbatched": (lambda: nn.Conv2d(3, 4, 3), (3, 6, 6), False),
}


def concurrent_delegating_context(tmp_path) -> ut.Context:
    """Every layer left to torch (its kernels timed as instant), concurrent_backward on."""
    from ucudnn.plan.config import Settings

    settings = Settings.load(workspace_limit="64KiB", planning="first_call")
    return ut.Context(settings, framework=NumpyFramework(lambda problem: OwnTiming(0.0, 0)),
                      cache=Cache(tmp_path / "bench.db"), concurrent_backward=True)


@pytest.mark.parametrize("name", list(OWN_LAYERS))
def test_a_delegated_layers_concurrent_backward_runs_bf_beside_bd_with_torchs_results(name, tmp_path):
    """concurrent_backward on a layer left to torch's own convolution: its backward's BF runs on
    the side stream (operands marked there) beside BD, joined before it returns, with torch's
    results; a layer _aten_arguments cannot express runs torch's own layer as it is."""
    torch.manual_seed(0)
    make, shape, split = OWN_LAYERS[name]
    context = concurrent_delegating_context(tmp_path)
    plain = make()
    ours = ut.convert(copy.deepcopy(plain), context=context)
    x = torch.randn(shape)
    for _ in range(2):
        got = run_step(ours, x)
    assert_matches(got, run_step(plain, x))
    assert context.runs[("torch", "layer")] == 2
    framework = context.framework
    assert framework.streams == (["opened", "joined"] * 2 if split else [])
    assert len(framework.marked) == (2 * 2 if split else 0)


def test_a_delegated_layers_concurrent_backward_computes_in_autocasts_dtype(tmp_path):
    """Under autocast the layer computes in autocast's dtype as torch's does, and the weights'
    gradients come back in their own dtype."""
    torch.manual_seed(0)
    context = concurrent_delegating_context(tmp_path)
    plain = nn.Conv2d(3, 4, 3, padding=1)
    ours = ut.convert(copy.deepcopy(plain), context=context)
    x = torch.randn(2, 3, 6, 6)
    results = []
    for module in (ours, plain):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            xi = x.clone().requires_grad_()
            y = module(xi)
        y.float().sum().backward()
        results.append([y, xi.grad, module.weight.grad, module.bias.grad])
    for a, b in zip(*results):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)
    assert results[0][0].dtype == torch.bfloat16 and context.framework.streams == ["opened", "joined"]


def test_a_delegated_layer_under_no_grad_runs_torchs_own_layer_even_with_concurrent_backward(tmp_path, monkeypatch):
    """No gradients, no backward to split: inference runs torch's layer as it is."""
    context = concurrent_delegating_context(tmp_path)
    plain = nn.Conv2d(3, 4, 3)
    ours = ut.convert(copy.deepcopy(plain), context=context)
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        for _ in range(2):
            got = ours(x)
    torch.testing.assert_close(got, plain(x).detach(), rtol=0, atol=0)
    assert context.runs[("torch", "layer")] == 2
    applied, apply = [], ut_layers._OwnConvolution.apply
    monkeypatch.setattr(ut_layers._OwnConvolution, "apply", lambda *args: applied.append(1) or apply(*args))
    with torch.no_grad():
        ours(x)
    ours(x.clone().requires_grad_())
    assert applied == [1]  # the call that takes gradients only


def test_a_delegated_layer_with_one_gradient_to_take_runs_torchs_own_layer(tmp_path):
    """concurrent_backward overlaps two kernels: a frozen layer, or a first layer whose input takes
    no gradient, has one, and runs torch's layer as it is."""
    context = concurrent_delegating_context(tmp_path)
    plain = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Conv2d(4, 4, 3))
    ours = ut.convert(copy.deepcopy(plain), context=context)
    for model in (ours, plain):
        model[1].weight.requires_grad_(False)
    x = torch.randn(2, 3, 8, 8)
    for _ in range(2):
        got = run_step(ours, x)  # the input takes a gradient: the first layer splits, the frozen one not
    want = run_step(plain, x)
    assert [g is None for g in got] == [w is None for w in want]  # the frozen weight's: none
    assert_matches([g for g in got if g is not None], [w for w in want if w is not None])
    assert context.framework.streams == ["opened", "joined"] * 2
    ours(x).sum().backward()  # the input takes none: no layer splits
    assert context.framework.streams == ["opened", "joined"] * 2


@pytest.mark.parametrize("limit", ["64KiB", "auto"])
def test_training_after_a_validation_pass_is_planned_in_training_iterations(numpy_context, limit):
    """A validation pass (no grad) before training, as PyTorch Lightning's sanity check runs: the
    training layers' first site takes the lead, so they are planned at the start of the next
    training iterations, not only at the next validation pass."""
    torch.manual_seed(0)
    theirs = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1))
    ours = ut.convert(copy.deepcopy(theirs), context=numpy_context(planning=None, workspace_limit=limit, delegate=False))
    x = torch.randn(4, 3, 6, 6)
    with torch.no_grad():
        ours(x)
    for _ in range(4):
        got = run_step(ours, x)
    assert_matches(got, run_step(theirs, x))
    assert ours[0].ucudnn_context.runs["ucudnn", "BF"] > 0


@pytest.mark.parametrize("make, shape, fmt", [
    (lambda: nn.Conv1d(3, 5, 3, stride=2), (2, 3, 17), torch.contiguous_format),
    (lambda: nn.Conv2d(3, 6, 3, padding=1, groups=3), (2, 3, 9, 7), torch.channels_last),
    (lambda: nn.Conv3d(2, 4, 3, stride=(1, 2, 2)), (2, 2, 5, 9, 8), torch.contiguous_format),
    (lambda: nn.ConvTranspose2d(4, 3, 3, stride=2, output_padding=1), (3, 4, 6, 5), torch.contiguous_format),
], ids=["1d", "2d-grouped-nhwc", "3d", "transposed"])
def test_the_traced_outputs_and_the_kernels_results_agree_in_shape_and_layout(make, shape, fmt):
    """Two makers of what a layer's kernels write: convolution.output and gradient (what a traced
    graph's fake records, by site) and TorchFramework.result_for (what Planner.run gives a ucudnn
    kernel, by problem). A traced graph holds whichever the fake made, so they must agree."""
    from ucudnn.integrations.torch import convolution
    from ucudnn.integrations.torch.kernels import TorchFramework
    from ucudnn.integrations.torch.sites import signature

    module = make().to(memory_format=fmt) if fmt is torch.channels_last else make()
    converted = ut.convert(copy.deepcopy(module), context=ut.Context(framework=NumpyFramework()))
    x = torch.randn(shape).requires_grad_().contiguous(memory_format=fmt)
    site = calls.resolve(converted, x, converted.ucudnn_context, signature(converted, x))
    packed, weight, _ = calls.pack(converted, x, site.dtype, site.memory_format)
    forward, input_gradient = calls.layer_kinds(site.call.transposed)
    made = {forward: convolution.output(site, packed), input_gradient: convolution.gradient(site, packed)}
    for kind, tensor in made.items():
        result = TorchFramework.result_for(site.call.problem(kind), packed)
        assert (result.shape, result.stride(), result.dtype) == (tensor.shape, tensor.stride(), tensor.dtype), kind
