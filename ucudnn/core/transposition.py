"""A data gradient (BD) computed as a forward convolution (F).

For a convolution of stride 1, dx is the convolution of dy with the weights' output and input
channels swapped (per group) and the kernel flipped, padded by dilation x (kernel - 1) - padding
in each dimension: an F whose input is dy and whose output is dx, in the layer's own mode. The
transposed weights (K and C swapped, kernel flipped) are one copy, small beside the activations.
Flipping them rather than cuDNN's mode keeps the F one that the layer's own forward convolution
often is already (C = K, padding that keeps the size): measured once, and as fast (cuDNN's two
modes ran the same engines at the same times). Where a layer's fast data-gradient engines need
more workspace than the limit at every micro-batch size but a forward one fits, the data
gradient is planned as that F, where that is faster (on an H100, the training steps of a 3-D
UNet layer and of a Conv3d layer under a small limit: docs/results.md, "both limits in one run,
and a shrink that steps below the allocator's rounding").
"""
from __future__ import annotations

from dataclasses import replace

from .problem import ConvKind, ConvProblem

# BD planned as F is kept where its predicted time is below this share of BD's own plan: the
# weights' copy, which the prediction leaves out, must not eat the gain
FASTER = 0.9


def as_forward(problem: ConvProblem) -> ConvProblem | None:
    """The F whose output is the dx of `problem` (a BD) and whose input is its dy; None where there
    is none: another kind, a stride above 1, or a padding above dilation x (kernel - 1)."""
    if problem.kind is not ConvKind.BACKWARD_DATA or any(s != 1 for s in problem.strides):
        return None
    kernel = problem.w_shape[2:]
    pads = tuple(d * (k - 1) - p for d, k, p in zip(problem.dilations, kernel, problem.pads))
    if min(pads) < 0:
        return None
    return replace(problem, kind=ConvKind.FORWARD, x_shape=problem.y_shape,
                   w_shape=transposed_shape(problem.w_shape, problem.groups), pads=pads)


def transposed_shape(w_shape: tuple[int, ...], groups: int) -> tuple[int, ...]:
    """The transposed weights' shape, K and C swapped per group: (K, C/g, *kernel) -> (C, K/g, *kernel)."""
    k, per_group, *kernel = w_shape
    return (per_group * groups, k // groups, *kernel)


def faster(forward_ms: float, backward_ms: float) -> bool:
    """Whether BD planned as F (`forward_ms`) is to run rather than BD's own plan."""
    return forward_ms < FASTER * backward_ms
