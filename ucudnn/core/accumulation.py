"""Where each call of a configuration writes, and the sums and blends that follow it.

One design for every backend, owned by dispatch (a part may run on any backend):

- Backward-filter micro-batches are parts of one sum, dw = alpha * (sum of the parts) + beta * dw.
  Half types (float16, bfloat16) sum in a float32 accumulator and round once into dw, as torch
  does: summing in the half output costs accuracy (docs/results.md, "The engine backend: against
  what PyTorch users run"; ../shared/design/engines.md, section 1).
  Every part's plan writes its partial (alpha 1, beta 0), a Combine adds the partial into the
  accumulator (the first part's sets it), and the last part writes alpha * accumulator + beta * dw.
  float32 and float64 dw are their own sum: a backend whose calls blend (legacy cuDNN takes alpha
  and beta) adds into dw itself, beta 1 after the first part; one whose calls cannot (the graph
  API writes out = conv) writes a partial that a Combine adds into dw.
- Every other call writes its output in place where its backend blends or nothing is blended
  (alpha 1, beta 0); else its plan writes a scratch buffer that a Combine blends into the output.
  Scratch is the program's own, not workspace: plans are made before a caller's alpha and beta
  are known, and frameworks call with alpha 1 and beta 0.

A part's workspace is laid out [accumulator | partial | the plan's own workspace], each at a
256-byte boundary. The accumulator holds the same bytes for every part of a kernel and no plan's
workspace overlaps it, whatever backend runs each part. The buffers count as the part's workspace
(`Route.buffer_bytes`): measurements of accumulating parts include them, so the optimizers see
the true footprint.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .problem import HALF_TYPES, ConvKind, ConvProblem
from .workspace import align_up

ACCUMULATOR_TYPE = "float32"


@dataclass(frozen=True)
class Combine:
    """dst = alpha * src + beta * dst over the call's output elements, computed in float32
    (float64 for float64 data); beta 0 never reads dst."""

    src: str  # "partial", "scratch" or "accumulator"
    dst: str  # "accumulator" or "output"
    alpha: float
    beta: float


@dataclass(frozen=True)
class Route:
    """Where a call's plan writes ('output', 'partial' or 'scratch') with which alpha and beta,
    the Combine steps after it, and the bytes of the buffers at the start of its workspace."""

    target: str
    alpha: float
    beta: float
    combines: tuple[Combine, ...] = ()
    accumulator: int = 0  # bytes at offset 0
    partial: int = 0  # bytes after the accumulator

    @property
    def partial_offset(self) -> int:
        return self.accumulator

    @property
    def buffer_bytes(self) -> int:
        """Bytes before the plan's own workspace: where it starts."""
        return self.accumulator + self.partial


def accumulates(kernel: ConvProblem, micro_batch: int) -> bool:
    """Whether a micro-batch of `micro_batch` samples of `kernel` is a part of a sum: backward
    filter micro-batches smaller than the kernel's batch are."""
    return kernel.kind is ConvKind.BACKWARD_FILTER and micro_batch < kernel.batch


def route(micro: ConvProblem, part: int, parts: int, alpha: float, beta: float, blends: bool) -> Route:
    """The route of part `part` of `parts` calls of a kernel, micro-batch kernel `micro`, on a
    backend whose calls blend (take alpha and beta) or not; see the module's docstring."""
    if micro.kind is ConvKind.BACKWARD_FILTER and parts > 1:
        partial = _output_bytes(micro, micro.itemsize)
        if micro.dtype in HALF_TYPES:
            combines = [Combine("partial", "accumulator", 1.0, 0.0 if part == 0 else 1.0)]
            if part == parts - 1:
                combines.append(Combine("accumulator", "output", alpha, beta))
            return Route("partial", 1.0, 0.0, tuple(combines), _output_bytes(micro, 4), partial)
        added = beta if part == 0 else 1.0
        if blends:
            return Route("output", alpha, added)
        return Route("partial", 1.0, 0.0, (Combine("partial", "output", alpha, added),), partial=partial)
    if blends or (alpha == 1.0 and beta == 0.0):
        return Route("output", alpha, beta)
    return Route("scratch", 1.0, 0.0, (Combine("scratch", "output", alpha, beta),))


def output_elements(problem: ConvProblem) -> int:
    """Elements of the tensor a call writes: y (F), x (BD: dx) or w (BF: dw)."""
    shape = {ConvKind.FORWARD: problem.y_shape, ConvKind.BACKWARD_DATA: problem.x_shape,
             ConvKind.BACKWARD_FILTER: problem.w_shape}[problem.kind]
    return int(np.prod(shape))


def buffer_type(name: str, problem: ConvProblem) -> str:
    """The data type of buffer `name` of a call of `problem`: the accumulator's, or the data's."""
    return ACCUMULATOR_TYPE if name == "accumulator" else problem.dtype


def _output_bytes(problem: ConvProblem, itemsize: int) -> int:
    return align_up(output_elements(problem) * itemsize)
