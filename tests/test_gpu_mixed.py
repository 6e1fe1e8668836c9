"""GPU: configurations whose parts run on both backends. Sums over micro-batches (backward
filter) and blends (alpha, beta) belong to dispatch, whatever backend runs each part
(ucudnn.core.accumulation), so every configuration the optimizers could produce must equal the
undivided call within the dtype's bound against float64:

- through ucudnn.Handle: random configurations drawn from the candidates both backends list,
  parts mixed at random, odd tails, fp32/fp16/bf16, NCHW/NHWC, F/BD/BF, alpha and beta; each run
  directly, then captured and replayed as a CUDA graph;
- through ucudnn.torch: random layers and odd batches whose kernels are given random mixed
  configurations, then the layers of docs/results.md's report as the optimizer plans them, and
  torchvision's ResNet-18 (AMP, channels_last, B = 61, every layer through ucudnn at 8 MiB)."""
from __future__ import annotations

import json
import os
import shutil
import zlib

import numpy as np
import pytest

from ucudnn.core.problem import ConvKind, ConvProblem

from gpu_support import OUTPUT, as_float64, bound_for, expected, host_operands, measured, relative_error

try:
    import torch
except ImportError:  # the handle's tests need no torch
    torch = None
if torch is not None and torch.cuda.is_available():
    torch.backends.cudnn.version()  # torch's libcudnn first, so ucudnn binds the same library

pytestmark = pytest.mark.gpu
# the dtype's bound on ||out - ref|| / ||ref|| (tests/test_gpu_engines.py says why); fp32 at default math (TF32)
BOUND = {"float32": 2e-3, "float16": 1e-2, "bfloat16": 8e-2}
SHAPES_PER_CASE = int(os.environ.get("UCUDNN_MIXED_TEST_SHAPES", "4"))
RESULTS: list[dict] = []


def candidates(backends, problem: ConvProblem) -> dict[str, list[str]]:
    """The candidates of each backend that can run micro-batch kernel `problem`: legacy algorithms
    cuDNN's heuristics list as supported, engine plans that build."""
    from ucudnn.execute.backends import candidate_id
    from ucudnn.execute.backends.legacy import legacy_id
    from ucudnn.execute.bindings.convolution import get_algorithms

    legacy = backends["legacy"]
    descs = legacy.executor.descriptors(problem)
    found = {"legacy": [legacy_id(problem.kind, perf.algo) for perf in
                        get_algorithms(legacy.handle, problem.kind, descs) if perf.status == 0]}
    graph = backends["engines"].graph(problem)
    found["engines"] = [candidate_id("engines", n) for n in graph.index if not isinstance(graph.build(n), str)]
    return {backend: ids for backend, ids in found.items() if ids}


