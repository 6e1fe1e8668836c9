"""The converted layers (Conv1d, Conv2d, Conv3d, ConvTranspose1d/2d/3d and their autograd Function) and converting models."""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from ...core.errors import ConfigError
from ...core.fallback import fall_back, say_once
from ...plan.framework import LAYER
from . import convolution
from .call import aligned, compute_dtype, pack, resolve, spatial_dims, unpacked
from .context import Context, default_context
from .kernels import TorchFramework
from .pool import is_out_of_memory
from .sites import Site, Steady, signature

if TYPE_CHECKING:  # Converted comes before one of torch's convolution layers in its classes' MRO
    from torch.nn.modules.conv import _ConvNd as _Layer
else:
    _Layer = object

_is_compiling = torch.compiler.is_compiling  # True while torch.compile or torch.export traces
RETIRE_AFTER = 2  # steady calls in a row after which a delegated layer is torch's own again (Context.retire)


def _traced():
    """ucudnn.integrations.torch.traced, imported by the first traced call: it loads torch._dynamo
    (about a second, and 127,000 objects that every full garbage collection of the training
    process then walks), which an eager process never needs."""
    from . import traced
    return traced


class _Convolution(torch.autograd.Function):
    """out = layer(input, w) + b with its kernels through ucudnn (convolution.py) on operands
    pack() made, the input aligned for slicing and kept for the backward."""

    @staticmethod
    def forward(ctx, input: Tensor, weight: Tensor, bias: Tensor | None, context: Context, site: Site) -> Tensor:
        input = aligned(input, site.memory_format)
        ctx.save_for_backward(input, weight)
        ctx.context, ctx.site, ctx.has_bias = context, site, bias is not None
        return convolution.forward(context, site, input, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out: Tensor):
        input, weight = ctx.saved_tensors
        d_input, dw = convolution.backward(ctx.context, ctx.site, input, weight, d_out, ctx.needs_input_grad[0],
                                           ctx.needs_input_grad[1])
        return d_input, dw, convolution.bias_gradient(ctx, d_out), None, None


class _OwnConvolution(torch.autograd.Function):
    """torch's own convolution of a delegated layer, as torch's layer runs it (aten.convolution
    with the layer's `arguments`), whose backward runs BF beside BD as a converted layer's does
    (Context.beside): concurrent_backward for the layers ucudnn leaves to torch."""

    @staticmethod
    def forward(ctx, input: Tensor, weight: Tensor, bias: Tensor | None, arguments: tuple, context: Context) -> Tensor:
        ctx.save_for_backward(input, weight)
        ctx.arguments, ctx.context, ctx.has_bias = arguments, context, bias is not None
        return torch.ops.aten.convolution(input, weight, bias, *arguments)

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out: Tensor):
        input, weight = ctx.saved_tensors
        d_input = dw = None

        def kernel(mask: list[bool], index: int) -> Tensor:
            return torch.ops.aten.convolution_backward(d_out, input, weight, None, *ctx.arguments, mask)[index]
        with ctx.context.beside(input.device) as aside:
            if ctx.needs_input_grad[1]:
                with aside(input, d_out):
                    dw = kernel([False, True, False], 1)
            if ctx.needs_input_grad[0]:
                d_input = kernel([True, False, False], 0)
        if dw is not None and dw.is_cuda:  # made on the side stream, read on this one from here on
            dw.record_stream(torch.cuda.current_stream(dw.device))
        return d_input, dw, convolution.bias_gradient(ctx, d_out), None, None


AtenArguments = tuple[list[int], list[int], list[int], bool, list[int], int]  # stride, padding, ..., groups


def _aten_arguments(module: _Layer, input: Tensor) -> AtenArguments | None:
    """aten.convolution's arguments after (input, weight, bias) for the layer's own convolution:
    a batched call of a convolution (not transposed) with explicit zero padding; None otherwise."""
    dims, padding = spatial_dims(module), module.padding
    if module.transposed or module.padding_mode != "zeros" or isinstance(padding, str) or input.dim() != dims + 2:
        return None
    return (list(module.stride), list(padding), list(module.dilation), False, [0] * dims, module.groups)


