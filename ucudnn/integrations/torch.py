"""PyTorch integration: torch.nn.Conv2d layers whose convolutions run micro-batched through ucudnn.

    import ucudnn.torch
    model = ucudnn.torch.convert(model, workspace_limit="64MiB")           # WR, every nn.Conv2d
    model = ucudnn.torch.convert(model, optimizer="wd", sample_input=x)     # WD, solved once

`Conv2d` is an nn.Conv2d (same constructor, parameters and state_dict) whose forward and backward
(an autograd Function) run F, BD and BF through a ucudnn.Handle on torch's current CUDA stream,
directly on the tensors' memory; workspaces come from torch's caching allocator. What ucudnn
cannot run (CPU tensors, float64, asymmetric 'same' padding, deterministic mode, ...) falls back
to torch's own convolution with a one-time warning naming the reason. See docs/torch.md.
"""
from __future__ import annotations

import contextlib
import functools
import threading
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterator, NamedTuple

try:
    import torch
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("ucudnn.torch needs PyTorch: pip install 'ucudnn[torch]'") from exc
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from ..config import Settings, format_size
from ..errors import ConfigError, NoAlgorithmError, UcudnnWarning, UnsupportedProblemError
from ..problem import ConvKind, ConvProblem, default_math
from .torch_sites import Site, Sites, signature

__all__ = ["Conv2d", "Context", "CudaBackend", "convert", "default_context", "learn", "network"]

DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
INDEX_LIMIT = 2**31 - 1  # cuDNN's legacy API describes tensors with 32-bit ints
F_, BD, BF = ConvKind.FORWARD, ConvKind.BACKWARD_DATA, ConvKind.BACKWARD_FILTER
# Planning errors that mean "ucudnn cannot run this kernel": it then runs through torch instead.
UNPLANNABLE = (NoAlgorithmError, UnsupportedProblemError)

_warned: set[str] = set()


def _warn_once(reason: str) -> None:
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"ucudnn.torch falls back to torch's own convolution: {reason}", UcudnnWarning,
                      stacklevel=4)


def _compiler_disable(fn: Callable) -> Callable:
    """torch.compile graph-breaks at `fn` and runs it eagerly: dynamo cannot trace ctypes calls."""
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    if disable is None:  # torch < 2.1
        from torch._dynamo import disable
    return disable(fn)


# --- what one call of a layer is -----------------------------------------------------------------

@dataclass(frozen=True)
class Geometry:
    """The convolution's pads (after any F.pad of a non-zeros padding mode), strides, dilations, groups."""

    pads: tuple[int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]
    groups: int

    def output_size(self, size: tuple[int, ...], kernel: tuple[int, ...]) -> tuple[int, ...]:
        return tuple((n + 2 * p - d * (k - 1) - 1) // s + 1
                     for n, k, p, s, d in zip(size, kernel, self.pads, self.strides, self.dilations))


