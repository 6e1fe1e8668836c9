"""Which candidates are accurate enough to compute a kernel, whatever their measured speed.

A candidate may reach at most 4x torch's own error against float64 (the bar of the GPU tests).
Those measured beyond it are named here: backward-filter kernels that sum fp16 or bf16 values in
the output's type at every partial sum. cuDNN's numerical note REDUCED_PRECISION_REDUCTION is too
coarse to act on: on an H100 with cuDNN 9.19 it marks the engine below but also engine 25
(backward data) and engine 63 (forward), both within the bar, and the legacy API reports no notes
(docs/results.md, "Half-precision sums"). Databases filled before a rule keep their rows; they
are never read as choices (ucudnn.core.measurements.ShapeTable.for_kernel), and the legacy
backend never offers them."""
from __future__ import annotations

from .problem import HALF_TYPES, ConvKind, ConvProblem

# Backward filter in fp16 and bf16: legacy ALGO_0 and engine 20 (the same kernel) beyond the bar
# on three ResNet layers; every other candidate within it (docs/results.md, "Half-precision sums").
REDUCED_PRECISION_SUMS = {ConvKind.BACKWARD_FILTER: ("legacy:ALGO_0", "engines:eng20")}


def accurate(problem: ConvProblem, candidate: str) -> bool:
    """Whether `candidate` ('backend:name') may compute `problem`: not one named in
    REDUCED_PRECISION_SUMS (an engine with any knobs) where the data is fp16 or bf16."""
    if problem.dtype not in HALF_TYPES:
        return True
    return not any(candidate == held or candidate.startswith(f"{held}_k")
                   for held in REDUCED_PRECISION_SUMS.get(problem.kind, ()))
