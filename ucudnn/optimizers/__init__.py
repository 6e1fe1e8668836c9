"""The optimizers, by the name the `optimizer` setting gives: `wr` plans each kernel alone within
a limit per kernel (wr.py); `wd` divides one total among a network's kernels (pareto.py, wd.py).
Code outside this package asks an Optimizer what it does, never compares its name. search.py:
which candidates a benchmark times.

May import: core (docs/architecture.md; tests/test_imports.py checks)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Optimizer:
    name: str
    divides: bool  # one total limit divided among a network's kernels, else a limit per kernel
    label: str  # its name in reports


PER_KERNEL = Optimizer("wr", divides=False, label="WR")
DIVIDING = Optimizer("wd", divides=True, label="WD")
OPTIMIZERS = {o.name: o for o in (PER_KERNEL, DIVIDING)}