def random_problem(rng: np.random.Generator, kind: ConvKind, dtype: str, layout: str) -> ConvProblem:
    """A 2-D kernel whose samples are 256-byte multiples (any part may start anywhere, aligned, as
    the optimizers plan them), an odd batch, random kernel size, stride, dilation and groups."""
    groups = int(rng.choice([1, 1, 2]))
    c, k = groups * int(rng.choice([8, 16])), groups * int(rng.choice([8, 16, 32]))
    kernel, stride, dilation = int(rng.choice([1, 3, 5])), int(rng.integers(1, 3)), int(rng.integers(1, 3))
    pad = dilation * (kernel - 1) // 2
    return ConvProblem(kind, (int(rng.choice([13, 33, 61])), c, 16, 16), (k, c // groups, kernel, kernel),
                       pads=pad, strides=stride, dilations=dilation, groups=groups, dtype=dtype, layout=layout)


def mixed_parts(rng: np.random.Generator, backends, problem: ConvProblem) -> list[tuple[str, int]]:
    """2 to 5 parts at random cut points, each on a backend drawn at random (alternating where
    the draw would give one backend only), with a random candidate of it."""
    count = int(rng.integers(2, min(5, problem.batch) + 1))
    cuts = sorted(rng.choice(np.arange(1, problem.batch), count - 1, replace=False))
    sizes = [int(b) for b in np.diff([0, *cuts, problem.batch])]
    choices = [candidates(backends, problem.with_batch(b)) for b in sizes]
    names = [str(rng.choice(sorted(c))) for c in choices]
    if len(set(names)) == 1 and all(len(c) == 2 for c in choices):
        names[-1] = next(n for n in choices[-1] if n != names[0])
    return [(str(rng.choice(choices[i][name])), b) for i, (name, b) in enumerate(zip(names, sizes))]


def is_mixed(configuration) -> bool:
    return len({m.algo.split(":")[0] for m in configuration.micro}) > 1


@pytest.fixture(scope="module", autouse=True)
def results_file():
    """Every checked configuration and its errors, into UCUDNN_RESULTS_DIR at the end."""
    yield
    if os.environ.get("UCUDNN_RESULTS_DIR") and RESULTS:
        with open(os.path.join(os.environ["UCUDNN_RESULTS_DIR"], "mixed_configurations.json"), "w") as f:
            json.dump(RESULTS, f, indent=1)


@pytest.fixture(scope="module")
def handle():
    pytest.importorskip("cudnn", reason="nvidia-cudnn-frontend is not installed")
    from ucudnn import Handle
    from ucudnn.measure.cache import Cache

    with Handle(backend="all", cache=Cache(use_file=False)) as h:
        yield h


@pytest.mark.parametrize("kind", list(ConvKind), ids=str)
@pytest.mark.parametrize("dtype", list(BOUND))
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_mixed_configurations_through_the_handle_equal_float64(handle, kind, dtype, layout):
    """Each configuration run directly, then captured, then replayed: three runs on the same
    buffers, the operands restored before each, every result within the bound."""
    import cupy as cp

    from ucudnn.execute import gpu

    rng = np.random.default_rng(zlib.crc32(f"mixed{kind}{dtype}{layout}".encode()))
    worst, mixed = 0.0, 0
    for _ in range(SHAPES_PER_CASE):
        problem = random_problem(rng, kind, dtype, layout)
        configuration = measured(handle.backends, problem, mixed_parts(rng, handle.backends, problem))
        alpha, beta = [(1.0, 0.0), (float(rng.uniform(0.5, 2)), float(rng.uniform(-1, 1)))][int(rng.integers(2))]
        host = host_operands(rng, problem)
        want = expected(problem, host, alpha, beta)
        bound = bound_for(kind, [m.algo for m in configuration.micro], BOUND[dtype])
        program = handle.program(problem, configuration, alpha, beta)
        device = {role: cp.asarray(array) for role, array in host.items()}
        workspace = gpu.alloc(max(configuration.workspace, 1))
        errors = []
        for _ in range(3):  # direct, capture (and launch), replay
            for role, array in host.items():
                device[role].set(array)
            program(*(device[r].data.ptr for r in "xwy"), workspace.ptr, configuration.workspace)
            cp.cuda.get_current_stream().synchronize()
            errors.append(relative_error(as_float64(cp.asnumpy(device[OUTPUT[kind]]), dtype), want))
        mixed += is_mixed(configuration)
        worst = max(worst, *errors)
        RESULTS.append(dict(path="handle", problem=problem.describe(), configuration=configuration.describe(),
                            mixed=is_mixed(configuration), alpha=alpha, beta=beta, errors=errors, bound=bound))
        assert max(errors) <= bound, (f"{problem.describe()} {configuration.describe()} alpha={alpha} "
                                      f"beta={beta}: errors {errors} (direct, capture, replay) > {bound:.0e}")
    print(f"handle {kind} {dtype} {layout}: {SHAPES_PER_CASE} configurations, {mixed} mixed, worst {worst:.2e}")


# --- through ucudnn.torch ------------------------------------------------------------------------

def need_torch_gpu():
    if torch is None or not torch.cuda.is_available():
        pytest.skip("needs torch with a CUDA device")


def _step(module, x, dy):
    xi = x.detach().clone().requires_grad_()
    y = module(xi)
    y.backward(dy)
    out = [y.detach(), xi.grad, module.weight.grad]
    module.zero_grad(set_to_none=True)
    return out


def _error(got, want) -> float:
    got = got.double()
    return float("inf") if not torch.isfinite(got).all() else ((got - want).norm() / want.norm().clamp_min(1e-30)).item()


def _compare(theirs, ours, x, dy) -> dict:
    """Relative errors of ucudnn's and torch's y, dx, dw against a float64 copy of the layer."""
    import copy

    ref = _step(copy.deepcopy(theirs).double(), x.double(), dy.double())
    got, torchs = _step(ours, x, dy), _step(theirs, x, dy)
    return {name: (_error(g, r), _error(t, r)) for name, g, t, r in zip(("y", "dx", "dw"), got, torchs, ref)}


def _configurations(context) -> dict[str, str]:
    return {k["kind"]: k.get("configuration", k["via"]) for k in context.summary()["kernels"]}


@pytest.mark.parametrize("seed", range(8))
def test_mixed_configurations_through_ucudnn_torch_equal_float64(seed, monkeypatch, tmp_path):
    """Random layers whose every kernel is given a random configuration mixing both backends:
    y, dx and dw within the dtype's bound (or 4x torch's own error) of float64."""
    need_torch_gpu()
    import copy

    import ucudnn.torch as ut
    from ucudnn.execute import gpu
    from ucudnn.execute.backends import open_backends
    from ucudnn.execute.bindings import cudnn
    from ucudnn.plan import assignment

    rng = np.random.default_rng(1000 + seed)
    dtype = [torch.float32, torch.float16, torch.bfloat16][seed % 3]
    torch.backends.cudnn.allow_tf32 = True
    cudnn_handle = cudnn.create_handle()
    backends = open_backends("all", cudnn_handle, gpu.current_stream())
    monkeypatch.setattr(assignment.Assignments, "_optimize_wr",
                        lambda self, problem, limit, measure=None: measured(backends, problem, mixed_parts(rng, backends, problem)))
    probe = random_problem(rng, ConvKind.FORWARD, "float32", "nchw")
    layer = torch.nn.Conv2d(probe.x_shape[1], probe.w_shape[0], probe.w_shape[2], probe.strides, probe.pads,
                            probe.dilations, probe.groups, bias=False, device="cuda", dtype=dtype)
    x = torch.randn(*probe.x_shape, device="cuda", dtype=dtype)
    if rng.integers(2):
        layer, x = layer.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    context = ut.Context(cache_path=str(tmp_path / "bench.db"), delegate=False, planning="first_call")
    ours = ut.convert(copy.deepcopy(layer), context=context)
    with torch.no_grad():
        dy = torch.randn_like(layer(x))
    errors = _compare(layer, ours, x, dy)
    configurations = _configurations(context)
    name = str(dtype).split(".")[-1]
    RESULTS.append(dict(path="torch", layer=str(layer), x=list(x.shape), dtype=name, errors=errors,
                        configurations=configurations))
    print(f"torch {layer} x={tuple(x.shape)} {name}: {errors} {configurations}")
    for what, (ours_error, torchs) in errors.items():
        assert ours_error <= max(BOUND[name], 4 * torchs), (what, errors, configurations)
    assert {kind for via, kind in context.runs if via == "ucudnn"} == {"F", "BD", "BF"}
    cudnn.destroy_handle(cudnn_handle)


def _shipped_cache(tmp_path) -> str:
    """A copy of the shipped recording: layers it covers plan without measuring again."""
    from ucudnn.measure.cache.paths import recorded_path

    path = tmp_path / "bench.db"
    shutil.copy(recorded_path(), path)
    return str(path)


# the layers of the report, as the optimizer plans them at 8 MiB: (layer, batch, dtype, channels_last)
REPORTED = [
    ((3, 64, 7, 2, 3, 224), 61, "float16", True),
    ((3, 64, 7, 2, 3, 224), 33, "float16", True),
    ((3, 64, 7, 2, 3, 224), 61, "float16", False),
    ((3, 64, 7, 2, 3, 224), 61, "bfloat16", True),
    ((64, 64, 3, 1, 1, 56), 61, "float16", False),
    ((64, 64, 3, 1, 1, 56), 61, "bfloat16", False),
]


@pytest.mark.parametrize("delegate", [False, True], ids=["ucudnn", "delegating"])
@pytest.mark.parametrize("case", REPORTED, ids=lambda c: f"{c[0][0]}-{c[0][1]}k{c[0][2]}-B{c[1]}-{c[2]}-{'nhwc' if c[3] else 'nchw'}")
def test_the_reported_layers_have_torchs_accuracy(case, delegate, tmp_path):
    """dw within 3x of torch's own error against float64 (and y, dx as they were)."""
    need_torch_gpu()
    import copy

    import ucudnn.torch as ut

    (cin, cout, kernel, stride, pad, size), batch, name, channels_last = case
    dtype = getattr(torch, name)
    torch.manual_seed(0)
    layer = torch.nn.Conv2d(cin, cout, kernel, stride, pad, bias=False, device="cuda", dtype=dtype)
    x = torch.randn(batch, cin, size, size, device="cuda", dtype=dtype)
    if channels_last:
        layer, x = layer.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    context = ut.Context(cache_path=_shipped_cache(tmp_path), workspace_limit="8MiB", delegate=delegate,
                         planning="first_call")
    ours = ut.convert(copy.deepcopy(layer), context=context)
    with torch.no_grad():
        dy = torch.randn_like(layer(x))
    errors = _compare(layer, ours, x, dy)
    configurations = _configurations(context)
    RESULTS.append(dict(path="reported", case=str(case), delegate=delegate, errors=errors,
                        configurations=configurations))
    print(f"reported {case} delegate={delegate}: dw {errors['dw'][0]:.2e} (torch {errors['dw'][1]:.2e}); "
          f"BF {configurations.get('BF')}")
    for what, (ours_error, torchs) in errors.items():
        assert ours_error <= max(3 * torchs, 1e-3), (what, errors, configurations)


def test_resnet18_amp_channels_last_odd_batch_every_layer_through_ucudnn(tmp_path):
    """Every conv weight gradient of one AMP step (the loss scaled as GradScaler scales it, so
    that half-precision gradients do not underflow) within 3x of torch's own error against a
    float64 copy of the model, with fp16's bound as the floor."""
    import copy

    import ucudnn.torch as ut

    need_torch_gpu()
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).cuda().to(memory_format=torch.channels_last)
    x = torch.randn(61, 3, 224, 224, device="cuda").contiguous(memory_format=torch.channels_last)
    target = torch.randint(0, 1000, (61,), device="cuda")
    context = ut.Context(cache_path=_shipped_cache(tmp_path), workspace_limit="8MiB", delegate=False,
                         planning="first_call")
    ours = ut.convert(copy.deepcopy(model), context=context)
    reference = copy.deepcopy(model).double()
    scale = 2.0**14
    grads = {}
    for name, m in (("torch", model), ("ucudnn", ours)):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(m(x), target)
        (loss * scale).backward()
        grads[name] = {n: p.grad.double() / scale for n, p in m.named_parameters() if p.dim() == 4}
    torch.nn.functional.cross_entropy(reference(x.double()), target).backward()
    want = {n: p.grad for n, p in reference.named_parameters() if p.dim() == 4}
    rows = sorted(((_error(grads["ucudnn"][n], w), _error(grads["torch"][n], w), _error(grads["ucudnn"][n],
                    grads["torch"][n]), n) for n, w in want.items()), key=lambda r: r[0] / max(r[1], 1e-2))
    bf = [k.get("configuration", "") for k in context.summary()["kernels"] if k["kind"] == "BF"]
    mixed = sum(1 for c in bf if "legacy" in c and "engines" in c)
    split = sum(1 for c in bf if "+" in c or not c.startswith("1 x"))
    worst = rows[-1]
    RESULTS.append(dict(path="resnet18", worst_layer=worst[3], ucudnn=worst[0], torch=worst[1], bf_kernels=len(bf),
                        bf_split=split, bf_mixed=mixed,
                        layers=[dict(layer=n, ucudnn=u, torch=t, ucudnn_vs_torch=d) for u, t, d, n in rows]))
    print(f"ResNet-18 AMP B=61 at 8 MiB: {len(rows)} conv weights; BF kernels {len(bf)}, {split} micro-batched, "
          f"{mixed} mixed; worst layer {worst[3]}: ucudnn {worst[0]:.2e} against torch's {worst[1]:.2e} "
          f"(ucudnn vs torch {worst[2]:.2e})")
    assert {kind for via, kind in context.runs if via == "ucudnn"} == {"F", "BD", "BF"}
    for ours_error, torchs, _, name in rows:
        assert ours_error <= max(3 * torchs, BOUND["float16"]), (name, ours_error, torchs)


