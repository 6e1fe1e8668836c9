"""ucudnn's convolution as torch.library custom ops, so that a traced graph (torch.compile,
torch.export) holds a converted layer's convolution as one node:

- `ucudnn::convolution(x, weight, bias, site)`: the layer's output from its forward kernel and
  the bias (convolution.forward), on operands call.pack() made;
- `ucudnn::convolution_backward(d_out, x, weight, site, input_grad, weight_grad)`: the input's and
  the weight's gradients (convolution.backward; a gradient not asked for comes back empty),
  which the forward's autograd formula runs.

Their fake kernels make what the eager call makes (convolution.output, .gradient: the site's
shapes and memory format, the operands' dtype and device). Their real kernels run the site's
kernels through its Context, as an eager call does: on a GPU ucudnn's plans, on the CPU test
doubles (tests/torch_doubles.py) NumPy's.

A custom op takes tensors and plain scalars, so a site is named by its handle: its index in this
process's registry of traced sites (handle()), which keeps the site and its Context alive. A
graph holding a handle runs in the process that traced it.
"""
import threading

import torch
from torch import Tensor

from ...core.errors import ConfigError
from .call import aligned
from .convolution import backward, bias_gradient, forward, gradient, output
from .sites import Site

_traced: list[tuple[object, Site]] = []  # handle -> (its Context, the site)
_handles: dict[int, int] = {}  # id(site) -> handle: the registry keeps its sites, so ids stay theirs
_lock = threading.Lock()


def handle(context, site: Site) -> int:
    """The handle that names `site` (of `context`) in traced graphs, given on first use."""
    with _lock:
        if id(site) not in _handles:
            _handles[id(site)] = len(_traced)
            _traced.append((context, site))
        return _handles[id(site)]


def traced(handle: int) -> tuple[object, Site]:
    """The Context and Site a handle names."""
    if not 0 <= handle < len(_traced):
        raise ConfigError(f"ucudnn site {handle} was not traced in this process: a graph holding ucudnn's "
                          "convolution runs in the process that traced it (compile or export it there)")
    return _traced[handle]


@torch.library.custom_op("ucudnn::convolution", mutates_args=())
def _convolution(x: Tensor, weight: Tensor, bias: Tensor | None, site: int) -> Tensor:
    context, traced_site = traced(site)
    return forward(context, traced_site, aligned(x, traced_site.memory_format), weight, bias)


@_convolution.register_fake
def _convolution_fake(x: Tensor, weight: Tensor, bias: Tensor | None, site: int) -> Tensor:
    return output(traced(site)[1], x)


@torch.library.custom_op("ucudnn::convolution_backward", mutates_args=())
def _convolution_backward(d_out: Tensor, x: Tensor, weight: Tensor, site: int, input_grad: bool,
                         weight_grad: bool) -> tuple[Tensor, Tensor]:
    context, traced_site = traced(site)
    d_input, dw = backward(context, traced_site, aligned(x, traced_site.memory_format), weight, d_out, input_grad,
                           weight_grad)
    return _or_empty(d_input, x), _or_empty(dw, weight)


@_convolution_backward.register_fake
def _convolution_backward_fake(d_out: Tensor, x: Tensor, weight: Tensor, site: int, input_grad: bool,
                               weight_grad: bool) -> tuple[Tensor, Tensor]:
    traced_site = traced(site)[1]
    return (_or_empty(gradient(traced_site, x) if input_grad else None, x),
            _or_empty(gradient(traced_site, weight) if weight_grad else None, weight))


def _or_empty(gradient: Tensor | None, like: Tensor) -> Tensor:
    """A custom op returns tensors: a gradient not asked for comes back as an empty one."""
    return like.new_empty(0) if gradient is None else gradient


def _keep(ctx, inputs: tuple, output: Tensor) -> None:
    x, weight, bias, site = inputs
    ctx.save_for_backward(x, weight)
    ctx.site, ctx.has_bias = site, bias is not None


def _gradients(ctx, d_out: Tensor) -> tuple:
    x, weight = ctx.saved_tensors
    input_grad, weight_grad = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    d_input, dw = torch.ops.ucudnn.convolution_backward(d_out, x, weight, ctx.site, input_grad, weight_grad)
    return (d_input if input_grad else None, dw if weight_grad else None,
            bias_gradient(ctx, d_out), None)


_convolution.register_autograd(_gradients, setup_context=_keep)