class Converted(_Layer):
    """What a converted layer adds to torch's layer (the class after it in the MRO: nn.Conv1d,
    nn.Conv2d or nn.Conv3d): its convolutions run micro-batched through ucudnn; same constructor,
    parameters and state_dict. Its `ucudnn_context` (set by convert(); else default_context()) holds the
    settings and plans; `torch_class` is the torch class it converts (twin_of)."""

    ucudnn_context: Context | None = None
    torch_class: type[nn.Module] = nn.Module
    _ucudnn_steady: Steady | None = None  # the last call, where it ran torch's layer with nothing to decide

    def forward(self, input: Tensor) -> Tensor:
        if _is_compiling():  # a traced graph holds torch's layer or ucudnn's op (traced.py)
            traced = _traced()
            if torch.compiler.is_dynamo_compiling() and not traced.sizes_known(input):
                return traced.eager(self, input)
            decided = traced.decision(self, input)
            return super().forward(input) if decided is None else traced.run(self, input, decided)
        steady = self._ucudnn_steady  # a layer left to torch runs torch's layer at once (sites.Steady)
        if steady is not None and steady.holds(self, input):
            steady.runs[steady.counted] += 1
            steady.held += 1
            out = super().forward(input)
            if steady.held == RETIRE_AFTER and steady.owner is not None:  # convert() made it: torch's class to return to
                steady.owner.retire(self)
            return out
        return self._forward(input)

    def _forward(self, input: Tensor) -> Tensor:
        context = self.ucudnn_context or default_context()
        site = resolve(self, input, context, signature(self, input))
        if isinstance(site, str):
            context.fallbacks[site] += 1
            fall_back(TorchFramework.own, site)
        if not isinstance(site, Site):
            return super().forward(input)
        if context.learn_call(self):
            context.planner.record(site.call, site.kinds)
            return super().forward(input)
        delegated = context.planner.route(site)
        context.saw(self, site)
        if delegated:
            if site.steady and "weight" in self._parameters and not context.options.concurrent_backward:
                self._ucudnn_steady = Steady(self, input, site, context.runs, (context.framework.own, LAYER))
            out = self._own_forward_waiting(input, context, site) if context.planner.waits(site) else \
                self._own_forward(input, context)
            if context.planner.observing(site):  # its moments (ucudnn.plan.memory) and its kernels' time in the step
                context.planner.observed_end(site, site.kinds[:1])
                if out.requires_grad:
                    out.register_hook(functools.partial(_backward_starts, context, site))
                    _when_backward_ends(self, input, functools.partial(context.planner.observed_end, site, site.kinds[1:]))
            return out
        return self._through_ucudnn(input, context, site)

    def _own_forward_waiting(self, input: Tensor, context: Context, site: Site) -> Tensor:
        """torch's own forward of a layer waiting for its plan, as torch's layer runs it (its
        kernels' moments and time in the step are what the plan is made from); where it runs out
        of device memory, the call through the Planner, which runs ucudnn's kernel within what
        is free in its place (Planner.run); once the device has run out of memory, through the
        Planner at once."""
        if context.planner.pressed:
            return self._through_ucudnn(input, context, site)
        try:
            return self._own_forward(input, context)
        except RuntimeError as exc:  # torch.cuda.OutOfMemoryError is one
            if not is_out_of_memory(exc):
                raise
        return self._through_ucudnn(input, context, site)

    def _through_ucudnn(self, input: Tensor, context: Context, site: Site) -> Tensor:
        """The layer's convolution with each kernel run by the Planner (Planner.run)."""
        x, weight, bias = pack(self, input, site.dtype, site.memory_format)
        return unpacked(self, input, _Convolution.apply(x, weight, bias, context, site))

    def _apply(self, fn: Callable, recurse: bool = True) -> nn.Module:
        """nn.Module._apply (to(), cuda(), half(), channels_last, ...) may change the weight's
        dtype, device or strides: the layer's next call is examined afresh (sites.Steady)."""
        self._ucudnn_steady = None
        return super()._apply(fn, recurse)

    def __getstate__(self) -> dict:
        """What pickling and copy.deepcopy keep: the module's state without its last call's site
        (plans and handles, which belong to the running process and its Context)."""
        state = super().__getstate__()
        state.pop("_ucudnn_steady", None)
        return state

    def _own_forward(self, input: Tensor, context: Context) -> Tensor:
        """torch's own convolution of the layer (delegated); with concurrent_backward where both
        the input and the weight take gradients (two kernels to overlap) and _aten_arguments has
        the call's, through _OwnConvolution (BF beside BD), in the dtype autocast picks."""
        both = torch.is_grad_enabled() and input.requires_grad and self.weight.requires_grad
        arguments = _aten_arguments(self, input) if context.options.concurrent_backward and both else None
        if arguments is None:
            return super().forward(input)
        dtype, _ = compute_dtype(input)
        bias = None if self.bias is None else self.bias.to(dtype)
        with torch.autocast(input.device.type, enabled=False):
            return _OwnConvolution.apply(input.to(dtype), self.weight.to(dtype), bias, arguments, context)

    def extra_repr(self) -> str:
        context = self.ucudnn_context or default_context()
        return f"{super().extra_repr()}, ucudnn={context.settings.optimizer}@{context.limit_name}"