# --- every candidate on kernels whose reduction is long --------------------------------------------

# kernels whose sums run long (batch x image for dw, channels x window for dx): a candidate that
# accumulates partial sums in the output's half type shows there, never on the small random shapes
# above; each (layer, batch) in each half type, through each candidate alone on the whole batch
LONG_REDUCTIONS = [((64, 64, 3, 1, 1, 56), 61), ((256, 256, 3, 1, 1, 14), 64), ((1024, 256, 1, 1, 0, 14), 64)]


def _torch_kernel(kind: ConvKind, x, w, dy, problem: ConvProblem):
    """The output of `kind` computed by torch (its own cuDNN pick, or float64 where given float64)."""
    grad = torch.nn.grad
    if kind == ConvKind.BACKWARD_DATA:
        return grad.conv2d_input(x.shape, w, dy, problem.strides, problem.pads)
    return grad.conv2d_weight(x, w.shape, dy, problem.strides, problem.pads)


def _run_alone(handle, problem: ConvProblem, candidate: str, operands: dict):
    """The output of `problem` run by `candidate` alone on the whole batch (beta = 0)."""
    configuration = measured(handle.backends, problem, [(candidate, problem.batch)])
    out = torch.empty_like(operands[OUTPUT[problem.kind]])
    buffers = {**operands, OUTPUT[problem.kind]: out}
    workspace = torch.empty(max(configuration.workspace, 1), dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    handle.program(problem, configuration)(*(buffers[r].data_ptr() for r in "xwy"), workspace.data_ptr(),
                                           configuration.workspace)
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("kind", [ConvKind.BACKWARD_DATA, ConvKind.BACKWARD_FILTER], ids=str)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("case", LONG_REDUCTIONS, ids=lambda c: f"{c[0][0]}-{c[0][1]}k{c[0][2]}-B{c[1]}")
def test_every_candidate_offered_on_a_long_half_precision_sum_has_torchs_accuracy(handle, kind, dtype, case):
    """Each candidate a backend offers (ranked, and builds) within max(4x torch's own error,
    1e-3) of float64 (ucudnn.core.accuracy's bar); legacy algorithms cuDNN supports but the backend
    holds back are run too, and their errors printed, as the evidence for holding them back."""
    need_torch_gpu()
    from ucudnn.core.measurements import OK
    from ucudnn.execute.backends.legacy import legacy_id
    from ucudnn.execute.bindings.convolution import get_algorithms

    (cin, cout, k, stride, pad, size), batch = case
    problem = ConvProblem(kind, (batch, cin, size, size), (cout, cin, k, k), pads=pad, strides=stride, dtype=dtype)
    generator = torch.Generator(device="cuda").manual_seed(0)
    half = getattr(torch, dtype)
    operands = {r: torch.randn(s, device="cuda", generator=generator).to(half)
                for r, s in (("x", problem.x_shape), ("w", problem.w_shape), ("y", problem.y_shape))}
    exact = _torch_kernel(kind, *(operands[r].double() for r in "xwy"), problem)
    torchs = _error(_torch_kernel(kind, *(operands[r] for r in "xwy"), problem), exact)
    bound = max(4 * torchs, 1e-3)
    offered = [c for name in handle.backends.names for c in handle.backends[name].ranked(problem)
               if handle.backends[name].candidate(problem, c).status == OK]
    legacy = handle.backends["legacy"]
    supported = [legacy_id(kind, p.algo) for p in get_algorithms(legacy.handle, kind, legacy.executor.descriptors(problem))
                 if p.status == 0]
    errors = {c: _error(_run_alone(handle, problem, c, operands), exact) for c in dict.fromkeys(offered + supported)}
    held_back = {c: e for c, e in errors.items() if c not in offered}
    RESULTS.append(dict(path="long", problem=problem.describe(), torch=torchs, errors=errors, held_back=sorted(held_back)))
    print(f"long {problem.describe()}: torch {torchs:.2e}; offered worst "
          f"{max(e for c, e in errors.items() if c in offered):.2e}; held back "
          f"{ {c: f'{e:.1e}' for c, e in held_back.items()} }; over {bound:.1e}: "
          f"{ {c: f'{e:.1e}' for c, e in errors.items() if e > bound} }")
    assert not {c: e for c, e in errors.items() if c in offered and e > bound}, (problem.describe(), torchs, errors)
