"""Where an engine call writes, and the sums that follow it.

The graph API's convolutions compute out = conv(...) (alpha 1, beta 0). A call that must blend
(the caller's alpha or beta) or accumulate (backward-filter micro-batches: dw is the sum over
all of them) writes a partial result into a buffer instead, and `Combine` steps fold it in:
dst = alpha * src + beta * dst, computed in float32. Half-precision dw partials are summed in a
float32 accumulator and rounded once, as torch does: summing them in the half output costs 8x
its error (../shared/design/engines.md, section 1). Buffers of accumulating calls count as
workspace (`buffer_bytes`); the layout is [partial | accumulator | plan workspace], the same for
every part whatever its plan needs (the accumulator lives across the parts).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..problem import ConvKind, ConvProblem
from ..workspace import align_up as align

ACCUMULATOR_ITEMSIZE = 4  # float32
WIDE_TYPES = ("float32", "float64")  # outputs that are their own accumulator


@dataclass(frozen=True)
class Combine:
    """dst = alpha * src + beta * dst, elementwise over the call's output (beta 0: dst not read)."""

    src: str  # "partial" or "accumulator"
    dst: str  # "accumulator" or "output"
    alpha: float
    beta: float


def accumulates(problem: ConvProblem, batch: int) -> bool:
    """Whether micro-batch kernel `problem`, part of a kernel of `batch` samples, adds into a sum
    of parts: backward-filter micro-batches do."""
    return problem.kind is ConvKind.BACKWARD_FILTER and problem.batch < batch


def buffer_bytes(problem: ConvProblem, accumulating: bool) -> int:
    """The buffers a call of `problem` needs beyond the plan's workspace: only an accumulating
    one needs any."""
    if not accumulating:
        return 0
    elements = _elements(problem)
    partial = align(elements * problem.itemsize)
    return partial + (0 if problem.dtype in WIDE_TYPES else align(elements * ACCUMULATOR_ITEMSIZE))


def _elements(problem: ConvProblem) -> int:
    """Elements of w (dw): what a backward-filter partial holds."""
    return int(np.prod(problem.w_shape))


def offsets(problem: ConvProblem, accumulating: bool) -> dict[str, int]:
    """Byte offsets in the workspace of the partial, the accumulator and the plan's workspace."""
    accumulator = align(_elements(problem) * problem.itemsize)
    return {"partial": 0, "accumulator": accumulator, "plan": buffer_bytes(problem, accumulating)}


def route(step) -> tuple[str, list[Combine]]:
    """Where the plan of `step` (a ucudnn.dispatch.Step) writes, 'output' or 'partial', and the
    Combine steps that follow."""
    p = step.problem
    if step.accumulates:
        if p.dtype in WIDE_TYPES:
            return "partial", [Combine("partial", "output", step.alpha, step.call_beta)]
        ops = [Combine("partial", "accumulator", 1.0, 0.0 if step.part == 0 else 1.0)]
        if step.part == step.parts - 1:
            ops.append(Combine("accumulator", "output", step.alpha, step.beta))
        return "partial", ops
    if step.alpha == 1.0 and step.beta == 0.0:
        return "output", []
    return "partial", [Combine("partial", "output", step.alpha, step.beta)]
