"""Which candidates are accurate enough to compute a kernel, whatever their measured speed.

A candidate whose sums of half-precision values round in the output's type at every partial sum
(cuDNN's numerical note REDUCED_PRECISION_REDUCTION) is held back for fp16 and bf16 data. The
engines backend deselects every engine cuDNN so notes (ucudnn.backends.engines.excluded_notes);
the legacy API reports no notes, and databases filled before the rule hold rows of such
candidates, so the ones measured to do so are named here, and their rows are never read as
choices (ucudnn.measurements.ShapeTable.for_kernel)."""
from __future__ import annotations

from .problem import HALF_TYPES, ConvKind, ConvProblem

# Backward filter in fp16 and bf16 on an H100 with cuDNN 9.19: legacy ALGO_0 and engine 20 (the
# same kernel) 5.6x torch's own error against float64 on three ResNet layers; every other
# candidate within 3.7x (docs/results.md, "Half-precision sums").
REDUCED_PRECISION_SUMS = {ConvKind.BACKWARD_FILTER: ("legacy:ALGO_0", "engines:eng20")}


def accurate(problem: ConvProblem, candidate: str) -> bool:
    """Whether `candidate` ('backend:name') may compute `problem`: not one named in
    REDUCED_PRECISION_SUMS (an engine with any knobs) where the data is fp16 or bf16."""
    if problem.dtype not in HALF_TYPES:
        return True
    return not any(candidate == held or candidate.startswith(f"{held}_k")
                   for held in REDUCED_PRECISION_SUMS.get(problem.kind, ()))