def _backward_starts(context: Context, site: Site, grad: Tensor) -> None:
    """A hook on a delegated layer's output, whose gradient is ready: the layer's backward kernels start."""
    context.planner.observe(site, site.kinds[1:])


def _when_backward_ends(module: nn.Module, input: Tensor, ended: Callable[[], None]) -> None:
    """Call ended() once, as the layer's backward kernels have been queued: as its weight's
    gradient is accumulated (the autograd engine runs that before any other node), else as its
    input's gradient is complete (after any other branch the input feeds)."""
    weight = module._parameters.get("weight")
    if weight is not None and weight.requires_grad:
        handles: list[torch.utils.hooks.RemovableHandle] = []

        def accumulated(_: Tensor) -> None:
            handles.pop().remove()
            ended()
        handles.append(weight.register_post_accumulate_grad_hook(accumulated))
    elif input.requires_grad:
        input.register_hook(lambda grad: ended())


class Conv2d(Converted, nn.Conv2d):
    """torch.nn.Conv2d whose convolutions run micro-batched through ucudnn (Converted)."""


class Conv1d(Converted, nn.Conv1d):
    """torch.nn.Conv1d whose convolutions run micro-batched through ucudnn (Converted), as 2-D
    convolutions of height 1, as torch runs them."""


class Conv3d(Converted, nn.Conv3d):
    """torch.nn.Conv3d whose convolutions run micro-batched through ucudnn (Converted), on
    channels_last_3d tensors where torch would."""


class ConvertedTranspose(Converted):
    """A converted transposed layer (nn.ConvTranspose1d, 2d, 3d): the convolution it transposes
    run backwards through ucudnn (its forward that convolution's BD, its input's gradient F, its
    weight's BF), output_padding included. A call given `output_size` runs torch's own layer,
    with a one-time warning."""

    def forward(self, input: Tensor, output_size: list[int] | None = None) -> Tensor:
        if output_size is not None:
            fall_back(TorchFramework.own, "a transposed layer called with output_size= runs torch's own "
                      "convolution (ucudnn runs the layer's own output_padding); set output_padding on the layer "
                      "instead")
            return super(Converted, self).forward(input, output_size)
        return super().forward(input)


class ConvTranspose1d(ConvertedTranspose, nn.ConvTranspose1d):
    """torch.nn.ConvTranspose1d through ucudnn (ConvertedTranspose), as 2-D of height 1."""


class ConvTranspose2d(ConvertedTranspose, nn.ConvTranspose2d):
    """torch.nn.ConvTranspose2d through ucudnn (ConvertedTranspose)."""


class ConvTranspose3d(ConvertedTranspose, nn.ConvTranspose3d):
    """torch.nn.ConvTranspose3d through ucudnn (ConvertedTranspose)."""


# Every torch layer ucudnn runs, and its converted twin: what convert() turns them into, in place
TWINS: dict[type[nn.Module], type[Converted]] = {
    nn.Conv1d: Conv1d, nn.Conv2d: Conv2d, nn.Conv3d: Conv3d, nn.ConvTranspose1d: ConvTranspose1d,
    nn.ConvTranspose2d: ConvTranspose2d, nn.ConvTranspose3d: ConvTranspose3d}
for _torch_class, _twin in TWINS.items():
    _twin.torch_class = _torch_class


# --- converting models -----------------------------------------------------------------------------

_SUBCLASS_TWINS: dict[type, type] = {}  # a subclass of a TWINS layer that keeps torch's forward -> its twin


def twin_of(cls: type) -> type | None:
    """The converted class of a torch layer class: its TWINS entry; for a subclass (torchvision's
    Conv3DSimple) that keeps its base's forward and _conv_forward, a twin made once that runs
    before the subclass in the MRO (its own methods and attributes stay); None for a subclass
    that changes forward (weight standardization, dynamic padding): ucudnn would not run what it
    computes."""
    if cls in TWINS:
        return TWINS[cls]
    base = next((b for b in cls.__mro__ if b in TWINS), None)
    if base is None or any(getattr(cls, name) is not getattr(base, name) for name in ("forward", "_conv_forward")):
        return None
    if cls not in _SUBCLASS_TWINS:
        _SUBCLASS_TWINS[cls] = type(cls.__name__, (TWINS[base], cls), {"__module__": cls.__module__, "torch_class": cls})
    return _SUBCLASS_TWINS[cls]


