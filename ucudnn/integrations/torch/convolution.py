"""A converted layer's convolution through its Context, on operands pack() made: the forward
(the layer's output from its forward kernel, and the bias) and the backward (the input's and the
weight's gradients from their kernels). What the layer's autograd Function (eager calls) and
ucudnn's custom ops (traced graphs, ops.py) both run.

A convolution's forward is F, its input's gradient BD; a transposed layer runs the convolution it
transposes backwards: its forward is BD, its input's gradient F (call.layer_kinds). Either way BF
gives the weight's gradient, and the convolution's x is one side of the layer (the input, or a
transposed layer's output) and its y the other (_sides). Micro-batched kernels slice x and dy,
which must start on the slice alignment (call.aligned; the callers align the input they keep)."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor

from ...core.errors import DeviceMemoryError
from ...core.problem import ConvKind
from .call import layer_kinds, sliceable
from .sites import Site


def output(site: Site, input: Tensor) -> Tensor:
    """A new tensor for the layer's output: the site's shape and memory format, the input's dtype
    and device (on a fake tensor, what a traced graph records)."""
    return torch.empty(site.out_shape, dtype=input.dtype, device=input.device, memory_format=site.memory_format)


def gradient(site: Site, like: Tensor) -> Tensor:
    """A new tensor for the gradient of `like` (the input or the weight), in the site's memory format."""
    return torch.empty(like.shape, dtype=like.dtype, device=like.device, memory_format=site.memory_format)


def forward(context, site: Site, input: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """The layer's output on an aligned `input`: its forward kernel (which makes the output:
    Planner.run), plus the bias."""
    with as_torch_out_of_memory():
        out = context.planner.run(site, layer_kinds(site.call.transposed)[0], *_sides(site, input, weight, None))
    if bias is not None:
        out.add_(bias.view(1, -1, *[1] * (out.dim() - 2)))
    return out


def backward(context, site: Site, input: Tensor, weight: Tensor, d_out: Tensor, input_grad: bool,
             weight_grad: bool) -> tuple[Tensor | None, Tensor | None]:
    """The gradient of an aligned `input` (where `input_grad`, made by its kernel) and the
    weight's (where `weight_grad`) from the output's, d_out; BF on a side stream where the
    settings say so (Context.beside), into a gradient made here and marked used there."""
    d_out = sliceable(d_out, site.memory_format)
    d_input = dw = None
    with as_torch_out_of_memory(), context.beside(input.device) as aside:
        if weight_grad:
            dw = gradient(site, weight)
            with aside(input, dw, d_out):
                context.planner.run(site, ConvKind.BACKWARD_FILTER, *_sides(site, input, dw, d_out))
        if input_grad:
            d_input = context.planner.run(site, layer_kinds(site.call.transposed)[1], *_sides(site, None, weight, d_out))
    return d_input, dw


@contextlib.contextmanager
def as_torch_out_of_memory() -> Iterator[None]:
    """Inside, ucudnn's DeviceMemoryError (the zero-workspace kernel itself could not run: the
    Planner tried every smaller one) reaches the user as torch's OutOfMemoryError, which
    training loops and batch-size finders catch."""
    try:
        yield
    except DeviceMemoryError as exc:
        raise torch.cuda.OutOfMemoryError(str(exc)) from exc


def bias_gradient(ctx, d_out: Tensor) -> Tensor | None:
    """dy summed over the batch and spatial dimensions, where the layer has a bias that needs it
    (`ctx`: an autograd context with has_bias, and the bias as its third input)."""
    if ctx.has_bias and ctx.needs_input_grad[2]:
        return d_out.sum((0, *range(2, d_out.dim())))
    return None


def _sides(site: Site, input_side: Tensor | None, weight: Tensor,
           output_side: Tensor | None) -> tuple[Tensor | None, Tensor, Tensor | None]:
    """(x, w, y) of the site's convolution from tensors of the layer's input and output sides
    (None: the side the kernel makes): x is the input side, or for a transposed layer the output side."""
    if site.call.transposed:
        return output_side, weight, input_side
    return input_side, weight, output_side