def geometry(module: nn.Conv2d) -> Geometry | str:
    """The layer's Geometry, or why ucudnn cannot run it (a fallback reason)."""
    pads = module.padding
    if module.padding_mode != "zeros" or pads == "valid":
        pads = (0, 0)  # other padding modes: the input is padded by F.pad first, as torch does
    elif pads == "same":
        totals = [d * (k - 1) for d, k in zip(module.dilation, module.kernel_size)]
        if any(t % 2 for t in totals):
            return "padding='same' with an even effective kernel size pads asymmetrically"
        pads = tuple(t // 2 for t in totals)
    return Geometry(tuple(pads), tuple(module.stride), tuple(module.dilation), module.groups)


def math_type(dtype: str) -> str:
    """cuDNN math type matching torch: half types on tensor cores; float32 uses TF32 tensor
    cores only where torch allows them."""
    if dtype == "float32" and not torch.backends.cudnn.allow_tf32:
        return "fma"
    return default_math(dtype)


@dataclass(frozen=True)
class Call:
    """One convolution as ucudnn sees it: hashable, so a Context memoizes its kernels by it."""

    device: torch.device
    x_shape: tuple[int, ...]  # after any F.pad
    w_shape: tuple[int, ...]
    geometry: Geometry
    dtype: str
    math: str
    layout: str  # "nchw" or "nhwc" (channels_last)

    @property
    def memory_format(self) -> torch.memory_format:
        return torch.channels_last if self.layout == "nhwc" else torch.contiguous_format

    @property
    def y_shape(self) -> tuple[int, ...]:
        return (self.x_shape[0], self.w_shape[0],
                *self.geometry.output_size(self.x_shape[2:], self.w_shape[2:]))

    def problem(self, kind: ConvKind) -> ConvProblem:
        g = self.geometry
        return ConvProblem(kind, self.x_shape, self.w_shape, g.pads, g.strides, g.dilations, g.groups,
                           dtype=self.dtype, math=self.math, layout=self.layout)


class Prepared(NamedTuple):
    """A layer call ready for ucudnn: packed, cast operands and the Site of their Call."""

    x: Tensor
    weight: Tensor
    bias: Tensor | None
    site: Site

    @property
    def call(self) -> Call:
        return self.site.call


def _autocast_dtype(device_type: str) -> torch.dtype | None:
    """The autocast dtype in force for `device_type`, or None when autocast is off."""
    try:
        return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
    except (AttributeError, TypeError):  # torch < 2.4 knows only CUDA's autocast state
        if device_type == "cuda" and torch.is_autocast_enabled():
            return torch.get_autocast_gpu_dtype()
        return None


def _compute_dtype(input: Tensor) -> tuple[torch.dtype, bool]:
    """What torch's conv2d computes in, and whether autocast casts to it: the autocast dtype for
    eligible inputs (whatever the weight's dtype), else the input's own."""
    cast = _autocast_dtype(input.device.type)
    if cast is not None and input.is_floating_point() and input.dtype != torch.float64:
        return cast, True
    return input.dtype, False


def _suggests_channels_last(t: Tensor) -> bool:
    """Whether torch's suggest_memory_format() says channels_last (c10's
    is_channels_last_strides_2d_s4), so that tensors packed both ways get torch's choice."""
    if t.dim() != 4 or t.stride(1) == 0:
        return False
    low = 0
    for d in (1, 3, 2, 0):
        if t.shape[d] == 0 or t.stride(d) < low or (d == 0 and low == t.stride(1)):
            return False
        low = t.stride(d) * max(t.shape[d], 1)
    return True


def _padded_size(module: nn.Conv2d, input: Tensor) -> tuple[int, int]:
    """Spatial size after the F.pad of a non-zeros padding mode (unchanged for zeros)."""
    h, w = input.shape[-2:]
    if module.padding_mode == "zeros":
        return h, w
    left, right, top, bottom = module._reversed_padding_repeated_twice
    return h + top + bottom, w + left + right


def _is_valid(module: nn.Conv2d, input: Tensor, autocast: bool, shape: Geometry | str) -> bool:
    """False for calls torch itself rejects: they go to torch, which raises its usual error."""
    weight = module.weight
    if not (input.dim() in (3, 4) and input.shape[-3] == module.in_channels and min(input.shape[-2:]) > 0
            and input.device == weight.device and (autocast or input.dtype == weight.dtype)):
        return False
    return isinstance(shape, str) or min(shape.output_size(_padded_size(module, input), weight.shape[2:])) > 0


def _fallback_reason(input: Tensor, dtype: torch.dtype, context: "Context") -> str | None:
    if not context.backend.runs_on(input.device):
        return f"input on {input.device.type} (ucudnn runs CUDA tensors only)"
    if dtype not in DTYPES:
        return f"dtype {dtype} (ucudnn runs float32, float16 and bfloat16)"
    if input.dim() == 4 and input.shape[0] == 0:
        return "an empty batch"
    if torch.are_deterministic_algorithms_enabled():
        return "torch.use_deterministic_algorithms(True) is set (ucudnn may pick non-deterministic algorithms)"
    return None


def prepare(module: nn.Conv2d, input: Tensor, context: "Context") -> Prepared | str | None:
    """The call ready for ucudnn; a reason string when ucudnn cannot run it; None when torch
    should handle it because the call is invalid (torch raises the error users expect). What
    follows from the tensors' metadata is decided once per signature (see torch_sites)."""
    dtype, autocast = _compute_dtype(input)
    weight = module.weight
    math = math_type(DTYPES[dtype]) if dtype in DTYPES else None
    site = context.sites.get(signature(module, input, weight, dtype, autocast, math),
                             lambda: _resolve(module, input, weight, dtype, autocast, math, context))
    if not isinstance(site, Site):
        return site
    fmt, bias = site.memory_format, module.bias
    # Packed in the chosen layout: a no-op for packed tensors, a copy otherwise (as in torch).
    return Prepared(_padded(module, input).to(dtype).contiguous(memory_format=fmt),
                    weight.to(dtype).contiguous(memory_format=fmt), None if bias is None else bias.to(dtype), site)


def _padded(module: nn.Conv2d, input: Tensor) -> Tensor:
    """The input batched, and padded by F.pad for a non-zeros padding mode."""
    x = input if input.dim() == 4 else input.unsqueeze(0)
    if module.padding_mode != "zeros":
        x = F.pad(x, module._reversed_padding_repeated_twice, mode=module.padding_mode)
    return x


def _resolve(module: nn.Conv2d, input: Tensor, weight: Tensor, dtype: torch.dtype, autocast: bool,
             math: str | None, context: "Context") -> Call | str | None:
    """prepare()'s decision for a new signature: the Call, a fallback reason, or None."""
    shape = geometry(module)
    if not _is_valid(module, input, autocast, shape):
        return None
    reason = _fallback_reason(input, dtype, context)
    if reason or isinstance(shape, str):
        return reason or shape
    x = _padded(module, input)
    out = shape.output_size(tuple(x.shape[2:]), tuple(weight.shape[2:]))
    if max(x.numel(), weight.numel(), x.shape[0] * module.out_channels * out[0] * out[1]) > INDEX_LIMIT:
        return "a tensor with 2**31 or more elements (cuDNN's legacy API indexes with 32-bit ints)"
    # torch's rule for cuDNN: channels_last when the input or the weight suggests it.
    layout = "nhwc" if _suggests_channels_last(x) or _suggests_channels_last(weight) else "nchw"
    return Call(x.device, tuple(x.shape), tuple(weight.shape), shape, DTYPES[dtype], math, layout)


# --- where kernels run ---------------------------------------------------------------------------

# The current stream's address without building a torch.cuda.Stream: ~10x cheaper per call.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _no_persistent_workspace(nbytes: int) -> int:
    """WR plans get no buffer of their own (address 0): each call borrows its workspace from
    torch's caching allocator instead, as torch's own convolutions do, so workspaces of
    different layers share memory rather than add up."""
    return 0


class CudaBackend:
    """Runs kernels on CUDA tensors through ucudnn.Handle, on torch's current stream."""

    def runs_on(self, device: torch.device) -> bool:
        return device.type == "cuda"

    def device_guard(self, device: torch.device):
        """cuDNN handles are bound to a device: make it current where it is not."""
        if device.index is not None and device.index != torch.cuda.current_device():
            return torch.cuda.device(device)
        return contextlib.nullcontext()

    def stream(self, device: torch.device) -> int | None:
        if _raw_stream is None:  # pragma: no cover - torch builds without CUDA
            return torch.cuda.current_stream(device).cuda_stream
        return _raw_stream(torch.cuda.current_device() if device.index is None else device.index)

    def make_handle(self, settings: Settings, cache, device: torch.device):
        from ..handle import Handle

        torch.backends.cudnn.version()  # loads torch's libcudnn, so ucudnn's bindings use the same one
        if settings.optimizer == "wd":  # one persistent buffer for the network, divided (and late kernels)
            allocator = functools.partial(self.borrow, device=device)
        else:
            allocator = _no_persistent_workspace
        return Handle(settings, cache=cache, allocator=allocator, stream=self.stream(device))

    def borrow(self, nbytes: int, device: torch.device) -> Tensor:
        """Workspace for one call from torch's caching allocator, on the current stream."""
        return torch.empty(nbytes, dtype=torch.uint8, device=device)

    def operand(self, tensor: Tensor) -> Any:
        return tensor.data_ptr()

    def synchronize(self, device: torch.device) -> None:
        torch.cuda.synchronize(device)


class UcudnnKernel:
    """A planned kernel, compiled for its handle's executor: one call runs every micro-batch."""

    via = "ucudnn"

    def __init__(self, problem: ConvProblem, handle, assignment, backend: CudaBackend):
        self.problem, self.handle, self.assignment, self.backend = problem, handle, assignment, backend
        self.program = handle.program(problem, assignment.configuration)
        self.counted = (self.via, problem.kind.value)  # its key in Context.runs

    def __call__(self, x: Tensor, w: Tensor, y: Tensor) -> None:
        backend, device = self.backend, x.device
        stream = backend.stream(device)
        if stream is not None and stream != self.handle.stream:
            self.handle.set_stream(stream)
        workspace, size, borrowed = self.assignment.workspace, self.assignment.workspace_size, None
        if size and not workspace:
            borrowed = backend.borrow(size, device)  # released after the call: stream-ordered reuse is safe
            workspace = backend.operand(borrowed)
        self.program(backend.operand(x), backend.operand(w), backend.operand(y), workspace, size)
        del borrowed


class TorchKernel:
    """A kernel ucudnn cannot plan, run by torch's own convolution into the same output tensor."""

    via = "torch"

    def __init__(self, problem: ConvProblem):
        self.problem = problem
        self.counted = (self.via, problem.kind.value)

    def __call__(self, x: Tensor, w: Tensor, y: Tensor) -> None:
        p = self.problem
        args = (list(p.strides), list(p.pads), list(p.dilations), False, [0, 0], p.groups)
        if p.kind is F_:
            y.copy_(torch.ops.aten.convolution(x, w, None, *args))
            return
        dx, dw, _ = torch.ops.aten.convolution_backward(y, x, w, None, *args, [p.kind is BD, p.kind is BF, False])
        (x if p.kind is BD else w).copy_(dx if p.kind is BD else dw)


# --- the shared state of converted layers --------------------------------------------------------

def _settings(workspace_limit=None, optimizer=None, policy=None, total_limit=None, cache_path=None,
              execution=None, verbose=None) -> Settings:
    try:
        return Settings.load(workspace_limit=workspace_limit, optimizer=optimizer, batch_size_policy=policy,
                             total_workspace_limit=total_limit, cache_path=cache_path, execution=execution,
                             verbose=verbose)
    except ConfigError as exc:  # name the keywords convert() takes, not the settings they set
        message = str(exc)
        for setting, keyword in (("batch_size_policy=", "policy="), ("total_workspace_limit=", "total_limit=")):
            message = message.replace(setting, keyword)
        raise ConfigError(message) from None


class Context:
    """What converted layers share: settings, one ucudnn.Handle per GPU, planned kernels and,
    for WD, the recording of the network's kernels before the one solve.

    Keyword arguments as `convert` takes them (None: UCUDNN_* variables, then defaults)."""

    def __init__(self, settings: Settings | None = None, *, backend=None, cache=None, workspace_limit=None,
                 optimizer=None, policy=None, total_limit=None, cache_path=None, execution=None):
        keywords = (workspace_limit, optimizer, policy, total_limit, cache_path, execution)
        if settings is not None and any(v is not None for v in keywords):
            raise ConfigError("pass either settings= or keyword settings (workspace_limit, ...) to Context, not both")
        self.settings = settings or _settings(*keywords)
        self.backend = backend or CudaBackend()
        self._cache = cache
        self._handles: dict[torch.device, Any] = {}
        self._kernels: dict[tuple[ConvKind, Call], UcudnnKernel | TorchKernel] = {}
        self.sites = Sites()  # what layer calls resolve to, by signature (see torch_sites)
        self._lock = threading.RLock()
        self._recording = False
        # WD without a sample input: the first pass runs through torch while recording (see records()).
        self._learn_first_pass = self.wd
        self._seen: set[int] = set()
        self.runs: Counter = Counter()  # (via, kind) -> kernel calls: ("ucudnn", "F"), ("torch", "BF"), ...
        self.fallbacks: Counter = Counter()  # reason -> layer calls that went to torch entirely

    @property
    def wd(self) -> bool:
        return self.settings.optimizer == "wd"

    # Converted models share their context when deep-copied, and rebuild it when unpickled.
    def __deepcopy__(self, memo) -> "Context":
        return self

    def __reduce__(self):
        return (_rebuild_context, (self.settings,))

    def run(self, site: Site, kind: ConvKind, x: Tensor, w: Tensor, y: Tensor) -> None:
        """Run kernel `kind` of the site's Call on x, w, y (F writes y, BD writes x, BF writes w)."""
        kernel = site.kernels.get(kind) or self._site_kernel(site, kind)
        self.runs[kernel.counted] += 1
        with self.backend.device_guard(site.call.device):
            kernel(x, w, y)

    def _site_kernel(self, site: Site, kind: ConvKind) -> UcudnnKernel | TorchKernel:
        kernel = site.kernels[kind] = self._kernels.get((kind, site.call)) or self._kernel(site.call, kind)
        return kernel

    def _kernel(self, call: Call, kind: ConvKind) -> UcudnnKernel | TorchKernel:
        with self._lock, self.backend.device_guard(call.device):
            if (kind, call) not in self._kernels:
                problem = call.problem(kind)
                handle = self.handle(call.device)
                try:
                    kernel = UcudnnKernel(problem, handle, handle.assignment(problem), self.backend)
                except UNPLANNABLE as exc:
                    _warn_once(f"{problem.describe()}: {exc}")
                    kernel = TorchKernel(problem)
                self._kernels[kind, call] = kernel
            return self._kernels[kind, call]

    def handle(self, device: torch.device):
        """The ucudnn.Handle of `device`, made on first use."""
        with self._lock:
            if device not in self._handles:
                if self._cache is None:
                    from ..cache import Cache

                    self._cache = Cache(self.settings.cache_path)
                with self.backend.device_guard(device):
                    self._handles[device] = self.backend.make_handle(self.settings, self._cache, device)
            return self._handles[device]

    # WD: learning the network first
    def records(self, module: nn.Module) -> bool:
        """Whether this call of `module` only records its kernels (and runs through torch). True
        inside `recording()`; for WD without a sample input, also through the first pass, which
        ends (and the network is solved) when a layer is called a second time."""
        if self._recording:
            return True
        if not self._learn_first_pass:
            return False
        if id(module) not in self._seen:
            self._seen.add(id(module))
            return True
        self._learn_first_pass = False
        self._seen.clear()
        self.finalize()
        return False

    def record(self, call: Call, kinds: tuple[ConvKind, ...]) -> None:
        """Learn kernels ahead of their first run: WD records them for the solve, WR plans
        (benchmarks) them now."""
        for kind in kinds:
            if self.wd:
                with self.backend.device_guard(call.device):
                    self.handle(call.device).query(call.problem(kind))
            else:
                self._kernel(call, kind)

    @contextlib.contextmanager
    def recording(self) -> Iterator["Context"]:
        """Layers only record their kernels inside; on a clean exit the kernels are planned (WD:
        the network, known kernels included, is solved once)."""
        if self.wd and any(h.wd_result is not None for h in self._handles.values()):
            self.reset()  # learning again: solve the known kernels and the new ones together
        self._learn_first_pass, self._recording = False, True
        try:
            yield self
        finally:
            self._recording = False
        self.finalize()

    def finalize(self) -> None:
        """WD: solve every recorded kernel as one network now."""
        with self._lock:
            for device, handle in self._handles.items():
                with self.backend.device_guard(device):
                    handle.finalize()

    def reset(self) -> None:
        """Forget every assignment: kernels are planned again on next use (WD: as one network).
        Waits for the GPUs first, since running kernels may still use the old workspaces."""
        with self._lock:
            for device, handle in self._handles.items():
                self.backend.synchronize(device)
                handle.reset()
            self._kernels.clear()
            self.sites.clear()

    def summary(self) -> dict:
        """Settings, every planned kernel's configuration and workspace, calls, fallbacks and
        (WD) the solve: what benchmarks report."""
        s = self.settings
        out = dict(optimizer=s.optimizer, policy=s.batch_size_policy, workspace_limit=s.workspace_limit,
                   kernels=[_describe(kind, kernel) for (kind, _), kernel in self._kernels.items()],
                   runs={f"{via}:{kind}": n for (via, kind), n in self.runs.items()},
                   fallbacks=dict(self.fallbacks))
        if self.wd:
            out["wd"] = [dict(total_limit=h.settings.total_limit(len(h)), total_workspace=r.total_workspace,
                              variables=r.variables, solve_seconds=r.solve_seconds, solver=r.solver)
                         for h in self._handles.values() if (r := h.wd_result) is not None]
        return out

    def __repr__(self) -> str:
        s = self.settings
        limit = format_size(s.workspace_limit)
        return f"ucudnn.torch.Context(optimizer={s.optimizer!r}, workspace_limit={limit}, policy={s.batch_size_policy!r})"


def _describe(kind: ConvKind, kernel: UcudnnKernel | TorchKernel) -> dict:
    from ..bindings.enums import algo_name

    out = dict(kind=kind.value, kernel=kernel.problem.describe(), via=kernel.via)
    if isinstance(kernel, UcudnnKernel):
        configuration = kernel.assignment.configuration
        out.update(configuration=configuration.describe(lambda a: algo_name(kind, a)),
                   parts=len(configuration.micro), workspace=kernel.assignment.workspace_size,
                   predicted_ms=configuration.time_ms)
    return out


def _rebuild_context(settings: Settings) -> Context:
    return Context(settings)


_default: Context | None = None


def default_context() -> Context:
    """The context of Conv2d layers made directly rather than by convert(): settings from UCUDNN_*."""
    global _default
    if _default is None:
        _default = Context()
    return _default


# --- the layer and its autograd Function -----------------------------------------------------------

class _Convolution(torch.autograd.Function):
    """y = conv(x, w) + b with F, BD and BF through ucudnn. Inputs are already packed and cast."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, context: Context, site: Site) -> Tensor:
        y = torch.empty(site.y_shape, dtype=x.dtype, device=x.device, memory_format=site.memory_format)
        context.run(site, F_, x, weight, y)
        if bias is not None:
            y.add_(bias.view(1, -1, 1, 1))
        ctx.save_for_backward(x, weight)
        ctx.context, ctx.site, ctx.has_bias = context, site, bias is not None
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy: Tensor):
        x, weight = ctx.saved_tensors
        context, site = ctx.context, ctx.site
        fmt = site.memory_format
        dy = dy.contiguous(memory_format=fmt)
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = torch.empty(x.shape, dtype=x.dtype, device=x.device, memory_format=fmt)
            context.run(site, BD, dx, weight, dy)
        if ctx.needs_input_grad[1]:
            dw = torch.empty(weight.shape, dtype=weight.dtype, device=weight.device, memory_format=fmt)
            context.run(site, BF, x, dw, dy)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy.sum((0, 2, 3))
        return dx, dw, db, None, None


class Conv2d(nn.Conv2d):
    """torch.nn.Conv2d whose convolutions run micro-batched through ucudnn: same constructor,
    parameters and state_dict. Its `ucudnn_context` (set by convert(); else default_context())
    holds the settings and plans."""

    ucudnn_context: Context | None = None

    @_compiler_disable
    def forward(self, input: Tensor) -> Tensor:
        context = self.ucudnn_context or default_context()
        prepared = prepare(self, input, context)
        if isinstance(prepared, str):
            context.fallbacks[prepared] += 1
            _warn_once(prepared)
        if not isinstance(prepared, Prepared):
            return super().forward(input)
        if context.records(self):
            context.record(prepared.call, _kinds_needed(prepared))
            return super().forward(input)
        y = _Convolution.apply(prepared.x, prepared.weight, prepared.bias, context, prepared.site)
        return y if input.dim() == 4 else y.squeeze(0)

    def extra_repr(self) -> str:
        context = self.ucudnn_context or default_context()
        s = context.settings
        return f"{super().extra_repr()}, ucudnn={s.optimizer}@{format_size(s.workspace_limit)}"


def _kinds_needed(prepared: Prepared) -> tuple[ConvKind, ...]:
    """The kernels a training step will run: BD only where the input needs a gradient."""
    grad = torch.is_grad_enabled()
    return ((F_,) + ((BD,) if grad and prepared.x.requires_grad else ())
            + ((BF,) if grad and prepared.weight.requires_grad else ()))


# --- converting models -----------------------------------------------------------------------------

def convert(model: nn.Module, workspace_limit: int | str | None = None, optimizer: str | None = None,
            policy: str | None = None, total_limit: int | str | None = None, *, sample_input: Any = None,
            cache_path: str | None = None, execution: str | None = None,
            context: Context | None = None) -> nn.Module:
    """Turn every torch.nn.Conv2d of `model` (nested ones too, and `model` itself) into a
    ucudnn.torch.Conv2d in place, and return `model`.

    Layers keep their identity, parameters, hooks and state_dict (only their class changes), so
    an optimizer made before still works. Settings: `workspace_limit` per kernel (WR) such as
    "64MiB", `optimizer` "wr" or "wd", `policy` "powerOfTwo" | "all" | "undivided",
    `total_limit` for WD (default: workspace_limit x kernels), `cache_path` for the benchmark
    database, `execution` "graph" (calls replayed as CUDA graphs once a layer's buffers repeat)
    or "direct"; None takes UCUDNN_* variables, then defaults. `sample_input` (a tensor, or a tuple
    of positional arguments) runs one pass with torch's convolutions in which every layer records
    its kernels; then they are planned (WD: solved once). Run it under the autocast and grad mode
    of training. Subclasses of nn.Conv2d are left alone (they may change forward)."""
    settings = (workspace_limit, optimizer, policy, total_limit, cache_path, execution)
    if context is not None and any(v is not None for v in settings):
        raise ConfigError("pass either context= or settings (workspace_limit, optimizer, ...) to convert(), not both")
    context = context or Context(_settings(*settings))
    skipped = set()
    for module in model.modules():
        if type(module) is nn.Conv2d:
            module.__class__ = Conv2d
        elif isinstance(module, nn.Conv2d) and not isinstance(module, Conv2d):
            skipped.add(type(module).__qualname__)
            continue
        if isinstance(module, Conv2d):
            module.ucudnn_context = context
    if skipped:
        warnings.warn(f"ucudnn.torch.convert left subclasses of nn.Conv2d unconverted: {', '.join(sorted(skipped))}",
                      UcudnnWarning, stacklevel=2)
    if sample_input is not None:
        learn(model, *(sample_input if isinstance(sample_input, tuple) else (sample_input,)))
    return model


def _contexts(model: nn.Module) -> list[Context]:
    found = {}
    for module in model.modules():
        if isinstance(module, Conv2d):
            context = module.ucudnn_context or default_context()
            found[id(context)] = context
    return list(found.values())


@contextlib.contextmanager
def network(model: nn.Module) -> Iterator[nn.Module]:
    """`with ucudnn.torch.network(model): model(x)`: the converted layers record their kernels
    (running through torch); on exit they are planned, WD solving the whole network once."""
    with contextlib.ExitStack() as stack:
        for context in _contexts(model):
            stack.enter_context(context.recording())
        yield model


def learn(model: nn.Module, *args, **kwargs) -> Any:
    """One recorded pass `model(*args, **kwargs)` (see network()); returns its output."""
    with network(model):
        return model(*args, **kwargs)