def convert(model: nn.Module, workspace_limit: int | str | None = None, optimizer: str | None = None,
            policy: str | None = None, total_limit: int | str | None = None, *, sample_input: Any = None,
            cache_path: str | None = None, execution: str | None = None, planning: str | None = None,
            context: Context | None = None, delegate: bool = True, concurrent_backward: bool | None = None) -> nn.Module:
    """Turn every torch.nn.Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d and
    ConvTranspose3d of `model` (nested ones too, and `model` itself) into its ucudnn twin (TWINS:
    ucudnn.torch.Conv2d, ...) in place, and return `model`.

    Layers keep their identity, parameters, hooks and state_dict (only their class changes), so
    an optimizer made before still works. Settings: `workspace_limit` per kernel (WR): "auto"
    (the default: each kernel within what its moment in the training step leaves free, observed
    over a layer's first calls, see ucudnn.plan.memory) or a size such as "64MiB"; `optimizer` "wr" or
    "wd", `policy` "powerOfTwo" | "all" | "undivided", `total_limit` for WD (default:
    workspace_limit x kernels; "auto": as workspace_limit="auto", which is WD's division when
    kernels run one at a time, see ucudnn.plan.memory), `cache_path` for the benchmark
    database, `execution` "graph" (calls replayed as CUDA graphs once a layer's buffers repeat)
    or "direct", `planning` "between_iterations" (the default: every layer runs torch's own
    convolution until planned, nothing timed in the first iteration; about a second of planning,
    but at least one layer, at the start of each later iteration; Context.plan_pending() plans the
    rest at once) or "first_call" (a layer is planned on its first call, which waits for it); None takes UCUDNN_* variables, then defaults. `sample_input` (a tensor, or a tuple
    of positional arguments) runs one pass with torch's convolutions in which every layer records
    its kernels; then they are planned (WD: solved once). Run it under the autocast and grad mode
    of training. `delegate`: under WR, layers whose kernels ucudnn would not speed up (torch's
    own fit the limit and are about as fast) run torch's own convolution, which costs less host
    time (see ucudnn.plan.delegation); False runs every layer through ucudnn. A layer left to
    torch whose calls hold steady takes torch's class back (Context.retire: it then costs what
    torch's layer costs) until the model's calls change or the context is reset.
    `concurrent_backward` (None: UCUDNN_CONCURRENT_BACKWARD, else off): each layer's BF on a side
    stream beside its BD (Context.beside). Subclasses of those layers are left alone (they may change forward)."""
    given = (workspace_limit, optimizer, policy, total_limit, cache_path, execution, planning, concurrent_backward)
    if context is not None and (any(v is not None for v in given) or not delegate):
        raise ConfigError("pass either context= or settings (workspace_limit, optimizer, delegate, ...) "
                          "to convert(), not both")
    context = context or Context(workspace_limit=workspace_limit, optimizer=optimizer, policy=policy,
                                 total_limit=total_limit, cache_path=cache_path, execution=execution,
                                 planning=planning, delegate=delegate, concurrent_backward=concurrent_backward)
    skipped = set()
    for module in model.modules():
        if isinstance(module, tuple(TWINS)) and not isinstance(module, Converted):
            twin = twin_of(type(module))
            if twin is None:
                skipped.add(type(module).__qualname__)
                continue
            module.__class__ = twin
        if isinstance(module, Converted):
            module.ucudnn_context = context
    if skipped:
        say_once(f"ucudnn.torch.convert left subclasses of {', '.join(c.__name__ for c in TWINS)} that "
                 f"change forward unconverted: {', '.join(sorted(skipped))}")
    if sample_input is not None:
        with network(model):
            model(*(sample_input if isinstance(sample_input, tuple) else (sample_input,)))
    return model


def _contexts(model: nn.Module) -> list[Context]:
    """The contexts of the model's converted layers, retired ones (torch's class again) included."""
    found = {}
    for module in model.modules():
        if isinstance(module, Converted):
            context = module.ucudnn_context or default_context()
        elif isinstance(module, tuple(TWINS)) and isinstance(module.__dict__.get("ucudnn_context"), Context):
            context = module.__dict__["ucudnn_context"]
        else:
            continue
        found[id(context)] = context
    return list(found.values())


def context_of(model: nn.Module) -> Context:
    """The Context that `model`'s converted layers share (its summary(), runs, reset()):
    ConfigError where the model has no converted layer, or layers of more than one Context."""
    contexts = _contexts(model)
    if len(contexts) != 1:
        raise ConfigError(f"{type(model).__name__} has converted layers of {len(contexts)} ucudnn contexts; "
                          "context_of needs exactly one (ucudnn.torch.convert(model) gives every layer the same)")
    return contexts[0]


@contextlib.contextmanager
def network(model: nn.Module) -> Iterator[nn.Module]:
    """`with ucudnn.torch.network(model): model(x)`: the converted layers record their kernels
    (running through torch); on exit they are planned, WD solving the whole network once."""
    with contextlib.ExitStack() as stack:
        for context in _contexts(model):
            stack.enter_context(context.recording())
        yield model

